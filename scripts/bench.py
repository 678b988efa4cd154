"""Benchmark: rufus_llm through Triton (gRPC streaming) vs vLLM's AsyncLLM in-process.

Same engine arguments (model.json + the same overrides), same workload (chat prompts,
greedy, ignore_eos so every request generates exactly --max-tokens), same measurement code
(rufus/loadgen.py), one run. Prints a Markdown table of both and their ratios; --json
writes the raw numbers. Also measures tritonserver's time to ready (cold: empty vLLM
compile cache; warm: cached).

    python scripts/bench.py --concurrency 1 16 [--max-tokens 64] [--requests-per-worker 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rufus import loadgen
from rufus.config import load_engine_config
from rufus.server import ROOT, TritonServer, free_port

MODEL = "rufus_llm"


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cold_start_time(extra_env: dict[str, str], log: Path) -> float:
    """tritonserver start to ready with an empty vLLM compile cache."""
    env = {**extra_env, "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="vllm-cold-")}
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=env)
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=1800)
        return time.monotonic() - t0
    finally:
        srv.stop()


async def interleaved(args: argparse.Namespace, url: str, engine_args: dict) -> dict:
    """Both targets stay up; runs alternate Triton / vLLM per round and concurrency, so
    background noise on a shared machine hits both alike. Returns per-round results."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    rounds: list[dict] = []
    try:
        targets = {"triton": loadgen.triton_stream(url, MODEL),
                   "vllm": loadgen.vllm_stream(engine, engine.tokenizer)}
        for r in range(args.rounds):
            res: dict = {"triton": {}, "vllm": {}}
            for c in args.concurrency:
                order = ["triton", "vllm"] if r % 2 == 0 else ["vllm", "triton"]
                for name in order:
                    say(f"round {r + 1}/{args.rounds}: {name}, concurrency {c}")
                    res[name][c] = await loadgen.run_workload(
                        targets[name], c, c * args.requests_per_worker, args.max_tokens)
            rounds.append(res)
    finally:
        engine.shutdown()
    return {"rounds": rounds}


def median_of(rounds: list[dict], target: str, c: int, key: str) -> float:
    return statistics.median(r[target][c][key] for r in rounds)


def ratio_median(rounds: list[dict], c: int, key: str) -> float:
    return statistics.median(r["triton"][c][key] / r["vllm"][c][key] for r in rounds)


def table(rounds: list[dict], conc: list[int]) -> str:
    keys = [("output_tok_s", "output tok/s"), ("req_s", "req/s"), ("ttft_p50_ms", "TTFT p50 ms"),
            ("ttft_p99_ms", "TTFT p99 ms"), ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")]
    lines = ["| concurrency | metric | Triton (rufus_llm) | vLLM in-process | ratio (median of rounds) |",
             "|---|---|---|---|---|"]
    for c in conc:
        for k, name in keys:
            a, b = median_of(rounds, "triton", c, k), median_of(rounds, "vllm", c, k)
            lines.append(f"| {c} | {name} | {a:.1f} | {b:.1f} | {ratio_median(rounds, c, k):.2f} |")
        errs = [sum(r[t][c]["errors"] for r in rounds) for t in ("triton", "vllm")]
        lines.append(f"| {c} | errors | {errs[0]} | {errs[1]} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-worker", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="alternating Triton/vLLM rounds")
    ap.add_argument("--cold-start", action="store_true",
                    help="also time a start with an empty vLLM compile cache")
    ap.add_argument("--engine-args", default="{}",
                    help="JSON overrides for both targets (e.g. '{\"max_num_seqs\": 16}')")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", default=os.environ.get("RUFUS_BENCH_LOGS", tempfile.gettempdir()))
    args = ap.parse_args()

    extra_env = {"RUFUS_RUFUS_LLM_ENGINE_ARGS": args.engine_args,
                 "RUFUS_MAX_OUTSTANDING_REQUESTS": "0"}
    engine_args = load_engine_config(
        ROOT / "model_repository" / MODEL / "1" / "model.json", MODEL,
        {**os.environ, **extra_env}).engine_args
    say(f"engine args: {engine_args}")
    log = Path(args.log_dir) / "bench-tritonserver.log"
    starts: dict[str, float] = {}
    if args.cold_start:
        say("cold start (empty vLLM compile cache)")
        starts["cold"] = cold_start_time(extra_env, log)
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=extra_env)
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=1200)
        starts["warm"] = time.monotonic() - t0
        say(f"tritonserver ready in {starts['warm']:.1f} s")
        result = asyncio.run(interleaved(args, f"127.0.0.1:{srv.grpc_port}", engine_args))
    finally:
        srv.stop()
    md = table(result["rounds"], args.concurrency)
    header = (f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), "
              f"date: {time.strftime('%Y-%m-%d %H:%M')}, max_tokens={args.max_tokens}, "
              f"requests per worker={args.requests_per_worker}, rounds={args.rounds}")
    print(header)
    print(md)
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({**result, "ready_s": starts, "engine_args": engine_args,
                                         "header": header}, indent=1))


if __name__ == "__main__":
    main()
