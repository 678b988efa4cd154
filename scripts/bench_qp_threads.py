"""Planner latency per ``torch_threads`` next to an idle or busy answer model.

What runs: rufus/qp/tooling/threads_bench.py's docstring. Figures: docs/benchmarks-history.md
("Planner threads").

    .venv/bin/python scripts/bench_qp_threads.py [--threads auto 2 1] [--neighbours idle same apart]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rufus.qp.tooling.threads_bench import measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=lambda v: v if v == "auto" else int(v), nargs="+",
                    default=["auto", 2, 1], help='fixed team sizes and/or "auto"')
    ap.add_argument("--neighbours", nargs="+", default=["idle", "same", "apart"],
                    choices=["idle", "same", "apart"])
    ap.add_argument("--plans", type=int, default=20, help="timed plans per setting")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-qp-threads-"))
    rows = []
    print("| neighbour | torch_threads | plans | p50 ms | max ms |\n|---|---|---|---|---|")
    for nb in a.neighbours:
        for t in a.threads:
            print(f"[bench_qp_threads {time.strftime('%H:%M:%S')}] {nb}, {t} thread(s)",
                  file=sys.stderr, flush=True)
            r = measure(t, nb, a.plans, log_dir)
            rows.append(r)
            print(f"| {nb} | {t} | {r['plans']} | {r['p50_ms']:.0f} | {r['max_ms']:.0f} |",
                  flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"[bench_qp_threads] logs in {log_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
