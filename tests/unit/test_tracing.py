"""OpenTelemetry tracing (rufus/telemetry/tracing.py) with the SDK's in-memory exporter: off
means no spans at all; on, a request joins the client's W3C ``traceparent``, rufus_llm's
request gets queue / prefill / decode children from vLLM's timestamps, errors carry the
vocabulary's code, an assistant turn has one span per stage and passes its context on to
the planner and the answer model, and no customer text is in any span."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rufus.serving.validation import split_metadata
from rufus.telemetry import tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def spans():
    """Tracing on for one test, spans kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    tracing.shutdown()
    assert tracing.setup("test-service", env={}, exporter=exporter)
    yield exporter
    tracing.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, object]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_off_by_default_makes_nothing():
    tracing.shutdown()
    assert not tracing.setup("x", env={})  # no endpoint: off
    assert not tracing.setup("x", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318",
                                       "OTEL_SDK_DISABLED": "true"})
    assert tracing.start_span("a") is None and tracing.extract(PARENT) is None
    assert tracing.headers(None) == {} and tracing.trace_id(None) == ""
    tracing.end(None)  # no-ops
    tracing.child_span(None, "x", 0, 1)


def test_settings_are_checked():
    assert tracing.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": " http://h:4318 "}) == "http://h:4318"
    assert tracing.endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/v1/traces",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h"}) == "http://t/v1/traces"
    assert tracing.sample_ratio({}) == 1.0
    assert tracing.sample_ratio({"OTEL_TRACES_SAMPLER_ARG": "0.25"}) == 0.25
    for bad in ("2", "-1", "half"):
        with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
            tracing.sample_ratio({"OTEL_TRACES_SAMPLER_ARG": bad})


@pytest.mark.parametrize("value,ok", [
    (PARENT, True),
    (f"00-{TRACE_ID}-00f067aa0ba902b7-00", True),  # not sampled: still a parent
    (f"00-{'0' * 32}-00f067aa0ba902b7-01", False),  # all-zero trace id
    (f"00-{TRACE_ID}-{'0' * 16}-01", False),
    (f"ff-{TRACE_ID}-00f067aa0ba902b7-01", False),  # version ff is invalid
    (PARENT.upper(), False), (PARENT + "-x", False), ("", False), (None, False), (42, False),
])
def test_traceparent_is_validated(value, ok):
    assert (tracing.valid_traceparent(value) is not None) is ok


def test_routing_metadata_is_split_from_the_parameters():
    rest, key, trace = split_metadata(json.dumps({"traceparent": PARENT, "tracestate": "a=b",
                                                  "temperature": 0.5}), "x-rufus-conversation")
    assert json.loads(rest) == {"temperature": 0.5} and key == ""
    assert trace == {"traceparent": PARENT, "tracestate": "a=b"}
    assert split_metadata(json.dumps({"traceparent": 7}), "k") == (None, "", {})
    plain = json.dumps({"temperature": 0.5})
    assert split_metadata(plain, "k") == (plain, "", {})  # not parsed twice


def test_a_span_joins_the_callers_trace_and_passes_it_on(spans):
    parent = tracing.extract(PARENT, "vendor=1")
    span = tracing.start_span("work", parent, "server", {"a": 1})
    hdr = tracing.headers(span)
    tracing.end(span)
    (done,) = spans.get_finished_spans()
    assert f"{done.context.trace_id:032x}" == TRACE_ID
    assert f"{done.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert hdr["traceparent"] == f"00-{TRACE_ID}-{done.context.span_id:016x}-01"
    assert done.resource.attributes["service.name"] == "test-service"
    assert done.resource.attributes["service.namespace"] == "rufus"


def test_an_error_carries_the_vocabularys_code(spans):
    from rufus.errors import Unavailable

    tracing.end(tracing.start_span("w"), Unavailable("engine unavailable: dead"))
    (done,) = spans.get_finished_spans()
    assert done.attributes["error.type"] == "UNAVAILABLE"
    assert done.status.status_code.name == "ERROR"


def test_log_lines_in_a_span_carry_its_trace_id(spans, caplog):
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    try:
        tracing._install_log_trace_ids()
        span = tracing.start_span("w", tracing.extract(PARENT))
        token = tracing.attach(span)
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
        inside = handler.format(record)
        tracing.detach(token)
        outside = handler.format(record)
        tracing.end(span)
    finally:
        root.removeHandler(handler)
    assert inside == f"hello trace_id={TRACE_ID}" and outside == "hello"


# ----------------------------------------------------------------------------- rufus_llm
def test_a_generate_request_has_queue_prefill_decode_and_usage(spans):
    pytest.importorskip("vllm")
    from rufus.serving.cancel import CancelWatcher
    from rufus.serving.generation import run_generate
    from rufus.serving.metrics import Metrics
    from tests.unit.test_generation import FakeHost, Sink, req, stream_script

    script = stream_script(3)
    now = time.monotonic()
    for out in script:  # vLLM's RequestStateStats: engine-core monotonic timestamps
        out.metrics = SimpleNamespace(queued_ts=now, scheduled_ts=now + 0.01,
                                      first_token_ts=now + 0.05, last_token_ts=now + 0.09)
    host, sink = FakeHost(script=script), Sink()
    host.name = "rufus_llm"
    r = req(messages=[{"role": "user", "content": "secret customer words"}], prompt=None)
    r.trace = tracing.extract(PARENT)

    async def main() -> None:
        await run_generate(host, CancelWatcher(interval=0.01), r, sink, Metrics(), now, "r1")

    asyncio.run(main())
    s = by_name(spans)
    assert {"rufus_llm generate", "tokenize", "queue", "prefill", "decode"} <= set(s)
    top = s["rufus_llm generate"]
    assert f"{top.context.trace_id:032x}" == TRACE_ID
    for child in ("tokenize", "queue", "prefill", "decode"):
        assert s[child].parent.span_id == top.context.span_id
    assert top.attributes["gen_ai.request.model"] == "rufus_llm"
    assert top.attributes["gen_ai.operation.name"] == "chat"
    assert top.attributes["gen_ai.usage.output_tokens"] == 3
    assert top.attributes["gen_ai.usage.input_tokens"] > 0
    assert top.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert abs((s["prefill"].end_time - s["prefill"].start_time) / 1e9 - 0.04) < 1e-3
    assert [e.name for e in top.events] == ["first_token"]
    dump = json.dumps([dict(x.attributes) for x in spans.get_finished_spans()])
    assert "secret customer words" not in dump  # no content unless the operator turns it on


def test_a_failed_generate_request_says_why(spans):
    pytest.importorskip("vllm")
    from tests.unit.test_generation import FakeHost, Sink, req, serve, stream_script

    host = FakeHost(script=stream_script(1)[:0], fail=RuntimeError("boom"))
    host.state = "dead"
    host.dead_reason = "worker died"
    serve(host, req(), Sink())
    (top,) = [x for x in spans.get_finished_spans() if x.name.endswith("generate")]
    assert top.attributes["error.type"] in ("UNAVAILABLE", "INTERNAL")
    assert top.status.status_code.name == "ERROR"


# ----------------------------------------------------------------------------- assistant
def test_an_assistant_turn_has_a_span_per_stage_and_passes_its_context_on(spans):
    from rufus.assistant.pipeline import Assistant
    from rufus.retrieval import default_retriever
    from tests.unit.test_assistant import FakeStreams, plan_of

    fake = FakeStreams(plan_of("product_search", ["running shoes"], {"max_price": 80}),
                       ["[1] ", "x\n"])
    assistant = Assistant("x", default_retriever())
    assistant.streams = lambda: fake  # type: ignore[method-assign]
    turn = tracing.start_span("rufus_assistant turn", tracing.extract(PARENT), "server")

    async def go() -> list:
        return [ev async for ev in assistant.stream("running shoes under $80", [], span=turn)]

    evs = asyncio.run(go())
    tracing.end(turn)
    assert evs[-1].type == "done"
    s = by_name(spans)
    assert {"plan", "retrieval", "render cards", "answer"} <= set(s)
    for stage in ("plan", "retrieval", "render cards", "answer"):
        assert s[stage].parent.span_id == turn.get_span_context().span_id
        assert f"{s[stage].context.trace_id:032x}" == TRACE_ID
    # the planner's and the answer model's requests carry their stage's span as the parent
    sent = dict(fake.traces)
    assert sent["rufus_qp_medusa"]["traceparent"].split("-")[2] == \
        f"{s['plan'].context.span_id:016x}"
    assert sent["rufus_llm"]["traceparent"].split("-")[2] == \
        f"{s['answer'].context.span_id:016x}"
    assert s["retrieval"].attributes["rufus.search.hits"] > 0
    assert "max_price" in s["retrieval"].attributes["rufus.search.filters"]
    assert s["answer"].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    dump = json.dumps([dict(x.attributes) for x in spans.get_finished_spans()])
    assert "running shoes" not in dump


def test_an_untraced_turn_sends_no_trace_headers():
    from rufus.assistant.pipeline import Assistant
    from rufus.retrieval import default_retriever
    from tests.unit.test_assistant import FakeStreams, plan_of, run

    tracing.shutdown()
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["[1] x\n"])
    run(Assistant("x", default_retriever()), fake, "running shoes")
    assert fake.traces and all(not t for _, t in fake.traces)


# ------------------------------------------------------------------------------ frontend
def test_the_openai_frontend_joins_the_clients_trace(spans, monkeypatch):
    from fastapi.testclient import TestClient

    from rufus.frontend import targets
    from rufus.frontend.app import Settings, create_app
    from rufus.frontend.assistant_hook import AssistantHook
    from tests.unit.test_frontend_app import FakeAssistant

    fake = FakeAssistant()
    seen: dict[str, object] = {}

    async def get(self):
        return fake

    def admit():
        return SimpleNamespace(estimate_s=0.1, x=(1.0, 0.0, 0.0), done=lambda: None)

    orig = fake.stream

    def stream(question, history, conversation=None, ticket=None, span=None):
        seen["span"] = span
        return orig(question, history, conversation)

    fake.admit = admit  # type: ignore[attr-defined]
    fake.stream = stream  # type: ignore[method-assign]
    monkeypatch.setattr(AssistantHook, "assistant", get)
    monkeypatch.setattr(targets, "HOOKS", dict(targets.HOOKS))
    with TestClient(create_app(Settings(triton_url="127.0.0.1:1", retries=0))) as c:
        r = c.post("/v1/chat/completions", headers={"traceparent": PARENT},
                   json={"model": "rufus-assistant", "stream": True,
                         "messages": [{"role": "user", "content": "shoes"}]})
        bad = c.post("/v1/chat/completions", headers={"traceparent": "garbage"},
                     json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and bad.status_code == 404
    s = spans.get_finished_spans()
    http = [x for x in s if x.name == "POST /v1/chat/completions"]
    assert len(http) == 2
    joined = [x for x in http if f"{x.context.trace_id:032x}" == TRACE_ID]
    assert len(joined) == 1 and joined[0].attributes["http.response.status_code"] == 200
    assert joined[0].attributes["gen_ai.request.model"] == "rufus-assistant"
    fresh = next(x for x in http if x is not joined[0])  # a malformed header: a new trace
    assert fresh.parent is None and fresh.attributes["error.type"] == "model_not_found"
    turn = next(x for x in s if x.name == "rufus-assistant turn")
    assert turn.parent.span_id == joined[0].context.span_id
    assert seen["span"] is not None
    assert any(x.name == "admission" and x.parent.span_id == turn.context.span_id for x in s)
