"""The setup's precision program: each model's precision measured on this machine
(``scripts/setup.sh precision``, the image build).

    python -m rufus.launch.setup_precision [MODEL_DIR ...] [--threads N] [--force]

The record (rufus/machine/precision.py) knows no model; this program passes it the two
models' measurements (the answer model's: its passes alone; the planner's: its Medusa trees
per precision too, rufus/qp/measure.py) and the forward pass that times them (the planner's
Llama forward, which stands in for vLLM's CPU pass).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rufus.machine import precision
from rufus.machine.caches import default_model_dir
from rufus.qp.measure import PLANNER, time_passes

ANSWER = precision.Measurement("answer", default_model_dir)
MEASUREMENTS = (ANSWER, PLANNER)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rufus.launch.setup_precision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="*", type=Path,
                    help="default: each measured model (the default model and the "
                         "planner's model); a directory neither names is timed as an "
                         "answer model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--force", action="store_true", help="measure again even if cached")
    a = ap.parse_args(argv)
    return precision.run(a.model_dirs, MEASUREMENTS, time_passes, a.threads, a.force)


if __name__ == "__main__":
    raise SystemExit(main())
