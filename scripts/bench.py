"""Benchmark: rufus_llm through Triton (gRPC streaming) vs vLLM's AsyncLLM in-process,
and optionally vs the official Triton vLLM backend in the same tritonserver.

Same engine arguments (model.json + the same overrides), same workload (16 shopping
questions rendered once with the chat template and sent as identical raw prompts; greedy;
ignore_eos so every request generates exactly --max-tokens), same measurement code
(rufus/loadgen.py), one run. All targets stay up and the runs alternate between them in
each round, so a noisy shared machine disturbs them alike; the table shows medians over
rounds and the median of per-round ratios. Also measures tritonserver's time to ready
(--cold-start: with an empty vLLM compile cache).

    python scripts/bench.py --concurrency 1 16 [--rounds 3] [--max-tokens 64]
    python scripts/bench.py --official /path/to/vllm_backend/src   # three-way

--official takes the `src/` folder of a checkout of triton-inference-server/vllm_backend
(not shipped here); its model.py runs unchanged except for what is prepended at run time:
the two stub workarounds every model here needs (sys.path from PYTHONPATH, UTF-8 locale)
and scripts/official_backend_shim.py (three names that moved in vLLM 0.32).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
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
OFFICIAL = "official_vllm"
STUB_PRELUDE = '''import locale, os, site, sys
locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)
'''


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_repository(engine_args: dict, official_src: Path | None) -> Path:
    """A temporary model repository: our rufus_llm, plus the official backend if asked."""
    repo = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    (repo / MODEL).symlink_to(ROOT / "model_repository" / MODEL)
    if official_src is not None:
        dest = repo / OFFICIAL / "1"
        shutil.copytree(official_src, dest)
        model_py = dest / "model.py"
        shim = (ROOT / "scripts" / "official_backend_shim.py").read_text()
        model_py.write_text(STUB_PRELUDE + shim + model_py.read_text())
        (dest / "model.json").write_text(json.dumps(engine_args))
        (repo / OFFICIAL / "config.pbtxt").write_text(
            f'name: "{OFFICIAL}"\nbackend: "python"\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    return repo


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


async def interleaved(args: argparse.Namespace, url: str, engine_args: dict,
                      names: list[str]) -> list[dict]:
    """Every target stays up; each round runs each concurrency on every target, in an
    order that rotates per round. Returns per-round results."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    prompts = loadgen.render_chat(engine.tokenizer, loadgen.SHOPPING_PROMPTS)
    targets = {"triton": loadgen.triton_stream(url, MODEL, chat=False),
               "vllm": loadgen.vllm_stream(engine, engine.tokenizer, chat=False),
               "official": loadgen.triton_stream(url, OFFICIAL, chat=False)}
    rounds: list[dict] = []
    try:
        for r in range(args.rounds):
            res: dict = {n: {} for n in names}
            order = names[r % len(names):] + names[:r % len(names)]
            for c in args.concurrency:
                for name in order:
                    say(f"round {r + 1}/{args.rounds}: {name}, concurrency {c}")
                    res[name][c] = await loadgen.run_workload(
                        targets[name], c, c * args.requests_per_worker, args.max_tokens,
                        prompts=prompts)
            rounds.append(res)
    finally:
        engine.shutdown()
    return rounds


KEYS = [("output_tok_s", "output tok/s"), ("req_s", "req/s"), ("ttft_p50_ms", "TTFT p50 ms"),
        ("ttft_p99_ms", "TTFT p99 ms"), ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")]
LABELS = {"triton": "rufus_llm (Triton)", "vllm": "vLLM in-process",
          "official": "official vLLM backend (Triton)"}


def table(rounds: list[dict], conc: list[int], names: list[str]) -> str:
    def med(t: str, c: int, k: str) -> float:
        return statistics.median(r[t][c][k] for r in rounds)

    def ratio(a: str, b: str, c: int, k: str) -> float:
        return statistics.median(r[a][c][k] / r[b][c][k] for r in rounds)

    others = [n for n in names if n != "triton"]
    head = ["concurrency", "metric", *(LABELS[n] for n in names),
            *(f"rufus / {LABELS[n]}" for n in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in conc:
        for k, label in KEYS:
            cells = [f"{med(n, c, k):.1f}" for n in names]
            cells += [f"{ratio('triton', n, c, k):.2f}" for n in others]
            lines.append(f"| {c} | {label} | " + " | ".join(cells) + " |")
        errs = [str(sum(r[n][c]["errors"] for r in rounds)) for n in names]
        lines.append(f"| {c} | errors | " + " | ".join(errs) + " |" + " |" * len(others))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-worker", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, targets alternating")
    ap.add_argument("--cold-start", action="store_true",
                    help="also time a start with an empty vLLM compile cache")
    ap.add_argument("--official", type=Path, default=None,
                    help="src/ of a vllm_backend checkout: add the official backend")
    ap.add_argument("--engine-args", default="{}",
                    help="JSON overrides for every target (e.g. '{\"max_num_seqs\": 16}')")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", default=os.environ.get("RUFUS_BENCH_LOGS", tempfile.gettempdir()))
    args = ap.parse_args()
    # The same CPU KV-cache size for the in-process engine as rufus.server gives Triton's
    # (without it vLLM-CPU sizes the cache from gpu_memory_utilization x total RAM).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

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
        say(f"cold start: {starts['cold']:.1f} s")
    names = ["triton", "vllm"] + (["official"] if args.official else [])
    models = [MODEL] + ([OFFICIAL] if args.official else [])
    repo = build_repository(engine_args, args.official)
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=extra_env,
                       model_repository=repo)
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=1800)
        starts["warm (cached compile)"] = time.monotonic() - t0
        say(f"tritonserver ready ({', '.join(models)}) in {starts['warm (cached compile)']:.1f} s")
        rounds = asyncio.run(interleaved(args, f"127.0.0.1:{srv.grpc_port}", engine_args, names))
    finally:
        srv.stop()
        shutil.rmtree(repo, ignore_errors=True)
    header = (f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), "
              f"date: {time.strftime('%Y-%m-%d %H:%M')}, max_tokens={args.max_tokens}, "
              f"requests per worker={args.requests_per_worker}, rounds={args.rounds}")
    print(header)
    print(table(rounds, args.concurrency, names))
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "ready_s": starts,
                                         "engine_args": engine_args, "header": header},
                                        indent=1))


if __name__ == "__main__":
    main()
