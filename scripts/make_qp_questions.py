"""Write the query planner's training and calibration sets (seeded; about a second).

The generator and its labelling conventions are in lab/qp/questions.py; the
hand-written held-out set data/qp/eval.jsonl is never generated (a unit test checks the
sets are disjoint and that the committed files equal this script's output).

    .venv/bin/python scripts/make_qp_questions.py [--check]
"""

from lab.qp.questions import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
