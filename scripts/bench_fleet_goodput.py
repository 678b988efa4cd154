"""Assistant goodput through the ingress of a local fleet of single-core units (lab/fleet_goodput.py).

    .venv/bin/python scripts/bench_fleet_goodput.py --units 1 --rates 1 1 2 3
    .venv/bin/python scripts/bench_fleet_goodput.py --units 2 --rates 2 2 4
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.fleet_goodput import main

if __name__ == "__main__":
    raise SystemExit(main())
