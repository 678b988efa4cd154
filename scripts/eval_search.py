"""Does search find what was asked? Product-type relevance and stated constraints, on
held-out questions (data/retrieval/heldout_search.jsonl).

    python scripts/eval_search.py                      # the search alone, in-process
    python scripts/eval_search.py --url 127.0.0.1:8001 # through rufus_assistant (planner + search)

Checks and rates: rufus/retrieval/search_eval.py (unit-tested); report: build/eval_search.json.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.eval_search import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
