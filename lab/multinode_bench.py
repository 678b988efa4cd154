"""One node vs the two-node unit, and the unit's failure drill, in one run: the benchmark
behind scripts/bench_multinode.py (its docstring and --help). The pieces it shares with
scripts/bench.py are in lab/bench.py."""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

from lab.bench import failure_drill, greedy, parser, say, single_node, unit_table, workload
from rufus.launch.rig import LocalUnit, Supervisor

ENV_HELP = ("environment: the serving variables of docs/architecture.md; "
            "RUFUS_RUFUS_LLM_ENGINE_ARGS is set from --engine-args")


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = parser(doc, ENV_HELP)
    ap.add_argument("--engine-args", default="{}", help="JSON overrides for both setups")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-bench-mn"))
    args = ap.parse_args(argv)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    base = json.loads(args.engine_args)
    one, ref, one_ready = single_node(args, base)
    unit = LocalUnit(engine_args={**base, "pipeline_parallel_size": 2},
                     log_dir=Path(args.log_dir))
    sup = Supervisor(unit, start_timeout=1200).start()
    try:
        t0 = time.monotonic()
        if not sup.wait_ready(1260):
            raise SystemExit(f"unit not ready: {sup.events}")
        two_ready = time.monotonic() - t0
        say(f"two-node unit ready in {two_ready:.1f} s", "bench-mn")
        unit_answer = greedy(unit.url)
        same = unit_answer == ref
        two = workload(unit.url, args.concurrency, args.requests_per_worker, args.max_tokens)
        say("failure drill", "bench-mn")
        # after the restart the unit must answer exactly as it did before the failure
        drill = failure_drill(sup, unit_answer)
    finally:
        sup.stop()
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "args": vars(args) | {"json": str(args.json)},
              "single": one, "unit": two, "ready_s": {"single": one_ready, "unit": two_ready},
              "greedy_identical": same, "answers": {"single": ref, "unit": unit_answer},
              "drill": drill}
    print(unit_table(one, two, args.concurrency))
    print(f"\nstart to ready: 1 node {one_ready:.1f} s, unit {two_ready:.1f} s; greedy output "
          f"identical: {same}")
    print("failure drill: " + json.dumps(drill))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))

