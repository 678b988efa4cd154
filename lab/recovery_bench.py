"""Start to ready, throughput per compile setting and engine death to serving again, each
through a real tritonserver: the benchmark behind scripts/bench_recovery.py (its docstring
and --help describe the variants)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab import loadgen
from rufus.launch.server import TritonServer, free_port

VARIANTS: dict[str, dict[str, str]] = {
    "aot": {"VLLM_USE_AOT_COMPILE": "1"},
    "inductor": {"VLLM_USE_AOT_COMPILE": "0"},
    # the answer model in fp32 (on a CPU without native bf16, the profile run of a full
    # max_num_batched_tokens batch is emulated bf16, docs/benchmarks.md)
    "fp32": {"VLLM_USE_AOT_COMPILE": "1",
             "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"dtype": "float32"})},
    # a smaller prefill budget: the start's profile run is one batch of this many tokens
    "tok512": {"VLLM_USE_AOT_COMPILE": "1",
               "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"max_num_batched_tokens": 512})},
    # vLLM's worker inside its EngineCore process: one process fewer to spawn and import
    # (rufus/serving/engine_processes.py EngineProcessLayout.environment)
    "uni": {"VLLM_USE_AOT_COMPILE": "1",
            "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"distributed_executor_backend": "uni"})},
    # the same with the EngineCore spawned (a new interpreter importing torch and vLLM) as
    # vLLM's CPU platform does, instead of forked from the stub (EngineProcessLayout.start_method)
    "spawn": {"VLLM_USE_AOT_COMPILE": "1", "RUFUS_LAB_OFF": "fork",
              "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"distributed_executor_backend": "uni"})},
    # the served setting with vLLM's full compile warm-up batch (max_num_batched_tokens
    # dummy tokens) instead of rufus's short one (rufus/vllm_worker/warmup.py)
    "fullwarmup": {"VLLM_USE_AOT_COMPILE": "1", "RUFUS_LAB_OFF": "short_warmup",
                   "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(
                       {"distributed_executor_backend": "uni"})},
    "mp": {"VLLM_USE_AOT_COMPILE": "1",
           "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"distributed_executor_backend": "mp"})},
    "eager": {"VLLM_USE_AOT_COMPILE": "0",
              "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps({"enforce_eager": True})},
}


def say(msg: str) -> None:
    print(f"[bench_recovery {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)



def one_start(env: dict[str, str], models: list[str], log: Path, streams: int,
              death: bool) -> dict[str, float]:
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=env)
    res: dict[str, float] = {"load1_before": os.getloadavg()[0]}
    t0 = time.monotonic()
    srv.start()
    try:
        res["ready_s"] = srv.wait_ready(timeout=1800, progress=False)
        res["load1_at_ready"] = os.getloadavg()[0]
        if streams and "rufus_llm" in models:
            time.sleep(2)
            stream = loadgen.triton_stream(f"127.0.0.1:{srv.grpc_port}", "rufus_llm")
            r = asyncio.run(loadgen.run_workload(stream, streams, streams * 3, 64))
            res["tok_s"] = r["output_tok_s"]
            res["itl_p50_ms"] = r["itl_p50_ms"]
        if death and "rufus_llm" in models:
            core = srv.engine_cores()[0]
            t1 = time.monotonic()
            core.kill()
            while srv.engine_ready("rufus_llm") is not False:
                time.sleep(0.1)
            res["death_to_not_ready_s"] = time.monotonic() - t1
            while srv.engine_ready("rufus_llm") is not True:
                if time.monotonic() - t1 > 900:
                    raise TimeoutError("no new engine after 900 s")
                time.sleep(0.2)
            res["death_to_ready_s"] = time.monotonic() - t1
    finally:
        srv.stop()
    res["total_s"] = time.monotonic() - t0
    text = log.read_text(errors="replace")
    res["aot_load_failures"] = text.count("Compiling model again")
    return res


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["aot", "inductor", "eager"],
                    choices=sorted(VARIANTS))
    ap.add_argument("--models", default="rufus_llm")
    ap.add_argument("--rounds", type=int, default=1, help="cached starts per variant")
    ap.add_argument("--streams", type=int, default=16, help="0: no throughput run")
    ap.add_argument("--death", action="store_true", help="kill the engine core once per "
                    "cached start and time it back to serving")
    ap.add_argument("--no-cold", action="store_true", help="skip the first (cold) starts")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", type=Path, default=Path(tempfile.mkdtemp(prefix="bench-rec-")))
    a = ap.parse_args(argv)
    a.log_dir.mkdir(parents=True, exist_ok=True)
    models = [m for m in a.models.split(",") if m]
    caches = {v: Path(tempfile.mkdtemp(prefix=f"bench-rec-{v}-")) for v in a.variants}
    results: dict[str, dict[str, list[dict[str, float]]]] = {v: {"first": [], "cached": []}
                                                             for v in a.variants}

    def env_of(v: str) -> dict[str, str]:
        # a fresh compile-cache root per variant (rufus/machine/caches.py keys it by CPU)
        return {**VARIANTS[v], "RUFUS_COMPILE_CACHE_DIR": str(caches[v])}

    phases = ([] if a.no_cold else [("first", 0)]) + [("cached", r) for r in range(a.rounds)]
    for kind, r in phases:
        order = a.variants if r % 2 == 0 else list(reversed(a.variants))
        for v in order:
            say(f"{v}: {kind} start {r + 1} ({','.join(models)})")
            res = one_start(env_of(v), models, a.log_dir / f"{v}-{kind}-{r}.log",
                            a.streams if kind == "cached" else 0,
                            a.death and kind == "cached")
            say(f"{v}: {json.dumps({k: round(x, 1) for k, x in res.items()})}")
            results[v][kind].append(res)

    def med(v: str, kind: str, key: str) -> str:
        xs = [x[key] for x in results[v][kind] if key in x]
        return f"{statistics.median(xs):.1f}" if xs else "-"

    base = a.variants[0]
    print(f"\nmodels {models}, rounds {a.rounds}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"| setting | first start s | cached start s | cached/base | tok/s @{a.streams} "
          "| tok/s vs base | death->ready s | load1 |")
    print("|---|---|---|---|---|---|---|---|")
    for v in a.variants:
        def ratio(key: str, v: str = v) -> str:
            x, b = med(v, "cached", key), med(base, "cached", key)
            return f"{float(x) / float(b):.2f}" if "-" not in (x, b) and float(b) else "-"
        loads = [x["load1_before"] for k in ("first", "cached") for x in results[v][k]]
        print(f"| {v} | {med(v, 'first', 'ready_s')} | {med(v, 'cached', 'ready_s')} | "
              f"{ratio('ready_s')} | {med(v, 'cached', 'tok_s')} | {ratio('tok_s')} | "
              f"{med(v, 'cached', 'death_to_ready_s')} | "
              f"{statistics.median(loads) if loads else 0:.1f} |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    say(f"logs in {a.log_dir}")

