"""Ask the shopping assistant from a terminal (scripts/assistant.py): product cards first,
then the streamed answer, through the Triton model ``rufus_assistant`` or, with
``--local``, the pipeline in this process against the same server's models."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from rufus.client import RequestFailed, default_url
from rufus.env import exits_on_env_error
from rufus.errors import InvalidInput


def print_cards(cards: list[dict[str, Any]], plan: Mapping[str, Any], fallback: bool) -> None:
    err = sys.stderr
    print(f"[plan{' (fallback)' if fallback else ''}] {json.dumps(plan)}", file=err)
    for i, c in enumerate(cards, start=1):
        print(f"  {i}. {c['title']} | {c['brand']} | ${c['price']:.2f} | {c['rating']:.1f}*\n"
              f"     {c['url']}\n     {c['image_url']}")
    if not cards:
        print("  (no product cards)")
    print(flush=True)


async def via_triton(url: str, question: str, history: list[dict[str, str]] | None) -> dict:
    from rufus.client import AsyncStreams, output_str

    io = AsyncStreams(url)
    timings: dict = {}
    try:
        tensors: dict[str, Any] = {"question": question}
        if history:
            tensors["history"] = history
        async with contextlib.aclosing(io.stream("rufus_assistant", tensors)) as s:
            async for outs in s:
                if "products" in outs:
                    print_cards(json.loads(output_str(outs, "products")),
                                json.loads(output_str(outs, "plan")),
                                bool(outs["fallback"].reshape(-1)[0]))
                sys.stdout.write(output_str(outs, "text_output"))
                sys.stdout.flush()
                if "timings" in outs:
                    timings = json.loads(output_str(outs, "timings"))
    finally:
        await io.close()
    return timings


async def local(url: str, question: str, history: list[dict[str, str]] | None) -> dict:
    from rufus.assistant import Assistant
    from rufus.assistant.turn_events import DoneEvent, PlanEvent, ProductsEvent, TextEvent
    from rufus.retrieval import default_retriever

    a = Assistant(url, default_retriever())
    plan: Mapping[str, Any] = {}
    fallback = False
    timings: dict = {}
    try:
        async with contextlib.aclosing(a.stream(question, history)) as events:
            async for ev in events:
                match ev:
                    case PlanEvent():
                        plan, fallback = ev.plan, ev.fallback
                    case ProductsEvent():
                        print_cards(ev.products, plan, fallback)
                    case TextEvent():
                        sys.stdout.write(ev.text)
                        sys.stdout.flush()
                    case DoneEvent():
                        timings = ev.timings
    finally:
        await a.aclose()
    return timings


@exits_on_env_error
def _timing(key: str, value: float) -> str:
    """A timing as a person reads it: seconds (``*_s``) in ms, counts (tokens) as counts."""
    if key.endswith("_s"):
        return f"{key.removesuffix('_s')} {value * 1000:.0f} ms"
    return f"{key} {value:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Ask the shopping assistant (cards, then the answer)")
    ap.add_argument("question")
    ap.add_argument("--history", help="previous turns as JSON: [{role, content}, ...]")
    ap.add_argument("--url", default=None, help="Triton gRPC address (default localhost:$GRPC_PORT)")
    ap.add_argument("--local", action="store_true", help="run the pipeline in this process")
    a = ap.parse_args(argv)
    history = json.loads(a.history) if a.history else None
    t0 = time.monotonic()
    try:
        timings = asyncio.run((local if a.local else via_triton)(a.url or default_url(), a.question,
                                                                 history))
    except RequestFailed as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    except (InvalidInput, OSError) as exc:  # bad input (--local), connection errors
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    parts = ", ".join(_timing(k, v) for k, v in timings.items())
    print(f"\n[{parts}; client total {(time.monotonic() - t0) * 1000:.0f} ms]", file=sys.stderr)
    return 0

