"""Is the first request after "ready" as fast as the hundredth? The benchmark behind
scripts/bench_first_request.py (its docstring and --help: why every request carries a new
input, how starts and settings alternate)."""

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
from rufus.launch.server import TritonServer, free_port
from rufus.qp.client import plan
from rufus.qp.plan import load_eval

EVAL = Path(__file__).resolve().parents[1] / "data/qp/eval.jsonl"


def question_pools(n: int) -> dict[str, list[str]]:
    """``n`` distinct inputs per kind, no question shared between kinds (the assistant's plan
    request would otherwise find the plan kind's question in the planner's prefix cache)."""
    qs = [row["question"] for row in load_eval(EVAL)]
    if 3 * n > len(qs):
        raise SystemExit(f"--steady {n - 1}: at most {len(qs) // 3 - 1} (distinct questions)")
    return {"plan": qs[0::3][:n], "assistant first answer token": qs[1::3][:n],
            "chat TTFT": [f"{q}? What should I look for?" for q in qs[2::3][:n]]}


def say(msg: str) -> None:
    print(f"[bench_first_request {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr,
          flush=True)


def chat_ttft(url: str, text: str) -> float:
    t0 = time.monotonic()
    for chunk in generate(url, "rufus_llm", messages=[{"role": "user", "content": text}],
                          sampling={"max_tokens": 16, "temperature": 0},
                          flags={"exclude_input_in_output": True}):
        if chunk.text:
            return time.monotonic() - t0
    return time.monotonic() - t0


def plan_latency(url: str, text: str) -> float:
    return plan(url, text).latency


async def _assistant_first_text(url: str, text: str) -> float:
    io = AsyncStreams(url)
    t0 = time.monotonic()
    try:
        async with contextlib.aclosing(io.stream("rufus_assistant", {"question": text})) as s:
            async for outs in s:
                if output_str(outs, "text_output"):
                    return time.monotonic() - t0
    finally:
        await io.close()
    return time.monotonic() - t0


def assistant_first_token(url: str, text: str) -> float:
    return asyncio.run(_assistant_first_text(url, text))


KINDS = {"chat TTFT": (chat_ttft, "rufus_llm"), "plan": (plan_latency, "rufus_qp_medusa"),
         "assistant first answer token": (assistant_first_token, "rufus_assistant")}


# the pause before every request: the planner's thread count follows the cores other
# processes used in the last ~0.2 s (rufus/qp/decoder/cores.py), so a plan sent right after
# a chat would run with fewer threads than the steady state's plans, which follow plans
SETTLE_S = 0.5

# the served setting and the baselines it is compared with (--baseline)
SETTINGS: dict[str, dict[str, str]] = {"served": {}, "nowarmup": {"RUFUS_WARMUP": "false"},
                                       "nofreeze": {"RUFUS_LAB_OFF": "gc_freeze"},
                                       # rufus_llm's EngineCore spawned, as vLLM's CPU default
                                       "spawn": {"RUFUS_LAB_OFF": "fork"}}


def client_ready(url: str) -> None:
    """This process's gRPC client imported and connected once (a liveness call, no model
    touched), so that the first timed request does not carry the benchmark's own first use
    of tritonclient and gRPC (which fell on the first chat of the first start only)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        client.is_server_live()
    finally:
        client.close()


def one_run(models: list[str], setting: str, first: int, pools: dict[str, list[str]],
            log: Path, repeats: int = 0) -> dict[str, Any]:
    """One start: question ``first`` of each kind's pool first, then the rest of the pool,
    each once. Returns every request's time by its question's index (and, with
    ``repeats``, the first question sent again that many times: served from prefix caches,
    the measurement that showed why repeated inputs do not make a steady state)."""
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=SETTINGS[setting])
    t0 = time.monotonic()
    srv.start()
    try:
        ready = srv.wait_ready(timeout=1800, progress=False)
        url = f"127.0.0.1:{srv.grpc_port}"
        out: dict[str, Any] = {"setting": setting, "ready_s": round(ready, 1), "first": first}
        kinds = [(k, f) for k, (f, m) in KINDS.items() if m in models]
        client_ready(url)
        times: dict[str, dict[int, float]] = {k: {} for k, _ in kinds}
        for k, f in kinds:  # each kind's very first request, right after ready
            time.sleep(SETTLE_S)
            times[k][first] = f(url, pools[k][first])
        for k, f in kinds:
            for i, text in enumerate(pools[k]):
                if i != first:
                    time.sleep(SETTLE_S)
                    times[k][i] = f(url, text)
            later = [t for i, t in times[k].items() if i != first]
            med = statistics.median(later)
            out[k] = {"first_ms": round(times[k][first] * 1e3), "median_ms": round(med * 1e3),
                      "first_over_median": round(times[k][first] / med, 2),
                      "ms_by_question": {i: round(t * 1e3) for i, t in times[k].items()}}
            say(f"{setting}: {k}: first {times[k][first] * 1e3:.0f} ms, median of "
                f"{len(later)} new questions {med * 1e3:.0f} ms ({times[k][first] / med:.2f}x)")
            if repeats:
                again = statistics.median(f(url, pools[k][first]) for _ in range(repeats))
                out[k]["repeat_ms"] = round(again * 1e3)
                say(f"{setting}: {k}: the first question again, median of {repeats}: "
                    f"{again * 1e3:.0f} ms")
        out["total_s"] = round(time.monotonic() - t0, 1)
        return out
    finally:
        srv.stop()


def same_elsewhere(runs: list[dict[str, Any]]) -> None:
    """Each first request over the same question sent later (not first) in the setting's
    other starts: same input, no prefix cache, so the ratio is the first-request cost."""
    for r in runs:
        for k in KINDS:
            if k not in r:
                continue
            q = r["first"]
            others = [o[k]["ms_by_question"][q] for o in runs if o is not r
                      and o["setting"] == r["setting"] and o["first"] != q]
            if others:
                ref = statistics.median(others)
                r[k]["same_elsewhere_ms"] = round(ref)
                r[k]["first_over_same_elsewhere"] = round(r[k]["first_ms"] / ref, 2)


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="rufus_llm,rufus_qp_medusa,rufus_assistant")
    ap.add_argument("--steady", type=int, default=15,
                    help="later requests of each kind, each a new question")
    ap.add_argument("--compare", action="store_true",
                    help="also starts with the --baseline setting, same run")
    ap.add_argument("--baseline", choices=[k for k in SETTINGS if k != "served"],
                    default="nowarmup")
    ap.add_argument("--starts", type=int, default=2,
                    help="starts per setting (2 or more: the same-question comparison)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="also send each first question again this many times (prefix-cache "
                         "hits; reported apart, never part of the steady state)")
    ap.add_argument("--logs", type=Path, default=Path("bench-results"))
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args(argv)
    a.logs.mkdir(parents=True, exist_ok=True)
    models = a.models.split(",")
    pools = question_pools(a.steady + 1)
    if a.starts > a.steady + 1:
        ap.error("--starts: at most --steady + 1 (each start sends its own first question)")
    settings = ["served", a.baseline] if a.compare else ["served"]
    runs = []
    for n in range(a.starts):
        for setting in (settings if n % 2 == 0 else list(reversed(settings))):
            say(f"start {n + 1}/{a.starts}, {setting} ({','.join(models)})")
            runs.append(one_run(models, setting, n, pools,
                                a.logs / f"first-request-{setting}-{n}.log", a.repeats))
    same_elsewhere(runs)
    print(json.dumps(runs, indent=1))
    print("\n| setting | start | ready s | " + " | ".join(
        f"{k}: first / median of new (ratio); over same question elsewhere" for k in KINDS)
        + " |")
    print("|---|---|---|" + "---|" * len(KINDS))
    for i, r in enumerate(runs):
        cells = [f"{r[k]['first_ms']} / {r[k]['median_ms']} ms ({r[k]['first_over_median']}x); "
                 f"{r[k].get('first_over_same_elsewhere', '-')}x"
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
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0

