"""Assistant goodput through the ingress of a local fleet: N single-node units, each pinned to
a core of its own (as hosts of their own would be), behind HAProxy with the unit agents'
weights (least outstanding, SLO-aware). Run once with one unit to find its capacity at the
SLO, then with two offered twice that: the fleet view of open-loop load.

    .venv/bin/python scripts/bench_fleet_goodput.py --units 1 --rates 1 1 2 3
    .venv/bin/python scripts/bench_fleet_goodput.py --units 2 --rates 2 2 4

Each rate's row is the open-loop goodput benchmark's (lab/goodput.py); the JSON report
(``--out``) is that benchmark's, and the last line says how many requests each unit served.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.goodput import main as goodput_main
from rufus.launch.fleet import Fleet

MODELS = ["rufus_llm", "rufus_qp_medusa", "rufus_assistant"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=2, help="single-node units, one core each")
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 2.0, 4.0],
                    help="offered conversations/s (the first one warms the fleet)")
    ap.add_argument("--duration", type=float, default=60.0, help="arrival window per rate (s)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default=None, help="JSON report (default build/goodput/fleet<N>.json)")
    ap.add_argument("--log-dir", default=None)
    a = ap.parse_args(argv)
    out = a.out or f"build/goodput/fleet{a.units}.json"
    fleet = Fleet(n_units=a.units, nnodes=1, engine_args={}, models=list(MODELS),
                  log_dir=Path(a.log_dir or f"/tmp/rufus-fleet-goodput-{a.units}"), stagger=True)
    try:
        fleet.start()
        fleet.wait_ready()
        print(fleet.describe(), flush=True)
        rc = goodput_main(["--target", "assistant", "--url", fleet.url,
                           "--rates", *(f"{r:g}" for r in a.rates),
                           "--duration", f"{a.duration:g}", "--warmup", str(a.warmup),
                           "--out", out])
        print("served per unit:", fleet.served(), flush=True)
        return rc
    finally:
        fleet.stop()


if __name__ == "__main__":
    raise SystemExit(main())
