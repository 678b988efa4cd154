"""Ask the query planner for a plan: python scripts/qp_client.py "question" [--history JSON]."""

from rufus.qp.client import main

if __name__ == "__main__":
    raise SystemExit(main())
