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


def triton_runs(args: argparse.Namespace, extra_env: dict[str, str]) -> tuple[dict, dict]:
    results: dict[int, dict] = {}
    starts: dict[str, float] = {}
    log = Path(args.log_dir) / "bench-tritonserver.log"
    for label in (["cold"] if args.cold_start else []) + ["warm"]:
        env = dict(extra_env)
        if label == "cold":
            env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm-cold-")
        srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                           metrics_port=free_port(), log_path=log, extra_env=env)
        t0 = time.monotonic()
        srv.start()
        try:
            srv.wait_ready(timeout=1200)
            starts[label] = time.monotonic() - t0
            say(f"tritonserver ready ({label} start) in {starts[label]:.1f} s")
            if label != "warm":
                continue
            url = f"127.0.0.1:{srv.grpc_port}"
            for c in args.concurrency:
                say(f"triton: concurrency {c}")
                results[c] = asyncio.run(loadgen.run_workload(
                    loadgen.triton_stream(url, MODEL), c, c * args.requests_per_worker,
                    args.max_tokens))
        finally:
            srv.stop()
    return results, starts


def vllm_runs(args: argparse.Namespace, engine_args: dict) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main() -> dict:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
        try:
            out = {}
            stream = loadgen.vllm_stream(engine, engine.tokenizer)
            for c in args.concurrency:
                say(f"vllm in-process: concurrency {c}")
                out[c] = await loadgen.run_workload(stream, c, c * args.requests_per_worker,
                                                    args.max_tokens)
            return out
        finally:
            engine.shutdown()

    return asyncio.run(main())


def table(tri: dict, raw: dict, conc: list[int]) -> str:
    keys = [("output_tok_s", "output tok/s"), ("req_s", "req/s"), ("ttft_p50_ms", "TTFT p50 ms"),
            ("ttft_p99_ms", "TTFT p99 ms"), ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")]
    lines = ["| concurrency | metric | Triton (rufus_llm) | vLLM in-process | ratio |",
             "|---|---|---|---|---|"]
    for c in conc:
        for k, name in keys:
            a, b = tri[c][k], raw[c][k]
            lines.append(f"| {c} | {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
        lines.append(f"| {c} | errors | {tri[c]['errors']} | {raw[c]['errors']} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-worker", type=int, default=4)
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
    tri, starts = triton_runs(args, extra_env)
    raw = vllm_runs(args, engine_args)
    md = table(tri, raw, args.concurrency)
    header = (f"machine: {platform.node()} ({os.cpu_count()} cores), "
              f"date: {time.strftime('%Y-%m-%d %H:%M')}, max_tokens={args.max_tokens}, "
              f"requests per worker={args.requests_per_worker}")
    print(header)
    print(md)
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({"triton": tri, "vllm": raw, "ready_s": starts,
                                         "engine_args": engine_args, "header": header},
                                        indent=1))


if __name__ == "__main__":
    main()
