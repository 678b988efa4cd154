"""Answer quality of the shopping assistant, each answer checked against its own cards.

What is counted: looping answers, invented products, facts that contradict the cards,
answers citing no shown product, questions left without cards the catalog has.

    python scripts/eval_answers.py                              # against 127.0.0.1:8001
    python scripts/eval_answers.py --limit 20 --out build/a.json
    python scripts/eval_answers.py --offline-file build/eval_answers.json   # re-score, no server
    python scripts/eval_answers.py --write-questions            # rebuild the question set
    python scripts/eval_answers.py --questions data/assistant/answers_heldout.jsonl  # attribute,
        # comparison and follow-up questions (rufus.assistant.card_eval), per kind

Each question of data/assistant/answers_eval.jsonl goes through ``rufus_assistant`` over
gRPC, one at a time; the plan, cards, whole answer and timings are kept per question and
scored with rufus.assistant.answer_checks (the checks and the rates live there and in
rufus.assistant.answer_eval, unit-tested; this script only does the I/O).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.eval_answers import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
