"""Build the default model (``make model``): rufus/harness/default_model.py.

    python scripts/build_model.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rufus.harness.default_model import build
from rufus.serving.config import default_model_dir


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment: RUFUS_MODEL_DIR (default --out), else RUFUS_CACHE_DIR "
               "(default ~/.cache/rufus) + models/SmolLM2-135M-Instruct")
    ap.add_argument("--out", type=Path, default=default_model_dir(),
                    help="model directory (default %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the stamp verifies")
    args = ap.parse_args()
    build(args.out, args.force)


if __name__ == "__main__":
    main()
