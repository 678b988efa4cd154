"""End-to-end traces from the real stack (tritonserver with the three models, the OpenAI
frontend) to a real OTLP/HTTP receiver (lab/otlp_sink.py): one assistant turn is one
trace across the frontend, rufus_assistant, rufus_qp_medusa, rufus_llm and tritonserver's
own spans; a request without a ``traceparent`` starts its own; no customer text is in a span.
The stack runs traced at 100% for the whole session (conftest.py ``tracing_env``)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable

import pytest

from lab.otlp_sink import Receiver, Span
from rufus.client import AsyncStreams

from .conftest import wait_for

QUESTION = "waterproof hiking boots under $150"


def new_parent() -> tuple[str, str]:
    tid = secrets.token_hex(16)
    return tid, f"00-{tid}-{secrets.token_hex(8)}-01"


def spans_of(rx: Receiver, tid: str, want: set[str], timeout: float = 60,
             names: set[str] = frozenset(), client: str = "",
             why: Callable[[], str] = str,
             until: Callable[[list[Span]], bool] = lambda spans: True) -> list[Span]:
    """The trace's spans once every service in ``want`` has reported, its root spans (a
    model's generate, a turn, a request) and the spans in ``names`` have ended, and every
    span's parent has come too, but the client's span ``client``, whose child must have come
    (exported every 0.5 s; tritonserver's own spans by its exporter, ended last: a model's
    root span can come before its parent, Triton's), and ``until`` holds of them (what the
    test asserts of their tree). Fails with what the receiver got otherwise (and ``why``)."""
    def complete() -> bool:
        spans = rx.trace(tid)
        have = {s.name for s in spans}
        roots = {"rufus_assistant turn"} if "rufus_assistant" in want else set()
        if "rufus-frontend" in want:
            roots |= {"POST /v1/chat/completions", "rufus-assistant turn"}
        if "rufus_llm" in want:
            roots |= {"rufus_llm generate"}
        ids = {s.span_id for s in spans}
        # the one parent outside the trace's spans is the client's (the traceparent sent).
        # tritonserver's own spans are not waited on for theirs: its request span of a
        # request on an open gRPC stream (the assistant's to the planner) can come late
        outside = {s.parent_id for s in spans if s.parent_id and s.parent_id not in ids
                   and s.service != "tritonserver"}
        if not (want <= {s.service for s in spans} and (roots | names) <= have
                and until(spans)):
            return False
        if client:  # and the trace's root, whose parent is the client's span, has come
            return outside <= {client} and any(s.parent_id == client for s in spans)
        return len(outside) <= 1

    def missing() -> str:
        spans = rx.trace(tid)
        ids = {s.span_id for s in spans}
        outside = {s.parent_id for s in spans if s.parent_id and s.parent_id not in ids}
        return (f"parents not in the trace: {sorted(outside)} (the client's: {client!r}); "
                f"{rx.summary()}; {why()}; spans: "
                f"{sorted({(s.service, s.name, s.parent_id) for s in spans})}")

    assert wait_for(complete, timeout=timeout, interval=0.5), missing()
    return rx.trace(tid)


def refused_spans(rx: Receiver) -> list[tuple[str, str, str]]:
    """(trace id, parent id, service) of every refusal's span the receiver has."""
    return [(s.trace_id, s.parent_id, s.service) for s in list(rx.spans)
            if s.name.endswith(" refused")]


def under(spans: list[Span], name: str, ancestor: str) -> bool:
    """Has a span called ``name`` come whose chain of parents reaches ``ancestor``?"""
    return any(s.name == name and ancestor in ancestors(s, spans) for s in spans)


def ancestors(span: Span, spans: list[Span]) -> list[str]:
    by_id = {s.span_id: s for s in spans}
    out, cur = [], span
    while cur.parent_id in by_id:
        cur = by_id[cur.parent_id]
        out.append(cur.name)
    return out


async def _turn(url: str, parent: str) -> list[dict]:
    s = AsyncStreams(url)
    try:
        return [o async for o in s.stream("rufus_assistant", {"question": QUESTION},
                                          trace={"traceparent": parent})]
    finally:
        await s.close()


def test_an_assistant_turn_is_one_trace_across_every_model(stack, otlp):
    tid, parent = new_parent()
    outs = asyncio.run(_turn(f"127.0.0.1:{stack.grpc_port}", parent))
    assert outs and "finish_reason" in outs[-1]
    spans = spans_of(otlp, tid, {"rufus_assistant", "rufus_qp_medusa", "rufus_llm"},
                     client=parent.split("-")[2],
                     until=lambda sp: under(sp, "rufus_qp_medusa generate", "plan")
                     and under(sp, "rufus_llm generate", "answer"))
    names = {(s.service, s.name) for s in spans}
    for stage in ("rufus_assistant turn", "admission", "plan", "retrieval", "render cards",
                  "answer", "stream to client"):
        assert ("rufus_assistant", stage) in names, sorted(names)
    assert ("rufus_qp_medusa", "rufus_qp_medusa generate") in names
    assert ("rufus_llm", "rufus_llm generate") in names
    for child in ("queue", "prefill", "decode"):
        assert ("rufus_llm", child) in names, sorted(names)
    # the planner's request hangs under the plan stage, the answer model's under the answer
    plan = next(s for s in spans if s.name == "rufus_qp_medusa generate")
    answer = next(s for s in spans if s.name == "rufus_llm generate"
                  and "answer" in ancestors(s, spans))
    assert "plan" in ancestors(plan, spans) and "rufus_assistant turn" in ancestors(plan, spans)
    assert answer.attributes["gen_ai.usage.output_tokens"] > 0
    assert answer.attributes["gen_ai.request.model"] == "rufus_llm"
    turn = next(s for s in spans if s.name == "rufus_assistant turn")
    assert turn.attributes["gen_ai.response.finish_reasons"]
    retrieval = next(s for s in spans if s.name == "retrieval")
    assert retrieval.attributes["rufus.search.hits"] > 0
    # the client's span is the root's parent; nothing in the trace carries the question
    assert turn.parent_id == parent.split("-")[2] or \
        any(s.parent_id == parent.split("-")[2] for s in spans)
    dump = json.dumps([s.attributes for s in spans])
    # (the product type searched, "hiking boots", is the catalog's name, not the question's)
    assert QUESTION not in dump and "waterproof" not in dump and "$150" not in dump


def test_tritonservers_own_spans_join_the_trace(stack, otlp):
    tid, parent = new_parent()
    asyncio.run(_turn(f"127.0.0.1:{stack.grpc_port}", parent))
    spans = spans_of(otlp, tid, {"rufus_assistant", "rufus_llm", "tritonserver"},
                     client=parent.split("-")[2])
    triton = [s for s in spans if s.service == "tritonserver"]
    assert triton, sorted({s.service for s in spans})
    model_roots = [s for s in spans if s.name.endswith(("generate", "turn"))]
    # every model's span has a parent in the trace (Triton's, or the caller's stage)
    assert all(s.parent_id for s in model_roots)


def test_a_request_without_traceparent_starts_its_own_trace(stack, otlp):
    from rufus.client import generate

    list(generate(f"127.0.0.1:{stack.grpc_port}", "rufus_llm", "Name a tent brand.",
                  sampling={"max_tokens": 7, "temperature": 0.0}))

    def mine() -> list[Span]:
        return [s for s in otlp.spans if s.name == "rufus_llm generate"
                and s.attributes.get("gen_ai.request.max_tokens") == 7]

    assert wait_for(lambda: bool(mine()), timeout=60, interval=0.5)
    span = mine()[-1]
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.attributes["gen_ai.response.finish_reasons"] in (["length"], ["stop"])
    assert span.attributes["gen_ai.usage.input_tokens"] > 0
    assert {"queue", "prefill"} <= {s.name for s in otlp.trace(span.trace_id)}


def test_a_bad_request_is_a_span_with_the_error_code(stack, otlp):
    import tritonclient.grpc as grpcclient

    from rufus.client import RequestFailed, stream_outputs

    tid, parent = new_parent()
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    import numpy as np

    t.set_data_from_numpy(np.array([b"hi"], dtype=object))
    bad = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b'{"temperature": -3}'], dtype=object))
    with pytest.raises(RequestFailed) as refusal:
        list(stream_outputs(f"127.0.0.1:{stack.grpc_port}", "rufus_llm", [t, bad],
                            trace={"traceparent": parent}))
    # the model refused it (not tritonserver, nor an engine that is down)
    assert "temperature" in str(refusal.value), refusal.value
    spans = spans_of(otlp, tid, set(), names={"rufus_llm refused"},
                     why=lambda: f"the client got {str(refusal.value)[:200]!r}; the last "
                                 f"refused spans: {refused_spans(otlp)[-5:]}")
    refused = next(s for s in spans if s.name == "rufus_llm refused")
    assert refused.error and refused.attributes["error.type"] == "INVALID_ARG"


def test_an_openai_turn_is_traced_from_the_frontend_down(assistant_frontend, otlp):
    from openai import OpenAI

    tid, parent = new_parent()
    client = OpenAI(base_url=assistant_frontend + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="rufus-assistant", stream=True, extra_headers={"traceparent": parent},
        messages=[{"role": "user", "content": QUESTION}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    spans = spans_of(otlp, tid, {"rufus-frontend", "rufus_qp_medusa", "rufus_llm"},
                     client=parent.split("-")[2],
                     until=lambda sp: under(sp, "rufus_llm generate", "answer")
                     and under(sp, "rufus_llm generate", "POST /v1/chat/completions"))
    http = next(s for s in spans if s.service == "rufus-frontend"
                and s.name == "POST /v1/chat/completions")
    assert http.parent_id == parent.split("-")[2]
    assert http.attributes["http.response.status_code"] == 200
    assert http.attributes["gen_ai.request.model"] == "rufus-assistant"
    llm = next(s for s in spans if s.name == "rufus_llm generate"
               and "answer" in ancestors(s, spans))
    assert "POST /v1/chat/completions" in ancestors(llm, spans)
