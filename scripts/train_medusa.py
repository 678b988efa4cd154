"""Train the planner's Medusa heads by self-distillation (seeded).

Method: rufus/qp/tooling/medusa_train.py. Input: the planner model (scripts/setup.sh qp)
and questions from data/qp/train.jsonl (a seeded subset: the heads learn the model's own
plans, which are short and regular). Output: data/qp/medusa_heads.{safetensors,json}.

    .venv/bin/python scripts/train_medusa.py [--heads 6 --epochs 6 --questions 800]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rufus.qp.plan import load_eval  # noqa: E402
from rufus.qp.tooling.build import HEADS_PATH, qp_model_dir  # noqa: E402
from rufus.qp.tooling.medusa_train import HeadsConfig, train  # noqa: E402


def say(msg: str) -> None:
    print(f"[train_medusa {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    d = HeadsConfig()
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(ROOT / "data/qp/train.jsonl"))
    ap.add_argument("--questions", type=int, default=800,
                    help="seeded subset of the training questions to self-distil")
    ap.add_argument("--model", default="", help="planner model dir (default: setup's)")
    ap.add_argument("--out", default=str(HEADS_PATH))
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--batch", type=int, default=d.batch, help="positions per optimizer step")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=d.negatives)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rows = load_eval(a.train)
    if 0 < a.questions < len(rows):
        rows = random.Random(a.seed).sample(rows, a.questions)
    cfg = HeadsConfig(heads=a.heads, epochs=a.epochs, batch=a.batch, lr=a.lr,
                      negatives=a.negatives, seed=a.seed)
    train(Path(a.model) if a.model else qp_model_dir(), rows, Path(a.out), cfg, a.max_new,
          a.threads, say, meta={"train": str(Path(a.train).resolve().relative_to(ROOT))})


if __name__ == "__main__":
    main()
