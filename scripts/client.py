"""Stream an answer from the served model: python scripts/client.py "question" [--chat]."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rufus.client import main

if __name__ == "__main__":
    raise SystemExit(main())
