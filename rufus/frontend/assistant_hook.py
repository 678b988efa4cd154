"""Model ``rufus-assistant``: the shopping assistant pipeline (rufus/assistant/) as an OpenAI
chat model.

The last message is the question and the earlier user/assistant turns its history (system
messages are dropped: the pipeline has its own prompts; only the last 8 turns are kept, the
pipeline's bound). Product cards arrive twice: as markdown links at the start of the content
(any OpenAI client shows them) and whole in the extension field ``x_rufus_products`` of the
first chunk (non-streaming: of the response), with the plan in ``x_rufus_plan``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from rufus.assistant import Assistant
from rufus.assistant.pipeline import NullMetrics, turn_span, validate_request
from rufus.assistant.turn_events import DoneEvent, PlanEvent, ProductsEvent, TextEvent
from rufus.client import RequestFailed
from rufus.errors import InvalidInput, RufusError
from rufus.frontend.protocol import ParsedRequest, bad_request, openai_error
from rufus.frontend.targets import HookEvent, register
from rufus.serving.metrics import ADMISSION_ERROR_BUCKETS
from rufus.serving.validation import MAX_HISTORY_TURNS
from rufus.telemetry import tracing

MODEL_ID = "rufus-assistant"


def card_markdown(cards: list[dict[str, Any]]) -> str:
    """Numbered markdown links, one per card: ``1. [Title](url) - Brand, $12.99, 4.5 stars``."""
    lines = []
    for i, c in enumerate(cards, 1):
        facts = [str(c["brand"])] if c.get("brand") else []
        if c.get("price") is not None:
            facts.append(f"${float(c['price']):.2f}")
        if c.get("rating") is not None:
            facts.append(f"{float(c['rating']):.1f} stars")
        title = str(c.get("title", "")).replace("[", "(").replace("]", ")")
        line = f"{i}. [{title}]({c.get('url', '')})"
        lines.append(line + (" - " + ", ".join(facts) if facts else ""))
    return "\n".join(lines) + "\n\n" if lines else ""


def split_messages(messages: list[dict[str, str]]) -> tuple[str, list[dict[str, str]]]:
    turns = [m for m in messages if m["role"] != "system"]
    if not turns or turns[-1]["role"] != "user":
        raise bad_request("messages", "the last message must be the user's question")
    return turns[-1]["content"], turns[:-1][-MAX_HISTORY_TURNS:]


class AdmissionSeries(NullMetrics):
    """The frontend's own assistant admission, as the Triton model exports its own
    (rufus/serving/metrics.py AdmissionMetrics): the estimate a new turn would get and each
    admitted turn's error, so the OpenAI path's estimate can be calibrated too (the stage
    series are the Triton model's own: not counted twice here)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.estimate_gauge = Gauge(
            "rufus_openai_assistant_first_token_estimate_seconds",
            "The frontend's assistant admission: the first answer text a new turn would get "
            "now (refused above the SLO)", registry=registry)
        self.error = Histogram(
            "rufus_openai_assistant_first_token_estimate_error_seconds",
            "The frontend's assistant admission: estimate minus measured first answer text, "
            "per admitted turn", buckets=ADMISSION_ERROR_BUCKETS, registry=registry)

    def estimate(self, seconds: float) -> None:
        self.estimate_gauge.set(seconds)

    def estimate_error(self, seconds: float) -> None:
        self.error.observe(seconds)


class AssistantHook:
    owned_by = "rufus"

    def __init__(self, triton_url: str) -> None:
        self.triton_url = triton_url
        self._assistant: Assistant | None = None
        self._lock = asyncio.Lock()
        self.registry = CollectorRegistry()  # served at the frontend's /metrics
        self.series = AdmissionSeries(self.registry)

    async def assistant(self) -> Assistant:
        """Built once (opening the product index takes a while): at the frontend's start
        (:meth:`start`), so the first turn does not wait for it; else on first use."""
        async with self._lock:
            if self._assistant is None:
                from rufus.retrieval import default_retriever

                retriever = await asyncio.to_thread(default_retriever)
                self._assistant = Assistant(self.triton_url, retriever, metrics=self.series)
            return self._assistant

    async def start(self) -> None:
        """Build the assistant now, in the background of the frontend's start."""
        await self.assistant()

    async def chat(self, messages: list[dict[str, str]], parsed: ParsedRequest) -> AsyncIterator[HookEvent]:
        question, history = split_messages(messages)
        assistant = await self.assistant()
        turn = ticket = None
        try:
            if parsed.span is not None:  # traced: the admission becomes the turn's first span
                validate_request(question, history)  # a bad request is a 400 when overloaded
                t0 = time.monotonic()
                ticket = assistant.admit()  # a refusal: RufusError below (503 + Retry-After)
                turn = turn_span(f"{MODEL_ID} turn", parsed.span, MODEL_ID, len(history), t0,
                                 (t0, time.monotonic()), ticket)
            async with contextlib.aclosing(assistant.stream(question, history,
                                                            parsed.conversation, ticket=ticket,
                                                            span=turn)) as events:
                plan_info: dict[str, Any] = {}
                async for ev in events:
                    match ev:
                        case PlanEvent():
                            plan_info = {**ev.plan, "fallback": ev.fallback}
                        case ProductsEvent():
                            yield HookEvent(text=card_markdown(ev.products),
                                            extra={"x_rufus_products": ev.products,
                                                   "x_rufus_plan": plan_info})
                        case TextEvent():
                            yield HookEvent(text=ev.text)
                        case DoneEvent():
                            finish = "length" if ev.finish_reason == "length" else "stop"
                            # usage: the answer model's tokens (the cards and pick lines are
                            # rendered by the system, not generated: README, compatibility)
                            tracing.end(turn, **{"gen_ai.response.finish_reasons": [finish],
                                                 "rufus.path": ev.path})
                            turn = None
                            yield HookEvent(finish=finish, usage=(
                                int(ev.timings.get("answer_prompt_tokens", 0)),
                                int(ev.timings.get("answer_tokens", 0))))
        except BaseException as exc:
            tracing.end(turn, exc if isinstance(exc, Exception) else None)
            turn = None
            self._raise_openai(exc)
            raise
        finally:
            tracing.end(turn)

    @staticmethod
    def _raise_openai(exc: BaseException) -> None:
        """The pipeline's errors in OpenAI's terms (returns for anything else)."""
        if isinstance(exc, InvalidInput):
            name = exc.field.replace("question", "messages").replace("history", "messages")
            raise bad_request(name, exc.reason) from None
        if isinstance(exc, RequestFailed):
            raise openai_error(exc.error) from None
        if isinstance(exc, RufusError):  # the assistant's own refusal (admission): 503
            raise openai_error(exc) from None


def register_default() -> None:
    register(MODEL_ID, lambda settings: AssistantHook(settings.triton_url))
