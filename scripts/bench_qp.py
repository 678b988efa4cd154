"""Benchmark the query planner through Triton: Medusa vs autoregressive, same model, same run.

What runs and how it is measured: rufus/qp/tooling/bench.py's docstring. Figures:
docs/benchmarks.md.

    .venv/bin/python scripts/bench_qp.py [--rounds 1] [--concurrency 1 4 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rufus.qp.tooling.bench import BASELINES, run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1, help="batch-1 passes over the eval set")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--questions", type=int, default=64,
                    help="questions per server and concurrency level > 1")
    ap.add_argument("--dtype", default="measured",
                    help="served dtype: measured (this machine's choice) or a concrete one")
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="first N eval questions only")
    ap.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=list(BASELINES),
                    help="vLLM paths measured in a second phase of the same run")
    ap.add_argument("--qp-only", action="store_true",
                    help="load only the planner (default: rufus_llm too, as make serve does)")
    ap.add_argument("--vllm-gap", type=float, default=1.2,
                    help="seconds idle before each request to a vLLM server (its worker "
                         "busy-polls for 1 s after a request)")
    ap.add_argument("--solo", action="store_true",
                    help="one server only, the configured planner (make serve's set): its "
                         "own latency, with no other server sharing the cores")
    ap.add_argument("--medusa-args", type=json.loads, default={},
                    help='JSON merged into the configured planner\'s model.json for this run, '
                         'e.g. \'{"torch_max_batch": 1}\'')
    ap.add_argument("--json", default="")
    ap.add_argument("--log-dir", default=str(ROOT / "build" / "qp"))
    a = ap.parse_args()
    result = run(a)
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
