"""The answer model's part of an assistant turn: its request (messages, sampling, the answer
grammar), its span, and its stream rendered into ``text`` events (:class:`TextEvent`).

Apart from the pipeline (rufus/assistant/pipeline.py), which decides whether and over what
the model answers: this is one model request, start to end. It reads the assistant through
:class:`AnswerSide` at the moment each setting is needed (a search may have swapped in the
catalog's names; a test may stand in its own ``streams``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

import numpy as np

from rufus.assistant.answer import (
    MAX_PICKS,
    REPETITION_PENALTY,
    CatalogNames,
    PickRenderer,
    answer_grammar,
    reason_options,
)
from rufus.assistant.prompt import LinkRenderer, answer_messages
from rufus.assistant.turn_events import AssistantMetrics, RenderEnd, ReplyEnd, TextEvent, child
from rufus.client import AsyncStreams, output_str
from rufus.retrieval.catalog import Product
from rufus.serving.admission import Ticket
from rufus.telemetry import tracing

# The general (off-topic) answer: one or two sentences (SYSTEM_GENERAL), bounded.
GENERAL_MAX_TOKENS = 64


class AnswerSide(Protocol):
    """What of the assistant the answer request reads (the Assistant has each)."""

    answer_model: str
    answer_products: int
    max_tokens: int
    names: CatalogNames
    metrics: AssistantMetrics

    def streams(self) -> AsyncStreams: ...


async def answer(side: AnswerSide, question: str, products: list[Product],
                 turns: list[dict[str, str]], general: bool, t0: float,
                 timings: dict[str, float], conversation: str | None = None,
                 notes: Sequence[str] = (), ticket: Ticket | None = None,
                 menus: list[list[str]] | None = None, max_picks: int = MAX_PICKS,
                 met: dict[str, str] | None = None,
                 span: Any = None) -> AsyncGenerator[TextEvent | ReplyEnd, None]:
    """The answer model's stream, rendered. With products: picks under the answer
    grammar (rufus.assistant.answer), every fact rendered from the cards, the search's
    notes ahead of the first pick. Off-topic: the model's short reply, links removed.
    Ends with a :class:`ReplyEnd` carrying the finish reason."""
    products = products[:side.answer_products]  # [n] links only to what the model saw
    sampling: dict[str, Any] = {"max_tokens": side.max_tokens, "temperature": 0.0,
                                "repetition_penalty": REPETITION_PENALTY}
    renderer: PickRenderer | LinkRenderer
    if general:
        renderer = LinkRenderer(products)
        sampling["max_tokens"] = min(side.max_tokens, GENERAL_MAX_TOKENS)
    else:
        options = reason_options(products, question) if menus is None else menus
        renderer = PickRenderer(products, side.names, options, on_drop=side.metrics.dropped,
                                met=met)
        sampling["structured_outputs"] = {"grammar": answer_grammar(options, max_picks)}
    tensors = {
        "messages": answer_messages(question, products, turns, general=general, menus=menus),
        "stream": True, "exclude_input_in_output": True, "return_finish_reason": True,
        "return_num_output_tokens": True, "return_num_input_tokens": True,
        "sampling_parameters": sampling,
    }
    lead = "".join(f"{n}\n" for n in notes) + ("\n" if notes else "")
    sent = time.monotonic()
    finish = ""
    an = child(span, "answer", **{"gen_ai.request.model": side.answer_model,
                                  "gen_ai.operation.name": "chat",
                                  "rufus.answer.general": general})
    render_s = 0.0
    try:
        # aclosing: closing this generator closes the answer model's stream at once
        async with contextlib.aclosing(_rendered(
                side, an, tensors, conversation, renderer, lead, timings, t0, sent,
                ticket)) as inner:
            async for ev in inner:
                match ev:
                    case RenderEnd():
                        render_s, finish = ev.seconds, ev.finish_reason
                    case TextEvent():
                        yield ev
    except BaseException as exc:
        tracing.end(an, exc if not isinstance(exc, GeneratorExit) else None,
                    **{"rufus.cancelled": isinstance(exc, GeneratorExit
                                                     | asyncio.CancelledError) or None})
        raise
    tokens = int(timings.get("answer_tokens", 0))
    tracing.end(an, **{"gen_ai.usage.input_tokens": int(timings.get("answer_prompt_tokens", 0))
                       or None, "gen_ai.usage.output_tokens": tokens,
                       "gen_ai.response.finish_reasons": [finish or "stop"],
                       "rufus.render_ms": round(render_s * 1e3, 3)})
    yield ReplyEnd(finish or "stop")


async def _rendered(side: AnswerSide, an: Any, tensors: dict[str, Any], conversation: str | None,
                    renderer: PickRenderer | LinkRenderer, lead: str,
                    timings: dict[str, Any], t0: float, sent: float,
                    ticket: Ticket | None) -> AsyncGenerator[TextEvent | RenderEnd, None]:
    """The answer model's stream through the renderer (``an``: the answer's span, which
    the request to the answer model joins). Ends with a :class:`RenderEnd`: the seconds
    spent rendering, and the answer model's finish reason."""
    finish = ""
    tokens = 0
    render_s = 0.0
    async with contextlib.aclosing(side.streams().stream(
            side.answer_model, tensors, conversation=conversation,
            trace=tracing.headers(an))) as s:
        async for outs in s:
            delta = output_str(outs, "text_output")
            finish = output_str(outs, "finish_reason") or finish
            if "num_output_tokens" in outs:
                tokens += int(np.asarray(outs["num_output_tokens"]).reshape(-1).sum())
            if "num_input_tokens" in outs:
                timings["answer_prompt_tokens"] = float(
                    np.asarray(outs["num_input_tokens"]).reshape(-1)[0])
            if delta and "answer_ttft_s" not in timings:
                timings["answer_ttft_s"] = time.monotonic() - sent
                if an is not None:
                    an.add_event("first_token")
            r0 = time.perf_counter()
            text = renderer.feed(delta)
            render_s += time.perf_counter() - r0
            if text:
                timings.setdefault("first_token_s", time.monotonic() - t0)
                if ticket is not None:
                    ticket.first_token()  # what the admission estimate learns from
                yield TextEvent(lead + text)
                lead = ""
    tail = renderer.flush()
    if tail or lead:
        timings.setdefault("first_token_s", time.monotonic() - t0)
        yield TextEvent(lead + tail)
    timings["answer_tokens"] = float(tokens)
    yield RenderEnd(finish, render_s)
