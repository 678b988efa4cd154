"""Fine-tune the default model into the query planner with a LoRA adapter (seeded).

The training loop and why a LoRA: rufus/qp/tooling/lora.py. Data: data/qp/train.jsonl
(scripts/make_qp_questions.py). Time on the project's 2-core machine: docs/benchmarks.md.

    .venv/bin/python scripts/train_qp_lora.py [--max-minutes 40]   # data/qp/lora.{safetensors,json}
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rufus.qp.plan import load_eval  # noqa: E402
from rufus.qp.tooling.build import LORA_PATH  # noqa: E402
from rufus.qp.tooling.lora import LoraConfig, train  # noqa: E402
from rufus.serving.config import default_model_dir  # noqa: E402


def say(msg: str) -> None:
    print(f"[train_qp_lora {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    d = LoraConfig()
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(ROOT / "data/qp/train.jsonl"))
    ap.add_argument("--out", default=str(LORA_PATH))
    ap.add_argument("--rank", type=int, default=d.rank)
    ap.add_argument("--alpha", type=float, default=d.alpha)
    ap.add_argument("--epochs", type=float, default=d.epochs)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=d.threads,
                    help="1 is faster than 2 when the cores are shared with other work")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop and save when reached (0: run every planned step)")
    ap.add_argument("--no-autocast", action="store_true", help="train in float32")
    ap.add_argument("--no-checkpointing", action="store_true",
                    help="keep activations: ~30%% faster, ~4x the memory (an idle machine)")
    a = ap.parse_args()
    cfg = LoraConfig(rank=a.rank, alpha=a.alpha, epochs=a.epochs, batch=a.batch, lr=a.lr,
                     seed=a.seed, threads=a.threads, max_minutes=a.max_minutes,
                     autocast=not a.no_autocast, checkpointing=not a.no_checkpointing)
    train(default_model_dir(), load_eval(a.train), Path(a.out), cfg, say,
          meta={"train": str(Path(a.train).resolve().relative_to(ROOT)),
                "base": "SmolLM2-135M-Instruct (scripts/build_model.py)"})


if __name__ == "__main__":
    main()
