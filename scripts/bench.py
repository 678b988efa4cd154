"""Benchmark: rufus_llm through Triton (gRPC streaming) vs vLLM's AsyncLLM in-process,
and optionally vs the official Triton vLLM backend in the same tritonserver.

Same engine arguments (model.json + the same overrides), same workload (16 shopping
questions rendered once with the chat template and sent as identical raw prompts; greedy;
ignore_eos so every request generates exactly --max-tokens), same measurement code
(rufus/harness/loadgen.py), one run. Each Triton model gets its own tritonserver (a phase); within
a phase it alternates with the in-process engine per round, so a noisy shared machine
disturbs both alike; the table shows medians over rounds and the median of per-round
ratios (rufus vs official = the ratio of their ratios to the same in-process engine).

Every measurement starts after --gap idle seconds: a vLLM CPU worker busy-polls for 1 s
after its last request, and the two engines of a phase share the machine, so without the
gap whichever target ran second shared the CPU with the other's spinning worker. Also
measures tritonserver's time to ready (--cold-start: with an empty vLLM compile cache).

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

from rufus.harness import loadgen
from rufus.harness.server import ROOT, TritonServer, free_port
from rufus.serving.config import load_engine_config

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


async def run_phases(args: argparse.Namespace, engine_args: dict, extra_env: dict[str, str],
                     models: list[str], repo: Path, log: Path,
                     starts: dict[str, float]) -> dict[str, list[dict]]:
    """One phase per Triton model, each in its own tritonserver (two vLLM engines in one
    server disturbed each other on 2 cores). Within a phase the Triton target and the
    in-process engine alternate per round and concurrency, so noise hits both alike."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    prompts = loadgen.render_chat(engine.tokenizer, loadgen.SHOPPING_PROMPTS)
    baseline = loadgen.vllm_stream(engine, engine.tokenizer, chat=False)
    phases: dict[str, list[dict]] = {}
    try:
        for model in models:
            key = "triton" if model == MODEL else "official"
            srv = TritonServer(models=[model], grpc_port=free_port(), http_port=free_port(),
                               metrics_port=free_port(), log_path=log, extra_env=extra_env,
                               model_repository=repo)
            t0 = time.monotonic()
            srv.start()
            try:
                srv.wait_ready(timeout=1800)
                starts[f"{model} (cached compile)"] = time.monotonic() - t0
                say(f"tritonserver ready ({model}) in {time.monotonic() - t0:.1f} s")
                targets = {key: loadgen.triton_stream(f"127.0.0.1:{srv.grpc_port}", model,
                                                      chat=False),
                           "vllm": baseline}
                rounds = []
                for r in range(args.rounds):
                    order = [key, "vllm"] if r % 2 == 0 else ["vllm", key]
                    res: dict = {n: {} for n in order}
                    for c in args.concurrency:
                        for name in order:
                            # let the other engine's worker stop its 1 s post-request
                            # busy-poll first (shm_broadcast), so neither target runs
                            # beside the other's spinning worker.
                            await asyncio.sleep(args.gap)
                            say(f"{model}: round {r + 1}/{args.rounds}: {name}, concurrency {c}")
                            res[name][c] = await loadgen.run_workload(
                                targets[name], c, c * args.requests_per_worker, args.max_tokens,
                                prompts=prompts)
                    rounds.append(res)
                phases[key] = rounds
            finally:
                srv.stop()
    finally:
        engine.shutdown()
    return phases


KEYS = loadgen.SUMMARY_KEYS


def med(rounds: list[dict], t: str, c: int, k: str) -> float:
    return statistics.median(r[t][c][k] for r in rounds)


def ratio(rounds: list[dict], a: str, b: str, c: int, k: str) -> float:
    """Median over rounds of the per-round ratio (both measured back to back)."""
    return statistics.median(r[a][c][k] / r[b][c][k] for r in rounds)


def table(phases: dict[str, list[dict]], conc: list[int]) -> str:
    tri = phases["triton"]
    off = phases.get("official")
    head = ["concurrency", "metric", "rufus_llm (Triton)", "vLLM in-process", "ratio"]
    if off:
        head += ["official backend (Triton)", "vLLM in-process", "ratio",
                 "rufus / official (ratio of ratios)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in conc:
        for k, label in KEYS:
            cells = [f"{med(tri, 'triton', c, k):.1f}", f"{med(tri, 'vllm', c, k):.1f}",
                     f"{ratio(tri, 'triton', 'vllm', c, k):.2f}"]
            if off:
                cells += [f"{med(off, 'official', c, k):.1f}", f"{med(off, 'vllm', c, k):.1f}",
                          f"{ratio(off, 'official', 'vllm', c, k):.2f}",
                          f"{ratio(tri, 'triton', 'vllm', c, k) / ratio(off, 'official', 'vllm', c, k):.2f}"]
            lines.append(f"| {c} | {label} | " + " | ".join(cells) + " |")
        errs = sum(r[t][c]["errors"] for p in phases.values() for r in p for t in r)
        lines.append(f"| {c} | errors (all targets) | {errs} |" + " |" * (len(head) - 3))
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
    ap.add_argument("--gap", type=float, default=2.0,
                    help="idle seconds before each measurement (vLLM CPU workers busy-poll "
                         "for 1 s after their last request)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", default=os.environ.get("RUFUS_BENCH_LOGS", tempfile.gettempdir()))
    args = ap.parse_args()
    # The same CPU KV-cache size for the in-process engine as rufus.harness.server gives Triton's
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
    models = [MODEL] + ([OFFICIAL] if args.official else [])
    repo = build_repository(engine_args, args.official)
    try:
        phases = asyncio.run(run_phases(args, engine_args, extra_env, models, repo, log, starts))
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    header = (f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), "
              f"date: {time.strftime('%Y-%m-%d %H:%M')}, max_tokens={args.max_tokens}, "
              f"requests per worker={args.requests_per_worker}, rounds={args.rounds}")
    print(header)
    print(table(phases, args.concurrency))
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({"phases": phases, "ready_s": starts,
                                         "engine_args": engine_args, "header": header},
                                        indent=1))


if __name__ == "__main__":
    main()
