"""Benchmark: rufus_llm through Triton (gRPC streaming) vs vLLM's AsyncLLM in-process,
and optionally vs the official Triton vLLM backend in the same tritonserver.

Same engine arguments (model.json + the same overrides), same workload (16 shopping
questions rendered once with the chat template and sent as identical raw prompts; greedy;
ignore_eos so every request generates exactly --max-tokens), same measurement code
(rufus/harness/loadgen.py), one run (rufus/harness/bench.py). Each Triton model gets its
own tritonserver (a phase); within a phase it alternates with the in-process engine per
round, so a noisy shared machine disturbs both alike; the table shows medians over rounds
and the median of per-round ratios (rufus vs official = the ratio of their ratios to the
same in-process engine).

Every measurement starts after --gap idle seconds: a vLLM CPU worker busy-polls for 1 s
after its last request, and the two engines of a phase share the machine, so without the
gap whichever target ran second shared the CPU with the other's spinning worker. Also
measures tritonserver's time to ready (--cold-start: with an empty vLLM compile cache).

    python scripts/bench.py --concurrency 1 16 [--rounds 3] [--max-tokens 64]
    python scripts/bench.py --official /path/to/vllm_backend/src   # three-way

--official takes the `src/` folder of a checkout of triton-inference-server/vllm_backend
(not shipped here); its model.py runs unchanged except for what is prepended at run time:
the two stub workarounds every model here needs (sys.path from PYTHONPATH, UTF-8 locale)
and rufus/harness/official_backend_shim.py (three names that moved in vLLM 0.32).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from rufus.harness.bench import (
    MODEL,
    OFFICIAL,
    build_repository,
    cold_start_time,
    parser,
    run_phases,
    say,
    serving_table,
)
from rufus.harness.server import ROOT
from rufus.serving.config import load_engine_config

ENV_HELP = """environment: RUFUS_BENCH_LOGS (default of --log-dir); VLLM_CPU_KVCACHE_SPACE
(in-process engine's KV cache, default 2 GiB as rufus.harness.server gives Triton); the
serving variables of docs/architecture.md (RUFUS_RUFUS_LLM_ENGINE_ARGS is set from
--engine-args)."""


def main() -> None:
    ap = parser(__doc__, ENV_HELP)
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
    print(serving_table(phases, args.concurrency))
    print("time to ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    if args.json:
        args.json.write_text(json.dumps({"phases": phases, "ready_s": starts,
                                         "engine_args": engine_args, "header": header},
                                        indent=1))


if __name__ == "__main__":
    main()
