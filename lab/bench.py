"""Serving benchmarks, run by scripts/bench.py and scripts/bench_multinode.py.

- :func:`run_phases`: rufus_llm through Triton vs vLLM's AsyncLLM in-process (and the
  official Triton vLLM backend when asked), alternating per round on the same machine so
  noise hits every target alike; :func:`serving_table` reports medians and per-round ratios.
- :func:`single_node` / :func:`failure_drill`: one node vs the two-node unit, and the
  unit's failure path timed end to end.

Every comparison is a ratio against a baseline measured in the same run; the figures and
their exact commands live in docs/benchmarks.md.
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
from typing import Any

from lab import loadgen
from rufus.client import generate
from rufus.launch.server import ROOT, TritonServer, free_port
from rufus.serving.config import load_engine_config

MODEL = "rufus_llm"
OFFICIAL = "official_vllm"
SHIM = Path(__file__).with_name("official_backend_shim.py")
STUB_PRELUDE = '''import locale, os, site, sys
locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)
'''
CHECK_PROMPT = "The best way to keep running shoes clean is"


def parser(doc: str | None, epilog: str) -> argparse.ArgumentParser:
    """The options both benchmark scripts share (the workload of every target)."""
    ap = argparse.ArgumentParser(description=doc, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-worker", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None, help="write the raw results here")
    return ap


def say(msg: str, tag: str = "bench") -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------ Triton vs in-process vLLM
def build_repository(engine_args: dict, official_src: Path | None) -> Path:
    """A temporary model repository: our rufus_llm, plus the official backend if asked."""
    repo = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    (repo / MODEL).symlink_to(ROOT / "model_repository" / MODEL)
    if official_src is not None:
        dest = repo / OFFICIAL / "1"
        shutil.copytree(official_src, dest)
        model_py = dest / "model.py"
        model_py.write_text(STUB_PRELUDE + SHIM.read_text() + model_py.read_text())
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
    in-process engine alternate per round and concurrency, so noise hits both alike.

    ``args``: ``rounds``, ``concurrency`` (list), ``gap``, ``requests_per_worker``,
    ``max_tokens`` as scripts/bench.py parses them."""
    from rufus.serving.engine_processes import build_vllm_engine

    # the same process layout as the served engine
    engine = build_vllm_engine(engine_args, name="in-process baseline")
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
                            # let the other engine's worker stop its post-request busy-poll
                            # first (shm_broadcast), so neither target runs beside the
                            # other's spinning worker.
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


def med(rounds: list[dict], t: str, c: int, k: str) -> float:
    return statistics.median(r[t][c][k] for r in rounds)


def ratio(rounds: list[dict], a: str, b: str, c: int, k: str) -> float:
    """Median over rounds of the per-round ratio (both measured back to back)."""
    return statistics.median(r[a][c][k] / r[b][c][k] for r in rounds)


def serving_table(phases: dict[str, list[dict]], conc: list[int]) -> str:
    tri = phases["triton"]
    off = phases.get("official")
    head = ["concurrency", "metric", "rufus_llm (Triton)", "vLLM in-process", "ratio"]
    if off:
        head += ["official backend (Triton)", "vLLM in-process", "ratio",
                 "rufus / official (ratio of ratios)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in conc:
        for k, label in loadgen.SUMMARY_KEYS:
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


# ------------------------------------------------------------ one node vs the unit
def workload(url: str, concurrency: list[int], requests_per_worker: int,
             max_tokens: int) -> dict[int, dict]:
    out = {}
    for c in concurrency:
        say(f"concurrency {c}", "bench-mn")
        out[c] = asyncio.run(loadgen.run_workload(
            loadgen.triton_stream(url, MODEL), c, c * requests_per_worker, max_tokens))
    return out


def greedy(url: str) -> str:
    """A short greedy answer: the unit must give the same one as a single node."""
    return "".join(c.text for c in generate(url, MODEL, CHECK_PROMPT, stream=False,
                                            sampling={"temperature": 0.0, "max_tokens": 32},
                                            flags={"exclude_input_in_output": True}))


def single_node(args: argparse.Namespace, engine_args: dict) -> tuple[dict, str, float]:
    """The baseline: one tritonserver with the same engine args (no pipeline split)."""
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=Path(args.log_dir) / "single.log",
                       extra_env={"RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(engine_args),
                                  "VLLM_CPU_KVCACHE_SPACE": "1"})
    srv.start()
    try:
        ready = srv.wait_ready(timeout=1200)
        say(f"single node ready in {ready:.1f} s", "bench-mn")
        url = f"127.0.0.1:{srv.grpc_port}"
        ref = greedy(url)
        return (workload(url, args.concurrency, args.requests_per_worker, args.max_tokens),
                ref, ready)
    finally:
        srv.stop()


def failure_drill(sup: Any, ref: str) -> dict[str, Any]:
    """SIGKILL the follower during a stream; time the stream's error, the leader going not
    ready and the supervisor's whole-unit restart until it answers ``ref`` again."""
    unit = sup.unit
    restarts = sup.restarts
    killed, exc = unit.kill_follower_mid_stream(MODEL)
    failed = time.monotonic() - killed if exc else float("nan")
    status = exc.status if exc else ""
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


def unit_table(one: dict, two: dict, conc: list[int]) -> str:
    rows = ["| concurrency | metric | 1 node | 2-node unit | unit / 1 node |",
            "|---|---|---|---|---|"]
    for c in conc:
        for key, label in loadgen.SUMMARY_KEYS:
            a, b = one[c][key], two[c][key]
            rows.append(f"| {c} | {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
        rows.append(f"| {c} | errors | {one[c]['errors']} | {two[c]['errors']} | |")
    return "\n".join(rows)


ENV_HELP = """environment: VLLM_CPU_KVCACHE_SPACE
(in-process engine's KV cache, default 2 GiB as rufus.launch.server gives Triton); the
serving variables of docs/architecture.md (RUFUS_RUFUS_LLM_ENGINE_ARGS is set from
--engine-args)."""


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = parser(doc, ENV_HELP)
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
    ap.add_argument("--log-dir", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    # The same CPU KV-cache size for the in-process engine as rufus.launch.server gives Triton's
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
    print(serving_table(phases, args.concurrency))
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({"phases": phases, "ready_s": starts,
                                         "engine_args": engine_args, "header": header},
                                        indent=1))

