"""Open-loop goodput: how many requests per second the stack answers within a latency SLO.

The closed-loop benchmarks (lab/loadgen.py, scripts/bench_assistant.py) send the
next request only when one ends, so an overloaded server slows the client down and its queue
never shows: latency looks bounded while real customers would wait. Here arrivals follow a
seeded Poisson process (exponential gaps) and each request starts at its scheduled time
however many are in flight, as independent customers do. Latency is counted from the
*scheduled* time, so a client that falls behind cannot hide queueing either (coordinated
omission); the schedule lag is reported so that a saturated client shows.

Per offered rate: the share of *all* arrivals answered within the SLO (errors, refusals and
requests still running at the end count against it), goodput (those requests per second of
the arrival window), latency percentiles of the answered ones, and quick refusals
(retryable errors before any response: the admission bound working as designed) apart from
other errors. :func:`capacity_at_slo` reads a sweep: the highest rate whose share is >= 99%.

Targets (the measured event, default SLO):

- :class:`AssistantTarget`, ``rufus_assistant`` over gRPC: the first non-empty
  ``text_output`` after the products response (first answer text), 1.0 s;
- :class:`PlannerTarget`, ``rufus_qp_medusa`` over gRPC: the final plan response, 0.3 s;
- :class:`OpenAITarget`, ``rufus-assistant`` through the OpenAI frontend (streaming chat
  completions): the first content chunk after the product list (the answer's first token),
  1.0 s; the first content chunk (the product list) is recorded as ``cards``.

Library only: scripts/bench_goodput.py is the CLI, tests/unit/test_goodput.py the tests (on a
virtual clock: everything here reads time from the running event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lab.loadgen import pct_nearest

NAN = float("nan")
PRODUCT_INTENTS = ("product_search", "product_comparison", "product_question", "recommendation")
EVAL_PATH = Path(__file__).resolve().parents[1] / "data" / "qp" / "eval.jsonl"
# the planner's held-out questions and the hand-written ones of the answer eval (a superset:
# the most distinct questions held out from training)
QUESTIONS_PATH = Path(__file__).resolve().parents[1] / "data" / "assistant" / "answers_eval.jsonl"
DRAIN_S = 60.0          # after the arrival window, how long in-flight requests may finish
LATE = "LATE"           # error code of a request still running at the drain bound
NO_EVENT = "NO_EVENT"   # the stream ended without the measured event
# HTTP statuses that refuse a request as retryable (the frontend's 503 carries Retry-After)
RETRYABLE_HTTP = (429, 503)


# --- workload ----------------------------------------------------------------------------

def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival offsets (s) in ``[0, duration_s)``: exponential gaps of mean ``1/rate``,
    reproducible by ``seed`` (the same seed at another rate is the same schedule scaled)."""
    if rate <= 0 or duration_s <= 0:
        return []
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def load_questions(path: str | Path = QUESTIONS_PATH) -> list[str]:
    """The held-out single-turn product questions (default: the answer eval's, which holds
    the planner's held-out set plus hand-written ones), in file order."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return [r["question"] for r in rows
            if r.get("intent") in PRODUCT_INTENTS and not r.get("history")]


def question_cycle(questions: Sequence[str], seed: int) -> Iterator[str]:
    """The questions in one seeded shuffled order, cycled (each asked once per cycle)."""
    if not questions:
        raise ValueError("no questions")
    order = list(questions)
    random.Random(seed).shuffle(order)
    while True:
        yield from order


# --- one request ---------------------------------------------------------------------------

@dataclass
class Outcome:
    """What a target saw of one request: event times are the event loop's clock."""

    events: dict[str, float] = field(default_factory=dict)  # event name -> loop time
    error_code: str = ""         # "" when it succeeded
    error: str = ""              # short message
    retryable: bool = False      # the error says "retry later / elsewhere"
    responded: bool = False      # a response (chunk) arrived before the error
    info: dict[str, Any] = field(default_factory=dict)       # e.g. fallback, finish_reason


class Target(Protocol):
    """One kind of request: ``event`` names the measured event in ``Outcome.events``."""

    name: str
    event: str
    default_slo_s: float

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def __call__(self, question: str) -> Awaitable[Outcome]: ...


@dataclass
class RequestResult:
    """One arrival. Latencies are seconds from the scheduled time."""

    scheduled: float             # offset into the arrival window
    lag: float = 0.0             # started this late (the client's own delay)
    latency: float = NAN         # of the measured event; nan without it
    ok: bool = False             # the measured event arrived and no error
    error_code: str = ""         # UNAVAILABLE, RESOURCE_EXHAUSTED, HTTP_503, LATE, NO_EVENT...
    error: str = ""
    refused: bool = False        # a retryable error before any response
    refusal_latency: float = NAN
    events: dict[str, float] = field(default_factory=dict)   # every event's latency
    info: dict[str, Any] = field(default_factory=dict)
    question: str = ""
    # asked before in this run (warm-up included): its plan and answer prompt may be cached
    repeat: bool = False


def _result(scheduled: float, due: float, started: float, out: Outcome, event: str,
            question: str) -> RequestResult:
    """An outcome's times relative to the request's due time (loop clock)."""
    r = RequestResult(scheduled=scheduled, lag=started - due, question=question,
                      info=dict(out.info), error_code=out.error_code, error=out.error,
                      events={k: v - due for k, v in out.events.items()})
    if event in out.events:
        r.latency = out.events[event] - due
    if out.error_code:
        r.refused = out.retryable and not out.responded
        if r.refused and "error" in out.events:
            r.refusal_latency = out.events["error"] - due
    elif event not in out.events:
        r.error_code, r.error = NO_EVENT, f"the stream ended without the {event!r} event"
    r.ok = not r.error_code
    return r


async def _guarded(target: Callable[[str], Awaitable[Outcome]], question: str) -> Outcome:
    """A target's exception is a failed request, never a failed run."""
    try:
        return await target(question)
    except Exception as exc:  # noqa: BLE001 - counted per request, reported
        loop = asyncio.get_running_loop()
        return Outcome(events={"error": loop.time()}, error_code=type(exc).__name__,
                       error=str(exc)[:200])


# --- one rate --------------------------------------------------------------------------------

async def run_rate(target: Callable[[str], Awaitable[Outcome]], questions: Iterator[str],
                   rate: float, duration_s: float, *, event: str, seed: int = 0,
                   drain_s: float = DRAIN_S, seen: set[str] | None = None
                   ) -> list[RequestResult]:
    """Open loop: each arrival of :func:`poisson_schedule` starts its own task at its time,
    whatever is in flight; after the window, in-flight requests get ``drain_s`` more
    seconds, then are cancelled and counted as ``LATE`` (failed). ``seen``: the questions
    asked before in this run; an arrival whose question is in it is marked ``repeat``, and
    every question asked joins it."""
    seen = set() if seen is None else seen
    repeats: set[int] = set()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    pending: list[tuple[float, str, asyncio.Task[tuple[float, Outcome]]]] = []

    async def one(q: str) -> tuple[float, Outcome]:
        started = loop.time()
        return started, await _guarded(target, q)

    for offset in poisson_schedule(rate, duration_s, seed):
        delay = t0 + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        q = next(questions)
        if q in seen:
            repeats.add(len(pending))
        seen.add(q)
        pending.append((offset, q, asyncio.create_task(one(q))))
    end = t0 + duration_s
    if loop.time() < end:
        await asyncio.sleep(end - loop.time())
    tasks = [task for _, _, task in pending]
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=drain_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
    results = []
    for i, (offset, q, task) in enumerate(pending):
        due = t0 + offset
        if task.cancelled() or not task.done():
            results.append(RequestResult(scheduled=offset, error_code=LATE, question=q,
                                         error=f"unfinished {duration_s + drain_s - offset:.0f} s "
                                               "after its arrival"))
        else:
            started, out = task.result()
            results.append(_result(offset, due, started, out, event, q))
        results[-1].repeat = i in repeats
    return results


def summarize(results: Sequence[RequestResult], rate: float, duration_s: float,
              slo_s: float, event: str = "") -> dict[str, Any]:
    """One rate's row. ``share_within_slo`` is over ALL arrivals (an error, a refusal or a
    late request is a customer not served in time); percentiles are of answered requests
    (``event``, the measured one, is left out of the other events' percentiles)."""
    n = len(results)
    ok = [r for r in results if r.ok]
    lat = [r.latency for r in ok]
    within = sum(r.latency <= slo_s for r in ok)
    refused = [r for r in results if r.refused]
    errors = Counter(r.error_code for r in results if r.error_code and not r.refused)
    secondary = sorted({k for r in ok for k in r.events} - {"error", event})
    return {
        "offered_rate": rate, "duration_s": duration_s, "slo_s": slo_s,
        "arrivals": n, "achieved_rate": n / duration_s if duration_s else 0.0,
        "completed": len(ok),
        "p50_s": pct_nearest(lat, 0.5), "p90_s": pct_nearest(lat, 0.9),
        "p99_s": pct_nearest(lat, 0.99), "max_s": max(lat) if lat else NAN,
        "within_slo": within,
        "share_within_slo": within / n if n else NAN,
        "goodput": within / duration_s if duration_s else 0.0,
        "refused": len(refused),
        "refusal_p99_s": pct_nearest([r.refusal_latency for r in refused], 0.99),
        "over_2x_slo": sum(r.latency > 2 * slo_s for r in ok),
        "errors": sum(errors.values()), "error_codes": dict(errors),
        "late": errors.get(LATE, 0),
        "lag_p99_s": pct_nearest([r.lag for r in results if r.error_code != LATE], 0.99),
        "repeats": sum(r.repeat for r in results),
        # the other events' percentiles (e.g. the OpenAI target's product list)
        **{f"{k}_p{q}_s": pct_nearest([r.events[k] for r in ok if k in r.events], q / 100)
           for k in secondary for q in (50, 99)},
    }


def capacity_at_slo(rows: Sequence[dict[str, Any]], min_share: float = 0.99) -> float | None:
    """The highest offered rate with ``share_within_slo >= min_share`` such that every lower
    rate of the sweep qualifies too; None when the lowest rate already fails.

    A non-monotone sweep (a rate fails, a higher one passes again: noise, or a warm-up still
    under way) is read conservatively: the first failing rate ends the search, so a lucky
    higher rate never raises the capacity."""
    best = None
    for row in sorted(rows, key=lambda r: r["offered_rate"]):
        share = row["share_within_slo"]
        if not share >= min_share:  # nan (no arrivals) fails too
            break
        best = row["offered_rate"]
    return best


# The admission's estimate error (estimate minus measured, per admitted request) each target
# is refused or admitted by: the Triton models' (tritonserver's metrics port) and the OpenAI
# frontend's own assistant admission (its /metrics).
ESTIMATE_ERROR = {"assistant": "rufus_assistant_first_token_estimate_error_seconds",
                  "planner": "rufus_qp_plan_estimate_error_seconds",
                  "openai": "rufus_openai_assistant_first_token_estimate_error_seconds"}
CALIBRATION_BAND_S = 0.1  # an estimate within this of the measured latency counts as right


def scrape_histogram(url: str, family: str) -> dict[str, Any] | None:
    """A histogram's sum, count and cumulative buckets (le -> count), summed over its label
    sets; None when the endpoint does not answer or lacks the family."""
    import urllib.request

    from proxy.prometheus import prometheus_samples

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, Any] = {"sum": 0.0, "count": 0.0, "buckets": {}, "has_sum": False}
    found = False
    for name, labels, value in prometheus_samples(text):
        if name == family + "_sum":
            out["sum"] += value
            out["has_sum"] = True
        elif name == family + "_count":
            out["count"] += value
        elif name == family + "_bucket" and "le" in labels:
            le = float(labels["le"])  # "+Inf" parses
            out["buckets"][le] = out["buckets"].get(le, 0.0) + value
        else:
            continue
        found = True
    return out if found else None


def calibration(before: dict[str, Any] | None, after: dict[str, Any] | None,
                band_s: float = CALIBRATION_BAND_S) -> dict[str, Any] | None:
    """What one rate's admitted requests say of the estimate: their number, the mean error
    (estimate minus measured), and the shares within ``band_s`` of the truth, pessimistic
    beyond it (refuses too early) and optimistic beyond it (admits what will be late).
    The band must be bucket bounds (rufus/serving/metrics.py ADMISSION_ERROR_BUCKETS)."""
    from proxy.orchestrator_policy import ttft_quantile

    if before is None or after is None:
        return None
    n = after["count"] - before["count"]
    if n <= 0:
        return {"admitted": 0}
    delta = {le: c - before["buckets"].get(le, 0.0) for le, c in after["buckets"].items()}
    low, high = delta.get(-band_s, 0.0), delta.get(band_s, 0.0)
    # error = estimate - measured: above the band the estimate was too slow (pessimistic:
    # it refuses what would have been in time), below it too fast (admits what is late).
    # prometheus_client leaves a histogram's _sum out when buckets are negative (the
    # frontend's): then no mean, the median from the buckets either way
    mean = (after["sum"] - before["sum"]) / n if after.get("has_sum") else None
    median = ttft_quantile(list(delta.items()), 0.5, floor=min(delta)) if delta else None
    return {"admitted": int(n), "mean_error_s": mean, "median_error_s": median,
            "within_band": (high - low) / n, "pessimistic": (n - high) / n,
            "optimistic": low / n, "band_s": band_s}


def format_calibration(c: dict[str, Any] | None) -> str:
    if not c or not c.get("admitted"):
        return ""
    mean = "" if c.get("mean_error_s") is None else f"mean {c['mean_error_s'] * 1000:+.0f} ms, "
    median = c.get("median_error_s")
    mid = "" if median is None else f"median {median * 1000:+.0f} ms, "
    return (f"  estimate-measured {mean}{mid}within "
            f"{c['band_s'] * 1000:.0f} ms {c['within_band']:.0%} (over {c['pessimistic']:.0%}, "
            f"under {c['optimistic']:.0%}) of {c['admitted']}")


async def sweep(target: Target, questions: Sequence[str], rates: Sequence[float],
                duration_s: float, *, slo_s: float | None = None, seed: int = 0,
                drain_s: float = DRAIN_S, gap_s: float = 0.0, warmup: int = 0,
                on_row: Callable[[dict[str, Any]], None] | None = None,
                scrape: Callable[[], dict[str, Any] | None] | None = None,
                ) -> tuple[list[dict[str, Any]], dict[str, list[RequestResult]]]:
    """Every rate in turn, the target opened once, the questions one seeded cycle through
    the warm-up and every rate: each question is asked once before any is asked again.
    A repeated question is cheaper than a new one (the planner drafts from the plans it
    served, vLLM's prefix cache holds its answer prompt), so each row counts its
    ``repeats``; a figure for new customers' questions takes a window of at most the
    number of questions left, on a stack that has not seen them. ``warmup`` requests one
    at a time first, not counted; ``gap_s`` idle seconds before each rate (vLLM's CPU worker
    busy-polls for 1 s after its last request); ``scrape``: the admission's estimate-error
    histogram, read around each rate for its row's ``calibration``. Returns the rows and
    each rate's per-request results."""
    slo = target.default_slo_s if slo_s is None else slo_s
    rows: list[dict[str, Any]] = []
    raw: dict[str, list[RequestResult]] = {}
    await target.open()
    try:
        cycle = question_cycle(questions, seed)
        seen: set[str] = set()
        for _ in range(warmup):
            q = next(cycle)
            seen.add(q)
            await _guarded(target, q)
        for rate in rates:
            if gap_s > 0:
                await asyncio.sleep(gap_s)
            before = await asyncio.to_thread(scrape) if scrape is not None else None
            results = await run_rate(target, cycle, rate, duration_s, event=target.event,
                                     seed=seed, drain_s=drain_s, seen=seen)
            row = summarize(results, rate, duration_s, slo, target.event)
            if scrape is not None:
                row["calibration"] = calibration(before, await asyncio.to_thread(scrape))
            rows.append(row)
            raw[rate_key(raw, rate)] = results
            if on_row is not None:
                on_row(row)
    finally:
        await target.close()
    return rows, raw


def rate_key(raw: dict[str, Any], rate: float) -> str:
    """The JSON key of a rate's requests: ``"6"``, and ``"6#2"`` for a second run at 6."""
    key, n = f"{rate:g}", 1
    while key in raw:
        n += 1
        key = f"{rate:g}#{n}"
    return key


def result_dict(r: RequestResult) -> dict[str, Any]:
    """A result for JSON (rounded; nan as None)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float):
            return None if math.isnan(v) else round(v, 4)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return clean(asdict(r))


# --- targets -----------------------------------------------------------------------------

def _grpc_outcome(out: Outcome, exc: Any) -> None:
    """A :class:`rufus.client.RequestFailed` into ``out``. RESOURCE_EXHAUSTED is kept by its
    name (rufus.errors reads it as UNAVAILABLE), so the table says which bound refused."""
    loop = asyncio.get_running_loop()
    out.events["error"] = loop.time()
    text = str(exc)
    out.error_code = "RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in text else (exc.status or "UNKNOWN")
    out.error = text[:200]
    out.retryable = bool(exc.error.retryable)


class _GrpcTarget:
    """One long-lived ``AsyncStreams`` (one HTTP/2 connection, a stream per request)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.io: Any = None

    async def open(self) -> None:
        from rufus.client import AsyncStreams

        self.io = AsyncStreams(self.url)  # inside the loop that uses it

    async def close(self) -> None:
        if self.io is not None:
            await self.io.close()
            self.io = None


class AssistantTarget(_GrpcTarget):
    """``rufus_assistant``: events ``cards`` (the products response), ``answer`` (the first
    non-empty text after it: what the customer waits for) and ``done``."""

    name, event, default_slo_s = "assistant", "answer", 1.0
    model = "rufus_assistant"

    async def __call__(self, question: str) -> Outcome:
        from rufus.client import RequestFailed, output_str

        loop = asyncio.get_running_loop()
        out = Outcome()
        try:
            async with contextlib.aclosing(self.io.stream(self.model, {"question": question})) as s:
                async for outs in s:
                    now = loop.time()
                    out.responded = True
                    if "products" in outs and "cards" not in out.events:
                        out.events["cards"] = now
                        if "fallback" in outs:
                            out.info["fallback"] = bool(outs["fallback"].reshape(-1)[0])
                    if ("cards" in out.events and "answer" not in out.events
                            and output_str(outs, "text_output")):
                        out.events["answer"] = now
                    finish = output_str(outs, "finish_reason")
                    if finish:
                        out.info["finish_reason"] = finish
            out.events["done"] = loop.time()
        except RequestFailed as exc:
            _grpc_outcome(out, exc)
        return out


class PlannerTarget(_GrpcTarget):
    """``rufus_qp_medusa``: event ``plan`` (the final response, which carries the plan)."""

    name, event, default_slo_s = "planner", "plan", 0.3
    model = "rufus_qp_medusa"

    async def __call__(self, question: str) -> Outcome:
        from rufus.client import RequestFailed

        loop = asyncio.get_running_loop()
        out = Outcome()
        last: dict[str, Any] = {}
        try:
            async with contextlib.aclosing(self.io.stream(self.model, {"question": question})) as s:
                async for outs in s:
                    out.responded = True
                    last = outs
            if "plan" in last:
                out.events["plan"] = loop.time()
                if "fallback" in last:
                    out.info["fallback"] = bool(last["fallback"].reshape(-1)[0])
        except RequestFailed as exc:
            _grpc_outcome(out, exc)
        return out


CARD_LINE = re.compile(r"^\d+\. \[")


class CardSplitter:
    """Tells the product list from the answer in the OpenAI stream's content.

    rufus/frontend/assistant_hook.py sends the cards as one content delta, numbered markdown
    links (``1. [Title](url) - ...``), one a line, ending with a blank line (``"\\n\\n"``),
    and announces them in the first chunk's ``x_rufus_products``; with no products there is
    no list and the first content is the answer. ``expected``: that announcement when seen
    (True: a list comes; False: none), None to go by the content alone."""

    def __init__(self) -> None:
        self.expected: bool | None = None
        self.buf = ""
        self.in_list = True

    def feed(self, content: str) -> bool:
        """One non-empty content delta; True when it holds answer text."""
        if not self.in_list:
            return True
        if self.expected is False or (not self.buf and not CARD_LINE.match(content)):
            self.in_list = False
            return True
        self.buf += content
        _, sep, tail = self.buf.partition("\n\n")
        if not sep:
            return False
        self.in_list = False
        return bool(tail.strip())


class OpenAITarget:
    """The OpenAI frontend, streaming chat completions of ``rufus-assistant`` (httpx): events
    ``cards`` (the first content chunk: the product list), ``answer`` (the first content
    after the list: the answer's first token; the SLO's event) and ``done``."""

    name, event, default_slo_s = "openai", "answer", 1.0

    def __init__(self, url: str, model: str = "rufus-assistant") -> None:
        base = url if "://" in url else f"http://{url}"
        self.base = base.rstrip("/").removesuffix("/v1") + "/v1"
        self.model = model
        self.http: Any = None

    async def open(self) -> None:
        import httpx

        # no connection cap (open loop) and no proxy from the environment (a local server)
        self.http = httpx.AsyncClient(
            base_url=self.base, timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None

    async def __call__(self, question: str) -> Outcome:
        import httpx

        loop = asyncio.get_running_loop()
        out = Outcome()
        body = {"model": self.model, "stream": True,
                "messages": [{"role": "user", "content": question}]}
        cards = CardSplitter()
        try:
            async with self.http.stream("POST", "/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    out.events["error"] = loop.time()
                    text = (await resp.aread()).decode("utf-8", "replace")
                    out.error_code = f"HTTP_{resp.status_code}"
                    out.error = text[:200]
                    out.retryable = resp.status_code in RETRYABLE_HTTP
                    return out
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = loop.time()
                    out.responded = True
                    chunk = json.loads(data)
                    if "error" in chunk:
                        err = chunk["error"] or {}
                        out.events["error"] = now
                        out.error_code = str(err.get("code") or err.get("type") or "stream_error")
                        out.error = str(err.get("message", ""))[:200]
                        return out
                    if "x_rufus_products" in chunk:
                        cards.expected = bool(chunk["x_rufus_products"])
                    for choice in chunk.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content") or ""
                        if choice.get("finish_reason"):
                            out.info["finish_reason"] = choice["finish_reason"]
                        if not content:
                            continue
                        out.events.setdefault("cards", now)
                        if cards.feed(content):
                            out.events.setdefault("answer", now)
            out.events["done"] = loop.time()
        except httpx.HTTPError as exc:
            out.events["error"] = loop.time()
            out.error_code, out.error = type(exc).__name__, str(exc)[:200]
            # a refused connection is a server not taking requests: retry elsewhere
            out.retryable = isinstance(exc, httpx.ConnectError)
        return out


TARGETS: dict[str, type[AssistantTarget] | type[PlannerTarget] | type[OpenAITarget]] = {
    "assistant": AssistantTarget, "planner": PlannerTarget, "openai": OpenAITarget}


# --- reporting ---------------------------------------------------------------------------

CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


def cpu_class(cpuinfo: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The CPU class a figure belongs to: ``grep -o -w -E 'avx512f|avx512_bf16|amx_bf16'
    /proc/cpuinfo | sort -u`` and ``ATEN_CPU_CAPABILITY`` (which caps it) when set."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    words = set(cpuinfo.split())
    env = dict(os.environ) if env is None else env
    out: dict[str, Any] = {"flags": sorted(f for f in CPU_FLAGS if f in words),
                           "cores": os.cpu_count()}
    if env.get("ATEN_CPU_CAPABILITY"):
        out["ATEN_CPU_CAPABILITY"] = env["ATEN_CPU_CAPABILITY"]
    return out


def format_row(row: dict[str, Any]) -> str:
    """One rate as a table line (ms; share as a percentage)."""
    def ms(v: float) -> str:
        return "-" if v != v else f"{v * 1000:.0f}"

    return (f"{row['offered_rate']:>6g} {row['achieved_rate']:>6.2f} {row['arrivals']:>5d} "
            f"{row['completed']:>5d} {ms(row['p50_s']):>6} {ms(row['p90_s']):>6} "
            f"{ms(row['p99_s']):>6} {row['share_within_slo'] * 100:>6.1f} "
            f"{row['goodput']:>7.2f} {row['refused']:>4d} {ms(row['refusal_p99_s']):>6} "
            f"{row['over_2x_slo']:>5d} {row['errors']:>4d} {ms(row['lag_p99_s']):>6} "
            f"{row.get('repeats', 0):>4d}")


TABLE_HEADER = ("  rate  got/s  arr  done  p50ms  p90ms  p99ms  in-SLO goodput  ref ref99  "
                ">2xSLO err lag99  rep")


ROOT = Path(__file__).resolve().parents[1]


DEFAULT_URLS = {"assistant": "localhost:8001", "planner": "localhost:8001",
                "openai": "http://localhost:9000"}
STACK_MODELS = ("rufus_llm", "rufus_qp_medusa", "rufus_assistant")  # make serve's


@contextlib.contextmanager
def fresh_stack(target: str, log_path: Path) -> Iterator[tuple[str, str]]:
    """A new stack for one rate (``--fresh-stack``): tritonserver with make serve's models on
    free ports (and the OpenAI frontend for the openai target), ready; yields the target's
    URL and the metrics URL of the admission it serves; stopped by pid after."""
    from rufus.launch.server import TritonServer, free_port
    from rufus.launch.stack import start_frontend, stop_process

    log_path.parent.mkdir(parents=True, exist_ok=True)
    srv = TritonServer(models=list(STACK_MODELS), grpc_port=free_port(),
                       http_port=free_port(), metrics_port=free_port(), log_path=log_path,
                       host="127.0.0.1")
    fe = None
    try:
        srv.start()
        took = srv.wait_ready()
        print(f"fresh stack ready in {took:.0f} s (gRPC :{srv.grpc_port}, log {log_path})",
              flush=True)
        grpc = f"127.0.0.1:{srv.grpc_port}"
        if target != "openai":
            yield grpc, f"http://127.0.0.1:{srv.metrics_port}/metrics"
            return
        from lab.bench_openai import wait_http

        port = free_port()
        fe = start_frontend(grpc, port, log_path=str(log_path))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/v1/models", fe, 120.0, "the OpenAI frontend")
        yield url, url + "/metrics"
    finally:
        if fe is not None:
            stop_process(fe, 5.0)
        srv.stop()


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=sorted(TARGETS), default="assistant")
    ap.add_argument("--url", default=None,
                    help="Triton gRPC host:port (assistant, planner; default localhost:8001) or "
                         "the OpenAI frontend's base URL (openai; default http://localhost:9000)")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1, 2, 3],
                    help="offered rates, requests/s, each run in turn")
    ap.add_argument("--duration", type=float, default=60.0, help="arrival window per rate (s)")
    ap.add_argument("--slo", type=float, default=None,
                    help="latency SLO in seconds (default: assistant 1.0, planner 0.3, openai 1.0)")
    ap.add_argument("--seed", type=int, default=0, help="arrivals and question order")
    ap.add_argument("--drain", type=float, default=DRAIN_S,
                    help="seconds in-flight requests may finish after the window; then late")
    ap.add_argument("--gap", type=float, default=2.0,
                    help="idle seconds before each rate (vLLM's CPU worker busy-polls 1 s)")
    ap.add_argument("--warmup", type=int, default=2, help="requests one at a time first, not counted")
    ap.add_argument("--min-share", type=float, default=0.99,
                    help="share within the SLO that counts as meeting it (capacity)")
    ap.add_argument("--questions", default=str(QUESTIONS_PATH),
                    help="JSONL of questions; its single-turn product questions are asked")
    ap.add_argument("--fresh-stack", action="store_true",
                    help="start a new stack for each rate (tritonserver with the three "
                         "models on free ports, and the OpenAI frontend for --target openai) "
                         "and stop it after: each rate meets a stack that has seen none of "
                         "its questions (--url is not used)")
    ap.add_argument("--metrics", default=None,
                    help="metrics URL of the admission, for the estimate's calibration "
                         "(default: tritonserver's http://<--url host>:8002/metrics; openai: "
                         "<--url>/metrics; --fresh-stack: its own)")
    ap.add_argument("--out", default=None, help="JSON results (default build/goodput-<target>.json)")
    a = ap.parse_args(argv)
    url = a.url or DEFAULT_URLS[a.target]
    out = Path(a.out or ROOT / "build" / f"goodput-{a.target}.json")
    target = TARGETS[a.target](url)
    slo = target.default_slo_s if a.slo is None else a.slo
    questions = load_questions(a.questions)
    cpu = cpu_class()
    where = "a fresh stack per rate" if a.fresh_stack else url
    print(f"target {a.target} ({where}): event {target.event!r}, SLO {slo * 1000:.0f} ms, "
          f"{len(questions)} questions, seed {a.seed}, {a.duration:g} s per rate", flush=True)
    print(f"cpu: {' '.join(cpu['flags']) or 'none of avx512f/avx512_bf16/amx_bf16'}"
          + (f", ATEN_CPU_CAPABILITY={cpu['ATEN_CPU_CAPABILITY']}"
             if "ATEN_CPU_CAPABILITY" in cpu else "")
          + f", {cpu['cores']} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    print(TABLE_HEADER + "  load", flush=True)

    def on_row(row: dict[str, Any]) -> None:
        row["load"] = os.getloadavg()[0]
        codes = ", ".join(f"{k} {v}" for k, v in row["error_codes"].items())
        # the other events (the product list of assistant and openai) after the columns
        events = [k.removesuffix("_p50_s") for k in row
                  if k.endswith("_p50_s") and not k.startswith("done")]
        others = "".join(f"  {e} p50/p99 {row[e + '_p50_s'] * 1000:.0f}/"
                         f"{row[e + '_p99_s'] * 1000:.0f}" for e in events)
        print(format_row(row) + f" {row['load']:>5.1f}" + others
              + (f"  ({codes})" if codes else "")
              + format_calibration(row.get("calibration")), flush=True)

    family = ESTIMATE_ERROR[a.target]

    def scraper(metrics_url: str) -> Callable[[], dict[str, Any] | None]:
        return lambda: scrape_histogram(metrics_url, family)

    def default_metrics(url: str) -> str:
        if a.target == "openai":
            return url.rstrip("/") + "/metrics"
        return f"http://{url.rsplit(':', 1)[0]}:8002/metrics"

    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    if a.fresh_stack:
        rows, raw = [], {}
        for i, rate in enumerate(a.rates):
            log = out.parent / f"goodput-stack-{i}-{rate:g}.log"
            with fresh_stack(a.target, log) as (fresh, metrics):
                r, x = asyncio.run(sweep(TARGETS[a.target](fresh), questions, [rate],
                                         a.duration, slo_s=slo, seed=a.seed, drain_s=a.drain,
                                         gap_s=a.gap, warmup=a.warmup, on_row=on_row,
                                         scrape=scraper(metrics)))
            rows += r
            raw.update({rate_key(raw, rate): v for v in x.values()})
    else:
        rows, raw = asyncio.run(sweep(target, questions, a.rates, a.duration, slo_s=slo,
                                         seed=a.seed, drain_s=a.drain, gap_s=a.gap,
                                         warmup=a.warmup, on_row=on_row,
                                         scrape=scraper(a.metrics or default_metrics(url))))
    cap = capacity_at_slo(rows, a.min_share)
    print(f"capacity at SLO ({slo * 1000:.0f} ms for >= {a.min_share:.0%} of arrivals): "
          + (f"{cap:g} req/s" if cap is not None else f"below the lowest rate ({min(a.rates):g} req/s)"),
          flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "target": a.target, "url": None if a.fresh_stack else url, "event": target.event, "slo_s": slo,
        "min_share": a.min_share, "capacity_at_slo": cap, "seed": a.seed,
        "duration_s": a.duration, "drain_s": a.drain, "rates": a.rates,
        "questions": a.questions, "n_questions": len(questions), "cpu": cpu,
        "fresh_stack_per_rate": a.fresh_stack,
        "started_utc": started, "ended_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "rows": [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                 for r in rows],
        "requests": {rate: [result_dict(x) for x in res] for rate, res in raw.items()},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", flush=True)
    return 0

