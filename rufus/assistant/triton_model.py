"""rufus_assistant: the assistant pipeline as a decoupled Triton model (gRPC streaming).

Inputs ``question`` and optional ``history`` (JSON list of {role, content}; absent, ``[]`` or
``null`` mean no earlier turns), the planner's inputs with the planner's bounds
(:func:`rufus.serving.validation.read_conversation`). First response: ``plan`` (JSON),
``fallback`` and ``products`` (JSON cards); then one ``text_output`` delta per response; the
final response carries ``finish_reason`` and ``timings`` (JSON, seconds).

The request path is every model's (:class:`~rufus.serving.triton_backend.TritonModel`: the
IO table, the bounded parser, the error vocabulary, :class:`~rufus.serving.triton_backend.TritonSink`,
the shared :class:`~rufus.serving.cancel.CancelWatcher`). The pipeline runs on its own event
loop inside the stub and calls rufus_qp_medusa and rufus_llm on the *same* server over gRPC
(address from ``RUFUS_TRITON_GRPC_URL``, which rufus.launch.server sets): gRPC calls can be
cancelled, BLS requests cannot (Triton 2.51). A client that goes away cancels its task, which
cancels its gRPC streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rufus.assistant.answer import DropReason, PickRenderer, answer_grammar, reason_options
from rufus.assistant.pipeline import Assistant, NullMetrics, fallback_plan
from rufus.assistant.pipeline import turn_span as pipeline_turn_span
from rufus.assistant.prompt import LinkRenderer, answer_messages, cards
from rufus.assistant.settings import AssistantSettings
from rufus.assistant.turn_events import (
    DoneEvent,
    PlanEvent,
    ProductsEvent,
    TextEvent,
    TurnOutcome,
    TurnPath,
)
from rufus.client import RequestFailed
from rufus.errors import Cancelled, Internal, InvalidInput, RufusError, Unavailable, client_error
from rufus.serving.admission import SloAdmission, Ticket
from rufus.serving.cancel import CancelWatcher
from rufus.serving.metrics import AdmissionMetrics, MetricBuffer
from rufus.serving.sampling import request_parameters
from rufus.serving.triton_backend import TritonModel, TritonSink, pb_utils
from rufus.serving.validation import (
    DEFAULT_LIMITS,
    InputSpec,
    Limits,
    OutputSpec,
    decode_inputs,
    quote,
    read_conversation,
)
from rufus.telemetry import tracing

log = logging.getLogger("rufus.assistant.triton")

STAGE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]

# rufus_assistant's inputs and outputs, declared once (config auto-complete, decoding;
# tests/unit/test_inputs.py checks them against config.pbtxt).
ASSISTANT_INPUT_SPECS: tuple[InputSpec, ...] = (
    InputSpec("question", "TYPE_STRING"),
    InputSpec("history", "TYPE_STRING"),
)
ASSISTANT_OUTPUT_SPECS: tuple[OutputSpec, ...] = (
    OutputSpec("plan", "TYPE_STRING"),
    OutputSpec("fallback", "TYPE_BOOL"),
    OutputSpec("products", "TYPE_STRING"),
    OutputSpec("text_output", "TYPE_STRING"),
    OutputSpec("finish_reason", "TYPE_STRING"),
    OutputSpec("timings", "TYPE_STRING"),
)


@dataclass
class AssistantRequest:
    question: str
    history: list[dict[str, str]]
    conversation: str = ""  # the conversation key, passed on to the answer-model calls
    ticket: Ticket | None = None  # admitted on Triton's execute thread (AssistantModel.submit)
    trace: Any = None  # the trace this turn joins (tracing on only; rufus/telemetry/tracing.py)
    arrival: float = 0.0  # monotonic, when Triton handed it to the model
    admission_s: tuple[float, float] = (0.0, 0.0)  # monotonic, the admission's start and end


def parse_assistant_request(inputs: dict[str, np.ndarray | None],
                            limits: Limits = DEFAULT_LIMITS,
                            parameters: str | None = None) -> AssistantRequest:
    """Validate the tensors of one request; every error names the input field. The assistant
    takes no request parameters (the other models reject keys they do not know, so does it;
    HTTP ``generate`` turns unknown body keys into parameters)."""
    unknown = sorted(request_parameters(parameters, limits))
    if unknown:
        raise InvalidInput("parameters", f"unknown key(s) {quote(unknown, 120)}; "
                                         "rufus_assistant takes none (inputs: question, history)")
    question, history = read_conversation(decode_inputs(ASSISTANT_INPUT_SPECS, inputs, limits),
                                          limits)
    return AssistantRequest(question, history)


def _bytes(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


class TritonAssistantMetrics:
    """The assistant's metric families (``pb_utils``): stage latencies and outcomes."""

    def __init__(self, model: str, version: str, slo_s: float = 0.0) -> None:
        fam = pb_utils.MetricFamily
        self.labels = {"model": model, "version": version}
        self.stage_family = fam(name="rufus_assistant_stage_seconds",
                                description="Assistant stage latency: plan, retrieval, cards "
                                            "(time to first chunk), answer_ttft, first_token "
                                            "(time to first answer text), total",
                                kind=fam.HISTOGRAM)
        self.req_family = fam(name="rufus_assistant_requests_total",
                              description="Assistant requests by outcome and path",
                              kind=fam.COUNTER)
        self.drop_family = fam(name="rufus_assistant_reasons_dropped_total",
                               description="Answer reasons the output check withheld, by why "
                                           "(brand, product, colour, repeat, format): a model or "
                                           "prompt that starts to invent shows up here",
                               kind=fam.COUNTER)
        self.stages: dict[str, Any] = {}
        self.counters: dict[tuple[str, str], Any] = {}
        self.drops: dict[str, Any] = {}
        self.admission = AdmissionMetrics(pb_utils, "rufus_assistant_first_token",
                                          "first answer text", self.labels, slo_s)

    def observe(self, stage: str, seconds: float) -> None:
        if stage not in self.stages:
            self.stages[stage] = self.stage_family.Metric(
                labels={**self.labels, "stage": stage}, buckets=STAGE_BUCKETS)
        self.stages[stage].observe(seconds)

    def count(self, outcome: TurnOutcome, path: TurnPath) -> None:
        key = (outcome, path)
        if key not in self.counters:
            self.counters[key] = self.req_family.Metric(
                labels={**self.labels, "outcome": outcome, "path": path})
        self.counters[key].increment(1)

    def dropped(self, kind: DropReason) -> None:
        if kind not in self.drops:
            self.drops[kind] = self.drop_family.Metric(labels={**self.labels, "why": kind})
        self.drops[kind].increment(1)

    def estimate(self, seconds: float) -> None:
        self.admission.estimate(seconds)

    def estimate_error(self, seconds: float) -> None:
        self.admission.estimate_error(seconds)

    def close(self) -> None:
        # metrics, then families, while the stub's shared memory exists (a MetricFamily
        # destroyed at interpreter shutdown segfaults the 2.51 stub; rufus.serving.metrics)
        self.stages.clear()
        self.counters.clear()
        self.drops.clear()
        self.admission.close()
        self.stage_family = self.req_family = self.drop_family = None
        import gc

        gc.collect()


class BufferedAssistantMetrics:
    """The pipeline's metrics interface, kept off its event loop (each update is IPC)."""

    def __init__(self, inner: TritonAssistantMetrics) -> None:
        self.buffer = MetricBuffer(inner, name="assistant-metrics")

    def observe(self, stage: str, seconds: float) -> None:
        self.buffer.event("observe", stage, seconds)

    def count(self, outcome: TurnOutcome, path: TurnPath) -> None:
        self.buffer.event("count", outcome, path)

    def dropped(self, kind: DropReason) -> None:
        self.buffer.event("dropped", kind)

    def estimate(self, seconds: float) -> None:
        self.buffer.gauge("estimate", seconds)

    def estimate_error(self, seconds: float) -> None:
        self.buffer.event("estimate_error", seconds)

    def close(self) -> None:
        self.buffer.close()


WARMUP_TURNS = [
    ("running shoes under $80", []),
    ("any in blue?", [{"role": "user", "content": "I need running shoes"},
                      {"role": "assistant", "content": "Here are some running shoes."}]),
]


def warm_up(assistant: Assistant) -> None:
    """Before the model reports ready: the pipeline's own work once per path (search with
    filters, diversification, cards, the answer prompt and link rendering), so the index's
    pages and every lazily built piece are in place. The planner and the answer model are
    warm by their own readiness (each warms up before it reports ready); the assistant cannot
    call them here: tritonserver opens its gRPC port only after every model has loaded."""
    t0 = time.monotonic()
    for question, history in WARMUP_TURNS:
        plan = fallback_plan(question)
        products = assistant._retrieve(plan, question, history).products
        cards(products)
        answer_messages(question, products, history)
        options = reason_options(products, question)
        answer_grammar(options)
        PickRenderer(products, assistant.names, options).feed(f"[1] {options[0][0]}\n[2")
        LinkRenderer(products).feed("see [1] and [2]")
    log.info("rufus_assistant: pipeline warmed up in %.2f s", time.monotonic() - t0)


def turn_span(model: str, req: AssistantRequest) -> Any:
    """One assistant turn's span (from its arrival at the model), with its admission as the
    first child: the estimate and the queue it was made from."""
    if req.ticket is None or not req.admission_s[0]:  # not admitted by submit(): no child
        return tracing.start_span(f"{model} turn", req.trace, "server", {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "rufus.history_turns": len(req.history)},
            start_ns=tracing.mono_to_ns(req.arrival or time.monotonic()))
    return pipeline_turn_span(f"{model} turn", req.trace, model, len(req.history),
                              req.arrival or req.admission_s[0], req.admission_s, req.ticket,
                              kind="server")


class AssistantModel(TritonModel):
    """``TritonPythonModel`` for rufus_assistant (model_repository/rufus_assistant)."""

    INPUT_SPECS = ASSISTANT_INPUT_SPECS
    OUTPUT_SPECS = ASSISTANT_OUTPUT_SPECS
    SETTINGS = AssistantSettings
    settings: AssistantSettings

    def start(self) -> None:
        from rufus.retrieval import default_retriever, index_path

        s = self.settings  # config.pbtxt + environment, typed (rufus/assistant/settings.py)
        url = s.triton_grpc_url
        self.limits = s.limits
        self.metrics: BufferedAssistantMetrics | NullMetrics = NullMetrics()
        if pb_utils is not None and s.report_custom_metrics:
            self.metrics = BufferedAssistantMetrics(
                TritonAssistantMetrics(self.name, self.version,
                                       slo_s=s.pipeline.admission.slo_s))
        t = time.monotonic()
        retriever = default_retriever()
        log.info("rufus_assistant: %d products (%s, index %s) in %.2f s; models via gRPC at %s",
                 len(retriever), retriever.name, index_path(), time.monotonic() - t, url)
        self.assistant = Assistant(
            url, retriever, metrics=self.metrics, planner_model=s.planner_model,
            answer_model=s.answer_model, k=s.num_products, answer_products=s.answer_products,
            max_tokens=s.answer_max_tokens, plan_timeout_s=s.pipeline.plan_timeout_s,
            prewarm=s.pipeline.prewarm, admission=SloAdmission(s.pipeline.admission))
        t = time.monotonic()
        vocabulary = self.assistant.search.vocabulary  # built here, not on the first request
        log.info("rufus_assistant: catalog vocabulary (%d words, %d brands) in %.2f s",
                 len(vocabulary.freq), len(vocabulary.brands), time.monotonic() - t)
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="assistant-loop",
                                            daemon=True)
        self.loop_thread.start()
        self.watcher = CancelWatcher()
        self.tasks: set[asyncio.Task[None]] = set()
        if self.warmup_enabled():
            warm_up(self.assistant)

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None
              ) -> AssistantRequest:
        return parse_assistant_request(inputs, self.limits, parameters)

    def with_conversation(self, parsed: AssistantRequest, key: str) -> AssistantRequest:
        return replace(parsed, conversation=key)

    def submit(self, parsed: AssistantRequest, sink: TritonSink, arrival: float) -> None:
        # Admission here, on Triton's execute thread: a refusal is sent at once, not after
        # the pipeline's event loop (busy streaming answers under load) gets to the request.
        # Unavailable propagates to TritonModel.execute, which sends it as the one response.
        t_admit = time.monotonic()
        ticket = self.assistant.admission.admit()  # refused: counted by count_refused
        try:
            self.loop.call_soon_threadsafe(self._start, replace(
                parsed, ticket=ticket, arrival=arrival,
                admission_s=(t_admit, time.monotonic())), sink)
        except BaseException:
            ticket.done()
            raise

    def count_refused(self, err: RufusError) -> None:
        self.metrics.count(err.outcome, "none")

    # Below runs on the pipeline's loop, like the watcher's polls and every send.
    def _start(self, req: AssistantRequest, sink: TritonSink) -> None:
        task = self.loop.create_task(self._serve(req, sink))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if req.ticket is not None:  # returned however the task ends, even before it ran
            ticket = req.ticket
            task.add_done_callback(lambda _t: ticket.done())
        self.watcher.watch(task, sink, task.cancel)

    async def _serve(self, req: AssistantRequest, sink: TritonSink) -> None:
        first: dict[str, np.ndarray] = {}
        key = asyncio.current_task()
        span = turn_span(self.name, req) if tracing.enabled() else None
        token = tracing.attach(span)  # the turn's log lines carry its trace id
        out: Any = None  # the stream to the client, from its first response
        chunks = 0
        error: RufusError | None = None
        try:
            async with contextlib.aclosing(self.assistant.stream(
                    req.question, req.history, req.conversation or None,
                    ticket=req.ticket, span=span)) as events:
                async for ev in events:
                    match ev:
                        case PlanEvent():
                            first["plan"] = _bytes(json.dumps(ev.plan))
                            first["fallback"] = np.array([ev.fallback], dtype=bool)
                        case ProductsEvent():
                            first["products"] = _bytes(json.dumps(ev.products))
                            out = (tracing.start_span("stream to client", span)
                                   if span is not None else None)
                            sink.send(first, None, False)
                            chunks += 1
                        case TextEvent():
                            sink.send({"text_output": _bytes(ev.text)}, None, False)
                            chunks += 1
                        case DoneEvent():
                            self.watcher.forget(key)
                            sink.send({"text_output": _bytes(""),
                                       "finish_reason": _bytes(ev.finish_reason),
                                       "timings": _bytes(json.dumps(ev.timings))}, None, True)
                            chunks += 1
                            tracing.end(span, **{"gen_ai.response.finish_reasons":
                                                 [ev.finish_reason], "rufus.path": ev.path,
                                                 "rufus.first_text_s": ev.timings.get(
                                                     "first_token_s")})
                            span = None
        except asyncio.CancelledError:
            error = Cancelled("request was cancelled")
            sink.send(None, error, True)
        except Exception as exc:  # noqa: BLE001 - every failure gets a client error
            error = self._error(exc)
            sink.send(None, error, True)
        finally:
            self.watcher.forget(key)
            tracing.end(out, error, **{"rufus.chunks": chunks})
            tracing.end(span, error)
            tracing.detach(token)

    def _error(self, exc: Exception) -> RufusError:
        """An answer-model failure is the upstream's class of error (UNAVAILABLE: retry
        elsewhere; anything else INTERNAL), saying which model failed."""
        if isinstance(exc, RequestFailed):
            log.warning("assistant request failed upstream: %s", exc)
            if exc.error.retryable:
                return Unavailable(f"answer model failed: {exc}")
            return Internal(f"answer model failed: {exc.error.message}")
        return client_error(exc, log, "assistant request")

    def finalize(self) -> None:
        def cancel_all() -> None:
            for task in list(self.tasks):
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.assistant.aclose(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(5)
        close = getattr(self.metrics, "close", None)
        if close is not None:
            close()
