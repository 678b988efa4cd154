"""What one assistant turn gives out, apart from the pipeline that makes it: its events (to the
caller: one class each, :data:`AssistantEvent` their union), its outcome and stage seconds
(to a metrics sink) and its spans (to the tracer).

Here so that the pipeline (rufus/assistant/pipeline.py) and the answer model's stream
(rufus/assistant/answer_stream.py) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from rufus.assistant.answer import DropReason
from rufus.errors import Outcome
from rufus.qp.plan import Plan
from rufus.retrieval.search import SearchOutcome
from rufus.serving.admission import Ticket
from rufus.telemetry import tracing

# The turn's path, as chosen (the ``path`` label of its metrics): "none" until it is chosen
# (a turn refused or failing before that), then products (a search's, or the ones an earlier
# answer listed), service (a fixed reply) or general (off-topic: the model's short answer).
TurnPath = Literal["none", "products", "service", "general"]
# How a turn ended (the ``outcome`` label): its own (ok; fallback: answered over the
# fallback plan) or an error's (rufus.errors: invalid, unavailable, cancelled, ...).
TurnOutcome = Literal["ok", "fallback"] | Outcome

# Each event class's ``type``, a class constant (``ev.type == "text"`` reads as before).
EventType = Literal["plan", "products", "text", "done"]


@dataclass(frozen=True)
class PlanEvent:
    """First: the planner's plan, and whether it is the fallback plan (and why)."""

    type: ClassVar[Literal["plan"]] = "plan"
    plan: Plan
    fallback: bool = False
    fallback_reason: str = ""


@dataclass(frozen=True)
class ProductsEvent:
    """Second: the product cards (id, title, brand, price, rating, url, image_url; none for
    a path that needs no search) and the path the turn took."""

    type: ClassVar[Literal["products"]] = "products"
    products: list[dict[str, Any]]
    path: TurnPath


@dataclass(frozen=True)
class TextEvent:
    """An answer delta, links already rendered."""

    type: ClassVar[Literal["text"]] = "text"
    text: str


@dataclass(frozen=True)
class DoneEvent:
    """Last: the finish reason (stop | length | the model's own; service: system-written),
    the stage seconds (``*_s``) and the answer model's usage (``answer_tokens``,
    ``answer_prompt_tokens``), and the path the turn took."""

    type: ClassVar[Literal["done"]] = "done"
    finish_reason: str
    timings: dict[str, float] = field(default_factory=dict)
    path: TurnPath = "none"


# What a turn gives its caller, always in this order: one plan, one products, any number
# of text, one done. Switch on the class (``match ev: case PlanEvent(): ...``).
AssistantEvent = PlanEvent | ProductsEvent | TextEvent | DoneEvent


@dataclass(frozen=True)
class ReplyEnd:
    """Internal to the pipeline: the end of a reply's text (a card answer, a system-written
    reply, the answer model's), with its finish reason; the turn's ``done`` is made from it."""

    finish_reason: str


@dataclass(frozen=True)
class RenderEnd:
    """Internal to the answer stream: the end of the model's rendered stream, with the
    model's finish reason and the seconds spent rendering."""

    finish_reason: str
    seconds: float


class AssistantMetrics(Protocol):
    def observe(self, stage: str, seconds: float) -> None: ...
    def count(self, outcome: TurnOutcome, path: TurnPath) -> None: ...
    def dropped(self, kind: DropReason) -> None: ...
    def estimate(self, seconds: float) -> None: ...
    def estimate_error(self, seconds: float) -> None: ...


class NullMetrics:
    def observe(self, stage: str, seconds: float) -> None:
        pass

    def count(self, outcome: TurnOutcome, path: TurnPath) -> None:
        pass

    def dropped(self, kind: DropReason) -> None:
        pass

    def estimate(self, seconds: float) -> None:
        pass

    def estimate_error(self, seconds: float) -> None:
        pass


def child(span: Any, name: str, **attributes: Any) -> Any:
    """A child span of the turn's span, None without one (tracing off: nothing is made)."""
    if span is None:
        return None
    return tracing.start_span(name, span, attributes=attributes)


def turn_span(name: str, parent: Any, model: str, history_turns: int, arrival: float,
              admitted: tuple[float, float], ticket: Ticket, kind: str = "internal") -> Any:
    """One assistant turn's span (from ``arrival``, monotonic) with its admission as the first
    child: the estimate and the queue it was made from (``admitted``: its start and end).
    The Triton model's and the OpenAI frontend's turns are made here alike."""
    span = tracing.start_span(name, parent, kind, {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "rufus.history_turns": history_turns}, start_ns=tracing.mono_to_ns(arrival))
    tracing.child_span(span, "admission", tracing.mono_to_ns(admitted[0]),
                       tracing.mono_to_ns(admitted[1]),
                       **{"rufus.admission.estimate_s": round(ticket.estimate_s, 4),
                          "rufus.admission.waiting": int(ticket.x[1]),
                          "rufus.admission.answering": int(ticket.x[2]),
                          "rufus.admission.decision": "admitted"})
    return span


def search_attributes(found: SearchOutcome) -> dict[str, Any]:
    """What retrieval did, without customer text: counts, filter and product-type names."""
    f = found.filters
    applied = [k for k, v in (("brand", f.brand), ("max_price", f.max_price),
                              ("min_price", f.min_price), ("categories", f.categories),
                              ("models", f.models)) if v]
    return {"rufus.search.queries": len(found.queries),
            "rufus.search.hits": len(found.products),
            "rufus.search.filters": applied,
            "rufus.search.relaxed": list(found.relaxed),
            "rufus.search.corrected": len(found.corrected),
            "rufus.search.categories": list(found.categories)[:8],
            "rufus.search.constraints_met": len(found.constraints),
            "rufus.search.constraints_dropped": len(found.dropped)}
