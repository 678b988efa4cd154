"""Benchmark: is the first request after "ready" as fast as the hundredth?

Starts a real tritonserver (``make serve``'s three models by default), waits until it reports
ready, then at once sends the first plain chat (rufus_llm, time to first token), the first
plan (rufus_qp_medusa, latency) and the first assistant question (rufus_assistant, time to
first answer text), then ``--steady`` more of each, one at a time, and reports each first
request against the median of the later ones. With ``--compare`` the same is done on
starts with a baseline setting (``--baseline``: the warm-up turned off, ``RUFUS_WARMUP=false``,
or the stubs' heap freeze turned off, ``RUFUS_GC_FREEZE=0``), in the same run, starts of the
two settings alternating; ``--starts N`` repeats each setting's start N times, so that the
first request, one sample per start, is seen more than once. Results: docs/benchmarks.md.

    .venv/bin/python scripts/bench_first_request.py [--steady 20] [--compare]
        [--baseline nowarmup|nofreeze|spawn] [--starts 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rufus.client import AsyncStreams, generate, output_str
from rufus.harness.server import TritonServer, free_port
from rufus.qp.client import plan

CHATS = ["Suggest a gift for a coffee lover.", "What should I pack for a beach trip?",
         "How do I choose running shoes?", "Is a robot vacuum worth it?",
         "What size tent for four people?", "Tips for buying a used bike?"]
QUESTIONS = ["wireless earbuds under $50", "running shoes for flat feet", "a quiet blender",
             "sony headphones", "kids winter boots under $40", "a laptop backpack",
             "cast iron skillet", "yoga mat for beginners"]


def say(msg: str) -> None:
    print(f"[bench_first_request {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr,
          flush=True)


def chat_ttft(url: str, i: int) -> float:
    t0 = time.monotonic()
    for chunk in generate(url, "rufus_llm", messages=[{"role": "user",
                                                       "content": CHATS[i % len(CHATS)]}],
                          sampling={"max_tokens": 16, "temperature": 0},
                          flags={"exclude_input_in_output": True}):
        if chunk.text:
            return time.monotonic() - t0
    return time.monotonic() - t0


def plan_latency(url: str, i: int) -> float:
    return plan(url, QUESTIONS[i % len(QUESTIONS)]).latency


async def _assistant_first_text(url: str, i: int) -> float:
    io = AsyncStreams(url)
    t0 = time.monotonic()
    try:
        async with contextlib.aclosing(io.stream("rufus_assistant", {
                "question": QUESTIONS[(i + 3) % len(QUESTIONS)]})) as s:
            async for outs in s:
                if output_str(outs, "text_output"):
                    return time.monotonic() - t0
    finally:
        await io.close()
    return time.monotonic() - t0


def assistant_first_token(url: str, i: int) -> float:
    return asyncio.run(_assistant_first_text(url, i))


KINDS = {"chat TTFT": (chat_ttft, "rufus_llm"), "plan": (plan_latency, "rufus_qp_medusa"),
         "assistant first answer token": (assistant_first_token, "rufus_assistant")}


# the first request's input sent again after the steady ones (median of these)
SAME_INPUT_REPEATS = 5

# the served setting and the baselines it is compared with (--baseline)
SETTINGS: dict[str, dict[str, str]] = {"served": {}, "nowarmup": {"RUFUS_WARMUP": "false"},
                                       "nofreeze": {"RUFUS_GC_FREEZE": "0"},
                                       # rufus_llm's EngineCore spawned, as vLLM's CPU default
                                       "spawn": {"RUFUS_ENGINE_START_METHOD": "spawn"}}


def one_run(models: list[str], setting: str, steady: int, log: Path) -> dict[str, Any]:
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=SETTINGS[setting])
    t0 = time.monotonic()
    srv.start()
    try:
        ready = srv.wait_ready(timeout=1800, progress=False)
        url = f"127.0.0.1:{srv.grpc_port}"
        out: dict[str, Any] = {"setting": setting, "ready_s": round(ready, 1)}
        kinds = [(k, f) for k, (f, m) in KINDS.items() if m in models]
        firsts = {k: f(url, 0) for k, f in kinds}  # each kind's very first request
        for k, f in kinds:
            later = [f(url, i) for i in range(1, steady + 1)]
            med = statistics.median(later)
            # the first request's own input again: a first question whose plan or answer is
            # simply longer than the median's is not a first-request cost
            same = statistics.median(f(url, 0) for _ in range(SAME_INPUT_REPEATS))
            out[k] = {"first_ms": round(firsts[k] * 1e3), "median_ms": round(med * 1e3),
                      "first_over_median": round(firsts[k] / med, 2),
                      "same_input_ms": round(same * 1e3),
                      "first_over_same_input": round(firsts[k] / same, 2)}
            say(f"{setting}: {k}: first {firsts[k] * 1e3:.0f} ms, "
                f"median of {steady} {med * 1e3:.0f} ms ({firsts[k] / med:.2f}x), "
                f"its own input again {same * 1e3:.0f} ms ({firsts[k] / same:.2f}x)")
        out["total_s"] = round(time.monotonic() - t0, 1)
        return out
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="rufus_llm,rufus_qp_medusa,rufus_assistant")
    ap.add_argument("--steady", type=int, default=20, help="later requests of each kind")
    ap.add_argument("--compare", action="store_true",
                    help="also starts with the --baseline setting, same run")
    ap.add_argument("--baseline", choices=[k for k in SETTINGS if k != "served"],
                    default="nowarmup")
    ap.add_argument("--starts", type=int, default=1, help="starts per setting")
    ap.add_argument("--logs", type=Path, default=Path("bench-results"))
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args(argv)
    a.logs.mkdir(parents=True, exist_ok=True)
    models = a.models.split(",")
    settings = ["served", a.baseline] if a.compare else ["served"]
    runs = []
    for n in range(a.starts):
        for setting in (settings if n % 2 == 0 else list(reversed(settings))):
            say(f"start {n + 1}/{a.starts}, {setting} ({','.join(models)})")
            runs.append(one_run(models, setting, a.steady,
                                a.logs / f"first-request-{setting}-{n}.log"))
    print(json.dumps(runs, indent=1))
    print("\n| setting | start | ready s | " + " | ".join(f"{k}: first / median (ratio)"
                                                         for k in KINDS) + " |")
    print("|---|---|---|" + "---|" * len(KINDS))
    for i, r in enumerate(runs):
        cells = [f"{r[k]['first_ms']} / {r[k]['median_ms']} ms ({r[k]['first_over_median']}x)"
                 if k in r else "-" for k in KINDS]
        print(f"| {r['setting']} | {i // len(settings) + 1} | {r['ready_s']} | "
              + " | ".join(cells) + " |")
    for setting in settings:
        rs = [r for r in runs if r["setting"] == setting]
        cells = [f"median {statistics.median(r[k]['first_over_median'] for r in rs):.2f}x, "
                 f"worst {max(r[k]['first_over_median'] for r in rs):.2f}x"
                 if all(k in r for r in rs) else "-" for k in KINDS]
        print(f"| {setting}, {len(rs)} starts | | "
              f"{statistics.median(r['ready_s'] for r in rs):.1f} | " + " | ".join(cells) + " |")
    print("\nfirst request over its own input sent again (median of "
          f"{SAME_INPUT_REPEATS}):")
    for i, r in enumerate(runs):
        print(f"| {r['setting']} | {i // len(settings) + 1} | " + " | ".join(
            f"{k} {r[k]['first_over_same_input']}x" for k in KINDS if k in r) + " |")
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
