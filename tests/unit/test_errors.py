"""The one error vocabulary (rufus/errors.py): types, wire form, parser, the mapping of any
exception, and the conversation bounds every model shares."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from rufus.client import RequestFailed, retryable
from rufus.errors import (
    AtCapacity,
    Cancelled,
    Code,
    DeadlineExceeded,
    Internal,
    InvalidInput,
    NotFound,
    RufusError,
    Unavailable,
    client_error,
    from_wire,
)
from rufus.frontend.protocol import openai_error
from rufus.serving.validation import (
    MAX_HISTORY_TURNS,
    check_history,
    read_conversation,
)


@pytest.mark.parametrize("err, code, http, outcome, retry", [
    (InvalidInput("question", "is empty"), Code.INVALID_ARG, 400, "invalid", False),
    (Unavailable("engine dead"), Code.UNAVAILABLE, 503, "unavailable", True),
    (AtCapacity("24 outstanding"), Code.UNAVAILABLE, 503, "rejected", True),
    (NotFound("no such model"), Code.NOT_FOUND, 503, "unavailable", True),
    (Cancelled("gone"), Code.CANCELLED, 499, "cancelled", False),
    (DeadlineExceeded("late"), Code.DEADLINE_EXCEEDED, 504, "timeout", False),
    (Internal("boom"), Code.INTERNAL, 500, "error", False),
])
def test_each_type_derives_code_status_outcome_and_retry(err, code, http, outcome, retry):
    assert (err.code, err.http_status, err.outcome, err.retryable) == (code, http, outcome, retry)
    assert err.wire().startswith(f"[{code}] ")


@pytest.mark.parametrize("err", [
    InvalidInput("sampling_parameters.top_k", "must be >= -1, got -5"),
    InvalidInput("history[2].content", "contains a lone surrogate (U+D800) at character 0"),
    Unavailable("rufus_llm: engine restarting after a failure"),
    Cancelled("request was cancelled"),
])
def test_wire_round_trip(err):
    back = from_wire(err.wire())
    assert type(back) is type(err) and back.message == err.message
    if isinstance(err, InvalidInput):
        assert (back.field, back.reason) == (err.field, err.reason)


def test_parser_reads_prefixes_transport_statuses_and_triton_messages():
    assert from_wire("rufus_llm: [UNAVAILABLE] at capacity").code is Code.UNAVAILABLE
    assert from_wire("[StatusCode.NOT_FOUND] Request for unknown model: 'x'").code is Code.NOT_FOUND
    assert from_wire("Request for unknown model: 'rufus_llm' is not found").code is Code.NOT_FOUND
    assert from_wire("unavailable", "StatusCode.UNAVAILABLE").code is Code.UNAVAILABLE
    assert from_wire("too big", "StatusCode.RESOURCE_EXHAUSTED").retryable
    assert from_wire("[1, 2] are odd").code is Code.INTERNAL  # brackets that are no code
    nested = from_wire("[INTERNAL] answer model failed: rufus_llm: [UNAVAILABLE] x")
    assert nested.code is Code.INTERNAL  # the outermost code is this server's answer
    bad = from_wire("[INVALID_ARG] messages[0].content: must be a string")
    assert (bad.field, bad.reason) == ("messages[0].content", "must be a string")


def test_request_failed_carries_the_typed_error():
    exc = RequestFailed("[INVALID_ARG] sampling_parameters.top_p: must be in (0, 1]")
    assert exc.status == "INVALID_ARG" and isinstance(exc.error, InvalidInput)
    assert not retryable(exc)
    assert retryable(RequestFailed("[UNAVAILABLE] model not ready", "UNAVAILABLE"))
    assert retryable(RequestFailed("unavailable", "StatusCode.UNAVAILABLE"))
    assert retryable(RequestFailed("Request for unknown model: 'rufus_llm' is not found"))
    assert not retryable(RequestFailed("something else"))


def test_an_unexpected_exception_becomes_a_short_internal_error_with_a_logged_id(caplog):
    log = logging.getLogger("test.errors")
    try:
        open("/no/such/dir/secret.txt")
    except OSError as exc:
        with caplog.at_level(logging.ERROR, logger="test.errors"):
            err = client_error(exc, log, "request r-1")
    assert isinstance(err, Internal) and err.error_id in err.message
    assert "/no/such" not in err.wire() and "Traceback" not in err.wire()
    assert err.error_id in caplog.text and "request r-1" in caplog.text
    assert caplog.records[0].exc_info is not None  # the operator gets the traceback
    same = InvalidInput("x", "y")
    assert client_error(same, log, "r") is same


def test_reason_and_message_are_bounded():
    assert len(InvalidInput("f", "x" * 10_000).reason) <= 303
    assert len(Unavailable("y" * 10_000).message) <= 1003


def test_the_frontend_derives_its_status_from_the_type():
    assert openai_error(InvalidInput("sampling_parameters.top_k", "bad")).param == "top_k"
    assert openai_error(InvalidInput("text_input", "too long")).param == "prompt"
    assert openai_error(AtCapacity("full")).status == 503
    assert openai_error(Internal("boom")).status == 500
    assert isinstance(InvalidInput("a", "b"), ValueError | RufusError)


# ---------------------------------------------------------------- one conversation contract

def _b(text: str) -> np.ndarray:
    return np.array([text.encode()], dtype=np.object_)


@pytest.mark.parametrize("history", [None, "null", "[]"])
def test_no_history_means_the_same_everywhere(history):
    values = {"question": "running shoes", "history": history}
    assert read_conversation(values) == ("running shoes", [])
    assert check_history(None if history is None else json.loads(history)) == []


@pytest.mark.parametrize("history, field", [
    ("[" * 100_000 + "]" * 100_000, "history"),
    ('{"role": "user"}', "history"),
    ("[1]", "history[0]"),
    ('[{"role": "robot", "content": "hi"}]', "history[0].role"),
    ('[{"role": "user", "content": "a", "x": 1}]', "history[0]"),
    ('[{"role": "user", "content": "\\ud800"}]', "history[0].content"),
    (json.dumps([{"role": "user", "content": "a"}] * (MAX_HISTORY_TURNS + 1)), "history"),
])
def test_bad_history_names_the_field_without_recursion(history, field):
    with pytest.raises(InvalidInput) as ei:
        read_conversation({"question": "q", "history": history})
    assert ei.value.field == field


def test_the_planner_and_the_assistant_parse_a_conversation_alike():
    from rufus.assistant.triton_model import parse_assistant_request
    from rufus.qp.model import parse_plan_request

    for history in ('[{"role": "user", "content": "hi"}]', "null", "[[[[[[[[[[[[[[[[[[[[[[[[["
                    "[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "[{}]"):
        inputs = {"question": _b("shoes"), "history": _b(history)}
        outcomes = []
        for parse in (lambda x: parse_assistant_request(x).history,
                      lambda x: parse_plan_request(x, None, 64).history or []):
            try:
                outcomes.append(("ok", parse(inputs)))
            except InvalidInput as exc:
                outcomes.append(("invalid", exc.field, exc.reason))
        assert outcomes[0] == outcomes[1], history


def test_the_assistant_takes_no_request_parameters():
    from rufus.assistant.triton_model import parse_assistant_request

    inputs = {"question": _b("shoes")}
    assert parse_assistant_request(inputs, parameters="{}").question == "shoes"
    with pytest.raises(InvalidInput) as ei:
        parse_assistant_request(inputs, parameters='{"temperature": 0}')
    assert ei.value.field == "parameters" and "temperature" in ei.value.reason


def test_a_stream_reset_by_a_dying_unit_reads_as_unavailable():
    """A leader killed mid-stream: HAProxy resets the stream (RST_STREAM CANCEL); this client
    never reads on after cancelling, so that CANCELLED is the unit's loss, not the client's."""
    from rufus.client import _failed, _rpc_failed

    class TritonError(Exception):
        def status(self) -> str:
            return "StatusCode.CANCELLED"

    wire = ("Stream removed (Data frame with END_STREAM flag received) "
            "(RST_STREAM (Received RST_STREAM with error code 8))")
    exc = _failed(TritonError(wire))
    assert str(exc).startswith("[UNAVAILABLE] the connection to the unit was lost mid-stream")
    assert exc.status == "UNAVAILABLE" and retryable(exc)

    class RpcError(Exception):
        def code(self):
            import grpc
            return grpc.StatusCode.CANCELLED

        def details(self) -> str:
            return "Received RST_STREAM with error code 8"

    assert _rpc_failed(RpcError(), "rufus_llm: ").status == "UNAVAILABLE"

    class Cancelled(TritonError):
        pass

    # a CANCELLED the server sent on purpose (no transport reset) stays what it is
    assert _failed(Cancelled("[CANCELLED] request cancelled")).status == "CANCELLED"
