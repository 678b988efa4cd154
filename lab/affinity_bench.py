"""Conversation affinity vs least outstanding requests on a local fleet, in one run.

Two single-node units (rufus_llm + the planner each, one core each: the whole unit), their agents
and HAProxy (rufus/launch/fleet.py). The shopping assistant runs in this process, as the
OpenAI frontend runs it (rufus/frontend/assistant_hook.py): each turn sends a plan request,
an answer-prefix prefill and the answer request through the ingress. Multi-turn
conversations, closed loop, blocks alternating ABBA:

- ``affinity``: the answer model's requests of a conversation (prefill and answer) carry
  its key (``x-rufus-conversation``), so they hash to one unit (bounded load); plans go to
  the least busy unit, as in the other arm;
- ``lor``: no key, every request balanced on its own by least outstanding requests (the
  prefill and the answer of one turn, and the turns of one conversation, may land on
  different units).

Per arm: first answer token and answer-model TTFT of follow-up turns (p50/p99) and of first
turns, and vLLM's prefix-cache hit rate over both units (``vllm:prefix_cache_*_total``
deltas per block). Then a hot-key phase: many concurrent conversations share one key; HAProxy's
``scur`` per unit is sampled to show that no unit goes above the balance factor's bound.

    python scripts/affinity_bench.py                  # ~8 minutes on 2 cores (cached engines)
    python scripts/affinity_bench.py --blocks 2 --conversations 4   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.loadgen import pct_nearest as pct
from proxy.agent import prometheus_samples
from proxy.haproxy import AFFINITY_BALANCE_FACTOR
from rufus.launch.fleet import Fleet

MODELS = ["rufus_llm", "rufus_qp_medusa"]
# between a conversation's turns: a customer reads and types. Back to back, the stream that
# just ended (clients cancel a decoupled stream after its final response) still counts on its
# unit for a moment, and at low load bounded-load hashing then moves the next turn away
THINK_S = 1.0
ENGINE_ARGS: dict[str, Any] = {"max_num_seqs": 8, "max_model_len": 2048}

# Product conversations whose follow-ups lean on the history (the assistant's answer prompt
# carries the earlier turns: the prefix a unit's prefix cache can hold).
CONVERSATIONS: list[list[str]] = [
    ["running shoes under $80", "any from nike?", "which is best for flat feet?",
     "do they come in wide sizes?"],
    ["i need a coffee maker", "something under $100?", "which one makes espresso?",
     "is it easy to clean?"],
    ["65 inch tv", "which one has the best reviews?", "any cheaper ones?",
     "does it work with alexa?"],
    ["laptop for college under $600", "which has the longest battery life?",
     "any with 16gb of ram?", "what about a lighter one?"],
    ["gift ideas for someone who likes camping", "something under $50?",
     "what about a tent for two?", "is it waterproof?"],
    ["wireless earbuds under $50", "which are best for running?",
     "any with noise cancelling?", "do they work with an iphone?"],
]


def unique(n: int, turns: int) -> list[str]:
    """Conversation ``n``: a script above whose first question names a customer of its own,
    so no two conversations share a history (a prefix cached by an earlier block, or by the
    other arm, would otherwise be a hit whatever the routing)."""
    first, *rest = CONVERSATIONS[n % len(CONVERSATIONS)][:turns]
    return [f"{first} (shopping for customer {1000 + n})", *rest]


def say(msg: str) -> None:
    print(f"[affinity-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class TurnResult:
    arm: str
    turn: int
    first_token_s: float = math.nan
    answer_ttft_s: float = math.nan
    plan_s: float = math.nan
    error: str = ""


@dataclass
class Arm:
    turns: list[TurnResult] = field(default_factory=list)
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    wall_s: float = 0.0


def prefix_counters(fleet: Fleet) -> tuple[float, float]:
    """vLLM's prefix-cache counters (tokens), summed over the units' rufus_llm."""
    queries = hits = 0.0
    for fu in fleet.units:
        url = f"http://127.0.0.1:{fu.unit.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for name, labels, value in prometheus_samples(r.read().decode()):
                if labels.get("model") != "rufus_llm":
                    continue
                if name == "vllm:prefix_cache_queries_total":
                    queries += value
                elif name == "vllm:prefix_cache_hits_total":
                    hits += value
    return queries, hits


async def conversation(assistant: Any, questions: list[str], arm: str, key: str | None,
                       out: list[TurnResult], think_s: float = 0.0) -> None:
    from rufus.assistant.turn_events import DoneEvent, TextEvent

    history: list[dict[str, str]] = []
    for turn, q in enumerate(questions):
        if turn:
            await asyncio.sleep(think_s)  # the customer reads the answer, types the next
        r = TurnResult(arm, turn)
        text = ""
        try:
            async with contextlib.aclosing(assistant.stream(q, history, key)) as events:
                async for ev in events:
                    match ev:
                        case TextEvent():
                            text += ev.text
                        case DoneEvent():
                            t = ev.timings
                            r.first_token_s = t.get("first_token_s", math.nan)
                            r.answer_ttft_s = t.get("answer_ttft_s", math.nan)
                            r.plan_s = t.get("plan_s", math.nan)
        except Exception as exc:  # noqa: BLE001 - a failed turn is counted, the run goes on
            r.error = str(exc)[:200]
        out.append(r)
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": text}]


async def run_block(assistant: Any, arm: str, block: int, n_conv: int, concurrency: int,
                    turns: int, out: list[TurnResult], hot: bool = False,
                    think_s: float = THINK_S) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n_conv):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            key = None
            if arm == "affinity":
                key = "hot-key" if hot else f"b{block}-c{i}"
            await conversation(assistant, unique(block * n_conv + i, turns), arm, key, out,
                               think_s)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def summarize(results: list[TurnResult]) -> dict[str, Any]:
    ok = [r for r in results if not r.error]

    def stats(rows: list[TurnResult], attr: str) -> dict[str, float]:
        vals = [getattr(r, attr) for r in rows if getattr(r, attr) == getattr(r, attr)]
        if not vals:
            return {"n": 0}
        return {"n": len(vals), "p50": round(pct(vals, 0.5), 3), "p99": round(pct(vals, 0.99), 3),
                "mean": round(sum(vals) / len(vals), 3)}

    follow = [r for r in ok if r.turn > 0]
    first = [r for r in ok if r.turn == 0]
    return {"turns": len(results), "failed": len(results) - len(ok),
            "errors": sorted({r.error for r in results if r.error})[:5],
            "follow_up_first_token_s": stats(follow, "first_token_s"),
            "follow_up_answer_ttft_s": stats(follow, "answer_ttft_s"),
            "follow_up_plan_s": stats(follow, "plan_s"),
            "first_turn_first_token_s": stats(first, "first_token_s"),
            "first_turn_answer_ttft_s": stats(first, "answer_ttft_s")}


def difference_ci(a: list[float], b: list[float], q: float, n: int = 2000,
                  seed: int = 0) -> dict[str, float]:
    """Quantile ``q`` of ``a`` minus that of ``b``, with a 90 % bootstrap interval (both
    samples resampled, seeded): whether a difference between the arms is larger than what
    resampling the same turns gives, on a machine whose timings are noisy."""
    import random

    rng = random.Random(seed)
    diffs = sorted(pct(rng.choices(a, k=len(a)), q) - pct(rng.choices(b, k=len(b)), q)
                   for _ in range(n))
    return {"diff": round(pct(a, q) - pct(b, q), 3), "lo": round(diffs[int(0.05 * n)], 3),
            "hi": round(diffs[int(0.95 * n) - 1], 3)}


def compare_arms(arms: dict[str, Arm]) -> dict[str, dict[str, float]]:
    """Affinity minus least outstanding, follow-up turns: negative is better for affinity."""
    def vals(arm: Arm, attr: str) -> list[float]:
        return [getattr(r, attr) for r in arm.turns
                if not r.error and r.turn > 0 and getattr(r, attr) == getattr(r, attr)]

    out = {}
    for attr in ("first_token_s", "answer_ttft_s", "plan_s"):
        a, b = vals(arms["affinity"], attr), vals(arms["lor"], attr)
        if a and b:
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                out[f"follow_up_{attr}_{name}"] = difference_ci(a, b, q)
    return out


def hot_key_phase(fleet: Fleet, assistant: Any, loop_run: Any, n_conv: int,
                  concurrency: int, turns: int) -> dict[str, Any]:
    """Every conversation carries the same key; sample HAProxy's streams per unit."""
    samples: list[dict[str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        assert fleet.haproxy is not None
        while not stop.is_set():
            rows = fleet.haproxy.servers("units_affinity")
            samples.append({name: int(row["scur"] or 0) for name, row in rows.items()})
            stop.wait(0.1)

    before = fleet.served("units_affinity")
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    results: list[TurnResult] = []
    try:
        loop_run(run_block(assistant, "affinity", 50, n_conv, concurrency, turns, results,
                           hot=True))
    finally:
        stop.set()
        t.join(5)
    after = fleet.served("units_affinity")
    worst = {"max_unit_streams": 0, "total_then": 0, "bound": 0}
    over = 0
    for s in samples:
        total = sum(s.values())
        if not total:
            continue
        # HAProxy's rule (2.6 chash_server_is_eligible): a unit may take a new stream while
        # it serves fewer than ceil((total + 1) * factor / 100) / units
        bound = math.ceil(math.ceil((total + 1) * AFFINITY_BALANCE_FACTOR / 100) / len(s))
        top = max(s.values())
        over += top > bound
        if top > worst["max_unit_streams"]:
            worst = {"max_unit_streams": top, "total_then": total, "bound": bound}
    return {"conversations": n_conv, "concurrency": concurrency,
            "requests_per_unit": {k: after[k] - before.get(k, 0) for k in after},
            "samples": len(samples), "samples_above_bound": over, "worst": worst,
            **{k: v for k, v in summarize(results).items()
               if k in ("turns", "failed", "errors")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/affinity_bench.py",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8, help="conversations per block")
    ap.add_argument("--concurrency", type=int, default=4, help="conversations at a time")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation (max 4)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks, alternating ABBA")
    ap.add_argument("--max-tokens", type=int, default=160,
                    help="answer tokens per turn (the assistant's own answer length; the "
                         "history a follow-up carries grows with it)")
    ap.add_argument("--hot-conversations", type=int, default=8)
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-affinity"))
    ap.add_argument("--out", default="bench-results/affinity-bench.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")

    from rufus.assistant.pipeline import Assistant
    from rufus.machine import cpu as machine
    from rufus.retrieval import default_retriever

    fleet = Fleet(n_units=2, nnodes=1, engine_args=dict(ENGINE_ARGS), models=list(MODELS),
                  log_dir=Path(a.log_dir))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": machine.describe(),
        "units": 2, "models": MODELS, "engine_args": ENGINE_ARGS,
        "balance_factor": AFFINITY_BALANCE_FACTOR, "args": vars(a)}
    loop = asyncio.new_event_loop()
    try:
        fleet.start()
        say("fleet starting: 2 single-node units with rufus_llm + rufus_qp_medusa "
            f"(logs {a.log_dir})")
        say(f"fleet ready in {fleet.wait_ready(timeout=1500):.0f} s")
        assistant = Assistant(fleet.url, default_retriever(), max_tokens=a.max_tokens)
        say("warm-up: one conversation per arm (not counted)")
        for arm in ("affinity", "lor"):
            loop.run_until_complete(run_block(assistant, arm, 900 + len(arm), 2, 2, a.turns, []))
        arms = {"affinity": Arm(), "lor": Arm()}
        order = ["affinity", "lor", "lor", "affinity"]
        for b in range(a.blocks):
            arm = order[b % 4]
            q0, h0 = prefix_counters(fleet)
            t0 = time.monotonic()
            loop.run_until_complete(run_block(assistant, arm, b, a.conversations,
                                              a.concurrency, a.turns, arms[arm].turns))
            q1, h1 = prefix_counters(fleet)
            arms[arm].wall_s += time.monotonic() - t0
            arms[arm].prefix_queries += q1 - q0
            arms[arm].prefix_hits += h1 - h0
            s = summarize(arms[arm].turns)
            say(f"block {b + 1}/{a.blocks} ({arm}): {time.monotonic() - t0:.0f} s; so far "
                f"follow-up first token p50 {s['follow_up_first_token_s'].get('p50')} s, "
                f"prefix hits {arms[arm].prefix_hits / max(arms[arm].prefix_queries, 1):.0%}")
        result["arms"] = {
            name: {**summarize(arm.turns), "wall_s": round(arm.wall_s, 1),
                   "prefix_cache_hit_rate": round(arm.prefix_hits / max(arm.prefix_queries, 1), 3),
                   "prefix_cache_queries_tokens": arm.prefix_queries}
            for name, arm in arms.items()}
        result["affinity_minus_lor"] = compare_arms(arms)
        say(f"hot key: {a.hot_conversations} concurrent conversations, one key")
        result["hot_key"] = hot_key_phase(fleet, assistant, loop.run_until_complete,
                                          a.hot_conversations, a.hot_conversations, 2)
        loop.run_until_complete(assistant.aclose())
    finally:
        loop.close()
        say("stopping the fleet")
        fleet.stop()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result.get(k) for k in ("arms", "affinity_minus_lor", "hot_key")},
                     indent=1))
    say(f"results in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
