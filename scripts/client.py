"""Stream an answer from the served model: python scripts/client.py "question" [--chat]."""

from rufus.client import main

if __name__ == "__main__":
    raise SystemExit(main())
