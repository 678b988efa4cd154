"""What one assistant turn gives out, apart from the pipeline that makes it: its events (to the
caller), its outcome and stage seconds (to a metrics sink) and its spans (to the tracer).

Here so that the pipeline (rufus/assistant/pipeline.py) and the answer model's stream
(rufus/assistant/answer_stream.py) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rufus.retrieval.grounding import SearchOutcome
from rufus.serving.admission import Ticket
from rufus.telemetry import tracing

EventType = Literal["plan", "products", "text", "done", "render"]


@dataclass(frozen=True)
class AssistantEvent:
    type: EventType
    plan: dict[str, Any] | None = None           # plan
    fallback: bool = False                       # plan
    fallback_reason: str = ""                    # plan
    products: list[dict[str, Any]] | None = None  # products: id, title, brand, price, rating, url, image_url
    text: str = ""                               # text
    finish_reason: str = ""                      # done: stop | length | service (system-written)
    # done: seconds (*_s); answer_tokens, answer_prompt_tokens (the answer model's usage)
    timings: dict[str, float] = field(default_factory=dict)
    path: str = ""                               # products, done: products | service | general
    seconds: float = 0.0                         # render (internal to the pipeline)


class AssistantMetrics(Protocol):
    def observe(self, stage: str, seconds: float) -> None: ...
    def count(self, outcome: str, path: str) -> None: ...
    def dropped(self, kind: str) -> None: ...
    def estimate(self, seconds: float) -> None: ...
    def estimate_error(self, seconds: float) -> None: ...


class NullMetrics:
    def observe(self, stage: str, seconds: float) -> None:
        pass

    def count(self, outcome: str, path: str) -> None:
        pass

    def dropped(self, kind: str) -> None:
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
