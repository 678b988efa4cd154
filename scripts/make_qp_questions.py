"""Write the query planner's training and calibration sets (seeded; about a second).

The generator and its labelling conventions are in rufus/qp/tooling/questions.py; the
hand-written held-out set data/qp/eval.jsonl is never generated (a unit test checks the
sets are disjoint and that the committed files equal this script's output).

    .venv/bin/python scripts/make_qp_questions.py [--check]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rufus.qp.tooling.questions import CALIB_SIZE, DATA, TRAIN_SIZE, render_sets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=TRAIN_SIZE)
    ap.add_argument("--calib", type=int, default=CALIB_SIZE)
    ap.add_argument("--out", default=str(DATA))
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the committed files differ from the generator's output")
    a = ap.parse_args()
    out = Path(a.out)
    for name, text in render_sets(a.train, a.calib).items():
        path = out / f"{name}.jsonl"
        if a.check:
            same = path.exists() and path.read_text(encoding="utf-8") == text
            print(f"{path}: {'up to date' if same else 'DIFFERS'}")
            if not same:
                return 1
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10))} questions to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
