"""OpenTelemetry traces: one setting turns them on, every process names itself.

Off by default, and then every call here is a cheap no-op (no SDK import, no span objects):
the hot paths call :func:`start_span` and get ``None``. On with the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); the protocol is
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the specification's default, or ``grpc``)
and the sampling ratio ``OTEL_TRACES_SAMPLER_ARG`` (0..1, default 1), applied where a trace
starts: a request that arrives with a W3C ``traceparent`` follows its sampled flag
(parent-based sampling), so one turn is traced across every process or not at all.
``OTEL_SDK_DISABLED=true`` keeps it off whatever else is set.

No prompt or customer text goes into a span unless the operator sets
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (the GenAI conventions' switch).
Span attributes follow OpenTelemetry's GenAI semantic conventions where they apply; errors
carry the error vocabulary's code (:mod:`rufus.errors`) as ``error.type``.

Log lines written while a span is current end with ``trace_id=<32 hex>`` (installed by
:func:`setup` on the root logger's handlers), so a log line leads to its trace.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rufus.env import environ
from rufus.serving.settings import env_var

log = logging.getLogger("rufus.telemetry")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context, version 00: version-traceid-parentid-flags, lowercase hex; all-zero ids
# are invalid. An invalid header is ignored (the specification: start a new trace).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE_MAX = 512  # the specification's limit is 32 members; longer ones are dropped
SERVICE_NAMESPACE = "rufus"


@dataclass(frozen=True)
class TracingSettings:
    """What every process reads to trace (a group of each process's settings: its --help)."""

    endpoint: str = env_var("OTEL_EXPORTER_OTLP_ENDPOINT", "",
                            "turns tracing on: the OTLP endpoint spans go to (off: unset)")
    protocol: str = env_var("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf",
                            "http/protobuf or grpc")
    sample_ratio: float = env_var("OTEL_TRACES_SAMPLER_ARG", 1.0, "share of new traces sampled",
                                  minimum=0.0, maximum=1.0)
    triton: str = env_var("RUFUS_TRITON_TRACING", "0",
                          "1: tritonserver's own OpenTelemetry spans too (HTTP endpoint)")


_tracer: Any = None  # the SDK tracer once setup() turned tracing on
_provider: Any = None
_service = ""
_content = False
# wall clock (ns) minus monotonic clock (ns): vLLM's engine timestamps are monotonic
_wall_offset_ns = 0


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def endpoint(env: Mapping[str, str] | None = None) -> str:
    """The OTLP endpoint tracing exports to, '' when tracing is off."""
    e = environ() if env is None else env
    if _truthy(e.get("OTEL_SDK_DISABLED")):
        return ""
    return (e.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or e.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or "").strip()


def sample_ratio(env: Mapping[str, str] | None = None) -> float:
    """``OTEL_TRACES_SAMPLER_ARG`` as a ratio in 0..1 (a bad value names the variable)."""
    raw = ((environ() if env is None else env).get("OTEL_TRACES_SAMPLER_ARG") or "").strip()
    if not raw:
        return TracingSettings.sample_ratio
    try:
        ratio = float(raw)
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw[:20]!r}: expected a ratio 0..1") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw[:20]!r}: expected a ratio 0..1")
    return ratio


def enabled() -> bool:
    return _tracer is not None


def capture_content() -> bool:
    """May spans carry prompt and answer text? Only when the operator said so."""
    return _content


def setup(service_name: str, env: Mapping[str, str] | None = None, exporter: Any = None,
          **resource: str) -> bool:
    """Turn tracing on for this process as ``service_name`` when an OTLP endpoint is set.

    Returns whether it is on. Idempotent per process (the first call names the service).
    A process forked after this (vLLM's EngineCore) inherits nothing it uses: the batch
    processor re-creates its export thread in a child, and the engine makes no spans.
    ``exporter``: a span exporter to use instead of OTLP (tests: the SDK's in-memory one,
    exported at once)."""
    global _tracer, _provider, _service, _content, _wall_offset_ns
    if _tracer is not None:
        return True
    e = environ() if env is None else env
    url = endpoint(e) if exporter is None else "(exporter given)"
    if not url:
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    protocol = (e.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or e.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if exporter is not None:
        protocol = "in-process"
    elif protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )
        exporter = HttpExporter()
    else:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol[:20]!r}: expected grpc or "
                         "http/protobuf")
    ratio = sample_ratio(e)
    attrs = {"service.name": service_name, "service.namespace": SERVICE_NAMESPACE,
             "service.instance.id": f"{socket.gethostname()}-{os.getpid()}", **resource}
    provider = TracerProvider(resource=Resource.create(attrs),
                              sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(SimpleSpanProcessor(exporter) if protocol == "in-process"
                                else BatchSpanProcessor(exporter))
    if env is None:  # the process's own settings: its global provider too
        trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("rufus")
    _service = service_name
    _content = _truthy(e.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"))
    _wall_offset_ns = time.time_ns() - time.monotonic_ns()
    _install_log_trace_ids()
    log.info("tracing on: service.name=%s, OTLP %s to %s, sampling %.3g", service_name,
             protocol, url, ratio)
    return True


def shutdown() -> None:
    """Flush what is buffered (a process that ends; bounded by the SDK's export timeout)."""
    global _tracer, _provider
    if _tracer is None:
        return
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


# ------------------------------------------------------------------------ context on the wire
def valid_traceparent(value: Any) -> str | None:
    """The header if it is a well-formed W3C traceparent (version 00 layout), else None."""
    if isinstance(value, str) and len(value) == 55 and _TRACEPARENT.fullmatch(value) \
            and not value.startswith("ff"):
        return value
    return None


def extract(traceparent: Any, tracestate: Any = None) -> Any:
    """An OpenTelemetry context holding the remote parent, or None (tracing off, no header
    or a malformed one: the trace then starts here)."""
    if _tracer is None:
        return None
    tp = valid_traceparent(traceparent)
    if tp is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {TRACEPARENT: tp}
    if isinstance(tracestate, str) and 0 < len(tracestate) <= TRACESTATE_MAX:
        carrier[TRACESTATE] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def context_of(span: Any) -> Any:
    """A context with ``span`` as the parent (None for no span)."""
    if span is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def headers(span: Any) -> dict[str, str]:
    """The W3C headers that make ``span`` the parent on the other side ({} for no span)."""
    if span is None:
        return {}
    sc = span.get_span_context()
    if not sc.is_valid:
        return {}
    return {TRACEPARENT: f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"}


def trace_id(span: Any) -> str:
    """The span's trace id as 32 hex digits, '' for none."""
    if span is None:
        return ""
    sc = span.get_span_context()
    return f"{sc.trace_id:032x}" if sc.is_valid else ""


# ------------------------------------------------------------------------------------ spans
def start_span(name: str, parent: Any = None, kind: str = "internal",
               attributes: Mapping[str, Any] | None = None,
               start_ns: int | None = None) -> Any:
    """A started span, or None when tracing is off. ``parent``: a span or a context (None:
    the current one). ``kind``: internal, server, client. Attributes that are None are left
    out (OpenTelemetry takes no None). Ended by :func:`end`."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = parent if parent is None or not isinstance(parent, trace.Span) \
        else trace.set_span_in_context(parent)
    k = {"server": trace.SpanKind.SERVER, "client": trace.SpanKind.CLIENT}.get(
        kind, trace.SpanKind.INTERNAL)
    attrs = {key: v for key, v in (attributes or {}).items() if v is not None}
    return _tracer.start_span(name, context=ctx, kind=k, attributes=attrs, start_time=start_ns)


def end(span: Any, error: Any = None, end_ns: int | None = None, /, **attributes: Any) -> None:
    """End ``span`` (None: nothing), with attributes and, for an error of the vocabulary
    (anything with ``code``), ``error.type`` = its code and an error status. The first three
    are positional only: an attribute's name (``**{"gen_ai.usage.input_tokens": n}``) never
    binds to them."""
    if span is None:
        return
    for k, v in attributes.items():
        if v is not None:
            span.set_attribute(k, v)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        # a RufusError's code; rufus.client.RequestFailed carries one as ``error``
        code = getattr(error, "code", None) or getattr(getattr(error, "error", None), "code",
                                                       None) or type(error).__name__
        span.set_attribute("error.type", str(code))
        # the vocabulary's message is client-safe (no traceback, no server path)
        span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
    span.end(end_time=end_ns)


def child_span(parent: Any, name: str, start_ns: int, end_ns: int,
               **attributes: Any) -> None:
    """A finished child span with known times (a stage measured before its span existed)."""
    if parent is None or end_ns < start_ns:
        return
    start_span(name, parent, attributes=attributes, start_ns=start_ns).end(end_time=end_ns)


def mono_to_ns(mono_s: float) -> int:
    """A ``time.monotonic()`` reading (this host's CLOCK_MONOTONIC, which vLLM's engine
    timestamps also use) as wall-clock nanoseconds for a span."""
    return int(mono_s * 1e9) + _wall_offset_ns


def now_ns() -> int:
    return time.time_ns()


# ------------------------------------------------------------------------ trace ids in logs
class _TraceIdFormatter(logging.Formatter):
    """Wraps a handler's formatter: a record made while a span is current gets
    ``trace_id=...`` appended."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        from opentelemetry import trace

        sc = trace.get_current_span().get_span_context()
        return f"{text} trace_id={sc.trace_id:032x}" if sc.is_valid else text


def _install_log_trace_ids() -> None:
    for handler in logging.getLogger().handlers:
        if not isinstance(handler.formatter, _TraceIdFormatter):
            handler.setFormatter(_TraceIdFormatter(handler.formatter))


def attach(span: Any) -> Any:
    """Make ``span`` current in this task or thread (log lines carry its trace id); returns
    the token for :func:`detach`. Only in coroutines and threads, never across an async
    generator's ``yield`` (another context resumes it)."""
    if span is None:
        return None
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def detach(token: Any) -> None:
    if token is None:
        return
    from opentelemetry import context

    context.detach(token)


def service_name() -> str:
    return _service
