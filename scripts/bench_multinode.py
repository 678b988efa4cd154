"""Benchmark: one node vs the two-node unit (leader + follower, pipeline parallel 2).

One run, same workload (rufus/harness/loadgen.py through Triton gRPC streaming: chat prompts,
greedy, ignore_eos, --max-tokens per request), same engine arguments except the split:

1. single-node tritonserver (model.json + --engine-args);
2. the two-node unit from rufus/harness/rig.py under its Supervisor (+ pipeline_parallel_size=2);
3. failure drill on the unit: SIGKILL the follower's process group during a stream and time
   (a) the in-flight stream's UNAVAILABLE, (b) the leader's model going not ready,
   (c) the supervisor's whole-unit restart until it serves a correct answer again.

    python scripts/bench_multinode.py [--concurrency 1 16] [--max-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rufus.client import RequestFailed, generate
from rufus.harness import loadgen
from rufus.harness.rig import LocalUnit, Supervisor
from rufus.harness.server import TritonServer, free_port

MODEL = "rufus_llm"
CHECK_PROMPT = "The best way to keep running shoes clean is"


def say(msg: str) -> None:
    print(f"[bench-mn {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def workload(url: str, args: argparse.Namespace) -> dict[int, dict]:
    out = {}
    for c in args.concurrency:
        say(f"concurrency {c}")
        out[c] = asyncio.run(loadgen.run_workload(
            loadgen.triton_stream(url, MODEL), c, c * args.requests_per_worker, args.max_tokens))
    return out


def greedy(url: str) -> str:
    return "".join(c.text for c in generate(url, MODEL, CHECK_PROMPT, stream=False,
                                            sampling={"temperature": 0.0, "max_tokens": 32},
                                            flags={"exclude_input_in_output": True}))


def single_node(args: argparse.Namespace, engine_args: dict) -> tuple[dict, str, float]:
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=Path(args.log_dir) / "single.log",
                       extra_env={"RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(engine_args),
                                  "VLLM_CPU_KVCACHE_SPACE": "1"})
    srv.start()
    try:
        ready = srv.wait_ready(timeout=1200)
        say(f"single node ready in {ready:.1f} s")
        url = f"127.0.0.1:{srv.grpc_port}"
        ref = greedy(url)
        return workload(url, args), ref, ready
    finally:
        srv.stop()


def failure_drill(sup: Supervisor, ref: str) -> dict[str, float]:
    unit = sup.unit
    restarts = sup.restarts
    killed = 0.0
    failed = float("nan")
    status = ""
    try:
        n = 0
        for _ in generate(unit.url, MODEL, "Tell me a long story about a shoe.", stream=True,
                          sampling={"temperature": 0.0, "max_tokens": 900, "ignore_eos": True},
                          timeout=120):
            n += 1
            if n == 3:
                killed = time.monotonic()
                unit.kill_follower(1)
    except RequestFailed as exc:
        failed = time.monotonic() - killed
        status = exc.status
    while sup.last("leader_not_ready") is None and sup.last("drain_timeout") is None:
        time.sleep(0.05)
    nr = sup.last("leader_not_ready")
    not_ready = (nr.t - killed) if nr else float("nan")
    while not (sup.restarts > restarts and sup.ready.is_set()):
        time.sleep(0.5)
    ready_again = time.monotonic() - killed
    ok = greedy(unit.url) == ref
    serving = time.monotonic() - killed
    return {"stream_error_s": failed, "stream_status": status, "not_ready_s": not_ready,
            "ready_again_s": ready_again, "serving_again_s": serving, "correct_after": ok}


def table(one: dict, two: dict, conc: list[int]) -> str:
    rows = ["| concurrency | metric | 1 node | 2-node unit | unit / 1 node |",
            "|---|---|---|---|---|"]
    for c in conc:
        for key, label in loadgen.SUMMARY_KEYS:
            a, b = one[c][key], two[c][key]
            rows.append(f"| {c} | {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
        rows.append(f"| {c} | errors | {one[c]['errors']} | {two[c]['errors']} | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-worker", type=int, default=4)
    ap.add_argument("--engine-args", default="{}", help="JSON overrides for both setups")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-bench-mn"))
    args = ap.parse_args()
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
        say(f"two-node unit ready in {two_ready:.1f} s")
        unit_answer = greedy(unit.url)
        same = unit_answer == ref
        two = workload(unit.url, args)
        say("failure drill")
        # after the restart the unit must answer exactly as it did before the failure
        drill = failure_drill(sup, unit_answer)
    finally:
        sup.stop()
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "args": vars(args) | {"json": str(args.json)},
              "single": one, "unit": two, "ready_s": {"single": one_ready, "unit": two_ready},
              "greedy_identical": same, "answers": {"single": ref, "unit": unit_answer},
              "drill": drill}
    print(table(one, two, args.concurrency))
    print(f"\nstart to ready: 1 node {one_ready:.1f} s, unit {two_ready:.1f} s; greedy output "
          f"identical: {same}")
    print("failure drill: " + json.dumps(drill))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
