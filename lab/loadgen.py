"""Closed-loop streaming load generator, for Triton (gRPC) and for vLLM in-process.

Both targets run the same workload and are measured the same way (TTFT from submit to the
first non-empty chunk, inter-token latency as the gap between chunks spread over the
tokens they carry), so their ratios compare the serving paths and nothing else.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

SHOPPING_PROMPTS = [
    "What should I pack for a beach trip?",
    "Which running shoes are good for flat feet?",
    "Compare a French press and a pour-over coffee maker.",
    "I need a gift for a ten-year-old who likes science.",
    "What is the difference between OLED and QLED TVs?",
    "Suggest a tent for two people for summer camping.",
    "How do I choose a good office chair?",
    "What are the best budget noise-cancelling headphones?",
    "Is a robot vacuum worth it for a small apartment?",
    "What should I look for in a kitchen knife set?",
    "Recommend a waterproof jacket for hiking in the rain.",
    "Which protein powder is good for beginners?",
    "What size backpack do I need for a weekend trip?",
    "How do I pick a mattress for back pain?",
    "What toys are safe for a one-year-old?",
    "Which laptop is good for a college student?",
]

# (token count, arrival time) per chunk
Stream = Callable[[str, int], AsyncIterator[tuple[int, float]]]


@dataclass
class RequestStats:
    start: float
    ttft: float = float("nan")
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


# summarize() keys and their table labels, for every benchmark script's tables
SUMMARY_KEYS = [("output_tok_s", "output tok/s"), ("req_s", "req/s"),
                ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
                ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def pct_nearest(values: list[float], q: float) -> float:
    """Nearest-rank percentile, NaNs ignored (nan when nothing is left): the convention of
    the planner, assistant and retrieval benchmarks (``pct`` above interpolates)."""
    xs = sorted(x for x in values if x == x)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarize(stats: list[RequestStats], wall: float) -> dict[str, float]:
    ok = [s for s in stats if not s.error]
    ttfts = [s.ttft for s in ok]
    itls = [x for s in ok for x in s.itls]
    tokens = sum(s.tokens for s in ok)
    return {
        "requests": len(ok),
        "errors": len(stats) - len(ok),
        "wall_s": wall,
        "output_tok_s": tokens / wall if wall else 0.0,
        "req_s": len(ok) / wall if wall else 0.0,
        "ttft_p50_ms": pct(ttfts, 0.5) * 1000,
        "ttft_p99_ms": pct(ttfts, 0.99) * 1000,
        "itl_p50_ms": pct(itls, 0.5) * 1000,
        "itl_p99_ms": pct(itls, 0.99) * 1000,
        "mean_tokens": statistics.fmean([s.tokens for s in ok]) if ok else 0.0,
    }


async def closed_loop(stream: Stream, prompts: list[str], concurrency: int, requests: int,
                      max_tokens: int, progress: bool = True) -> dict[str, float]:
    """``concurrency`` workers each send their next request as soon as the last one ends."""
    stats: list[RequestStats] = []
    counter = iter(range(requests))
    t0 = time.monotonic()
    finished = 0

    async def worker() -> None:
        nonlocal finished
        for i in counter:
            s = RequestStats(start=time.monotonic())
            stats.append(s)
            last = s.start
            try:
                async for n, t in stream(prompts[i % len(prompts)], max_tokens):
                    if n == 0:
                        continue
                    if s.tokens == 0:
                        s.ttft = t - s.start
                    else:
                        s.itls.extend([(t - last) / n] * n)
                    s.tokens += n
                    last = t
            except Exception as exc:  # noqa: BLE001 - counted, reported
                s.error = f"{type(exc).__name__}: {exc}"
            finished += 1  # counted at the end: len(stats) counts started requests
            if progress and finished % max(requests // 4, 1) == 0:
                print(f"  .. {finished}/{requests} requests", file=sys.stderr, flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out = summarize(stats, time.monotonic() - t0)
    errs = [s.error for s in stats if s.error]
    if errs:
        print(f"  !! {len(errs)} errors, first: {errs[0]}", file=sys.stderr)
    return out


def triton_stream(url: str, model: str, chat: bool = True) -> Stream:
    """Through Triton. ``chat``: send ``messages`` (rendered server-side); otherwise send
    the prompt as ``text_input`` unchanged (any official-vLLM-backend model accepts it)."""
    from rufus.client import agenerate

    async def stream(prompt: str, max_tokens: int) -> AsyncIterator[tuple[int, float]]:
        sampling = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        kw: dict[str, Any] = (
            {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        async for chunk in agenerate(url, model, stream=True, sampling=sampling,
                                     flags={"return_num_output_tokens": True}, **kw):
            yield int(chunk.outputs["num_output_tokens"][0]), chunk.t

    return stream


def vllm_stream(engine: Any, tokenizer: Any, chat: bool = True) -> Stream:
    """vLLM's AsyncLLM in this process: the baseline without Triton."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    ids = iter(range(10**9))

    async def stream(prompt: str, max_tokens: int) -> AsyncIterator[tuple[int, float]]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False
                                             ) if chat else prompt
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        async for out in engine.generate(text, params, f"bench-{next(ids)}"):
            yield sum(len(c.token_ids) for c in out.outputs), time.monotonic()

    return stream


def render_chat(tokenizer: Any, prompts: list[str]) -> list[str]:
    """Chat-template the prompts once, so every target receives the identical text."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                          add_generation_prompt=True, tokenize=False)
            for p in prompts]


async def run_workload(stream: Stream, concurrency: int, requests: int | None = None,
                       max_tokens: int = 64, prompts: list[str] | None = None,
                       warmup: int = 2) -> dict[str, float]:
    """Warm up, then measure one closed-loop run."""
    prompts = prompts or SHOPPING_PROMPTS
    requests = requests or max(4 * concurrency, 8)
    await closed_loop(stream, prompts, min(concurrency, warmup), warmup, 8, progress=False)
    return await closed_loop(stream, prompts, concurrency, requests, max_tokens)
