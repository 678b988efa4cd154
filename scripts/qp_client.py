"""Ask the query planner for a plan: python scripts/qp_client.py "question" [--history JSON]."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rufus.qp.client import main

if __name__ == "__main__":
    raise SystemExit(main())
