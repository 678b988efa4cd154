"""Hostile inputs against rufus_assistant on the real stack, gRPC and HTTP (issue: bad input).

Every input of rufus_assistant (``question``, ``history``: TYPE_STRING, history a JSON list
of {role, content} earlier turns) gets hostile values. Each case sends one bad request and
checks that the error's status is INVALID_ARG (our models put ``[INVALID_ARG]`` in front of
a streamed error: Triton's gRPC stream drops the code), that the message names the field
(``<field>: <reason>``), that it shows no traceback or server path
(``conftest.assert_clean_error``), that the model is still ready, and that a cheap good
request right after succeeds ("where is my order": the planner routes it to the fixed
order-status reply, no answer model); every few cases a full product answer too. Cases that
Triton itself refuses (shape, datatype, unknown input) are named in Triton's words ("input
'question'"); its stream error carries no code, the same case over HTTP gets a 400.
``history`` JSON ``null`` means "no history" (as absent) and must answer normally.

A good product stream runs alongside the whole run and must finish normally every time; at
the end neither engine holds a request (``rufus_engine_requests`` of rufus_llm and
rufus_qp_medusa back to 0). Transports: tritonclient gRPC streaming (every case), Triton's
HTTP ``generate`` (every case a JSON body can carry) and ``generate_stream`` (a subset).
Prints ``adversarial rufus_assistant: N cases tried, M passed``.

Uses the session ``stack`` (conftest.py), shared with test_assistant.py: no server of its own.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .conftest import assert_clean_error, metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_assistant"
ENGINES = ("rufus_llm", "rufus_qp_medusa")
RESULTS: list[bool] = []

CHEAP = "where is my order"                 # planner -> order_status: fixed reply, no answer model
PRODUCT = "running shoes under $80"         # planner -> search -> cards -> answer model
ALONGSIDE = "wireless earbuds under $50"
FULL_ANSWER_EVERY = 10                      # cases between two full product answers

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000
MIB = 1 << 20
USER = {"role": "user", "content": "I need running shoes"}
ASSISTANT = {"role": "assistant", "content": "Here are some running shoes."}


@dataclass
class Case:
    id: str
    inputs: dict[str, Any]   # tensor name -> str (sent as UTF-8), bytes (as is) or np.ndarray
    field: str               # the field the error names ("" for a case that must succeed)
    says: str = ""           # a word the reason must contain (case-insensitive)
    http: bool = True        # a generate JSON body can carry it
    sse: bool = False        # also sent to generate_stream
    triton: bool = False     # Triton itself refuses it, naming the input in its own words
    grpc: bool = True        # sent over gRPC streaming
    ok: bool = False         # not an error: must answer normally
    body: dict[str, Any] | None = None  # the HTTP body, when the inputs are no JSON

    def http_body(self) -> dict[str, Any]:
        return self.inputs if self.body is None else self.body


def case(id: str, field: str, question: Any = CHEAP, history: Any = None, *,
         extra: dict[str, Any] | None = None, **kw: Any) -> Case:
    """A request with ``question`` and ``history`` (None: absent; a str, bytes or array is
    sent as is, anything else as its JSON text)."""
    inputs: dict[str, Any] = {}
    if question is not None:
        inputs["question"] = question
    if history is not None:
        inputs["history"] = history if isinstance(history, str | bytes | np.ndarray) \
            else json.dumps(history)
    inputs.update(extra or {})
    if kw.get("body") is None and any(isinstance(v, bytes | np.ndarray)
                                      for v in inputs.values()):
        kw.setdefault("http", False)
    return Case(id, inputs, field, **kw)


def arr(values: list[Any], dtype: Any = np.object_) -> np.ndarray:
    return np.array(values, dtype=dtype)


CASES = [
    # ------------------------------------------------------------------ question
    case("question missing", "question", question=None, says="missing", sse=True),
    case("question missing, history given", "question", question=None, history=[USER]),
    case("question empty", "question", question="", says="empty"),
    case("question whitespace", "question", question=" \t\n  ", says="empty", sse=True),
    case("question 1001 chars", "question", question="q" * 1001, says="1001", sse=True),
    case("question over 1 MiB", "question", question="q" * (MIB + 10)),
    case("question non-UTF-8", "question", question=b"\xff\xfe\xfa", says="UTF-8"),
    case("question truncated UTF-8", "question", question="shoes \u20ac".encode()[:-1]),
    case("question overlong NUL", "question", question=b"shoes \xc0\x80"),
    # U+D800 / U+DC00 in the UTF-8 form (ED A0 80): the only way a lone surrogate travels
    # in a BYTES tensor
    case("question lone surrogate", "question", question=b"shoes \xed\xa0\x80"),
    case("question lone low surrogate", "question", question=b"\xed\xb0\x80 shoes"),
    case("question two elements", "question", question=arr([b"shoes", b"boots"]),
         triton=True, body={"question": ["shoes", "boots"]}),
    case("question shape 1x1", "question", question=arr([[b"shoes"]]), triton=True),
    case("question no element", "question", question=arr([]), triton=True),
    case("question INT32", "question", question=arr([5], np.int32), triton=True),
    case("question BOOL", "question", question=arr([True], bool), triton=True),
    case("question FP32", "question", question=arr([1.5], np.float32), triton=True),
    # ------------------------------------------------------------------ history: transport
    case("history two elements", "history", history=arr([b"[]", b"[]"]), triton=True,
         body={"question": CHEAP, "history": ["[]", "[]"]}),
    case("history INT32", "history", history=arr([1], np.int32), triton=True),
    case("history non-UTF-8", "history", history=b'[{"role": "user", "content": "\xff"}]',
         says="UTF-8"),
    case("history lone surrogate bytes", "history",
         history=b'[{"role": "user", "content": "\xed\xa0\x80"}]'),
    case("history over 1 MiB", "history",
         history=[{"role": "user", "content": "x" * (MIB + 10)}], says="bytes"),
    case("history 1 MiB of spaces", "history", history=" " * (MIB + 1) + "[]"),
    # ------------------------------------------------------------------ history: nesting
    # 100,000 levels: json.loads alone raises RecursionError; must be INVALID_ARG "nests"
    case("history deep arrays", "history", history=DEEP, says="nest", sse=True),
    case("history deep objects", "history", history=DEEP_OBJECT, says="nest"),
    case("history deep inside a turn", "history",
         history='[{"role": "user", "content": "x", "extra": ' + DEEP + "}]", says="nest"),
    case("history deep content", "history",
         history='[{"role": "user", "content": ' + DEEP + "}]", says="nest"),
    case("history 2000 levels", "history", history="[" * 2000 + "]" * 2000, says="nest"),
    case("history 40 levels", "history", history="[" * 40 + "]" * 40, says="nest"),
    # ------------------------------------------------------------------ history: JSON types
    case("history not JSON", "history", history="{oops", says="JSON", sse=True),
    case("history empty text", "history", history="", says="JSON"),
    case("history object", "history", history={"role": "user", "content": "x"}, says="list"),
    case("history number", "history", history="5", says="list"),
    case("history string", "history", history='"I need running shoes"', says="list"),
    case("history true", "history", history="true", says="list"),
    case("history list of strings", "history[0]", history=["I need running shoes"]),
    case("history list of numbers", "history[0]", history=[1, 2]),
    case("history list of lists", "history[0]", history=[["user", "hi"]]),
    case("history second turn null", "history[1]", history=[USER, None]),
    # ------------------------------------------------------------------ history: turns
    case("history role robot", "history[0].role", history=[{"role": "robot", "content": "x"}],
         sse=True),
    case("history role tool", "history[0].role", history=[{"role": "tool", "content": "x"}]),
    case("history role missing", "history[0].role", history=[{"content": "x"}]),
    case("history role number", "history[0].role", history=[{"role": 5, "content": "x"}]),
    case("history role lone surrogate", "history[0].role",
         history='[{"role": "\\udc00", "content": "x"}]'),
    case("history unknown key", "history[0]", history=[{**USER, "tool_calls": []}],
         says="unknown"),
    case("history second turn unknown key", "history[1]", history=[USER, {**ASSISTANT, "x": 1}]),
    case("history content number", "history[0].content",
         history=[{"role": "user", "content": 5}]),
    case("history content null", "history[0].content",
         history=[{"role": "user", "content": None}]),
    case("history content list", "history[0].content",
         history=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
    case("history content object", "history[0].content",
         history=[{"role": "user", "content": {"text": "hi"}}]),
    case("history content missing", "history[0].content", history=[{"role": "user"}]),
    case("history content lone surrogate", "history[0].content",
         history='[{"role": "user", "content": "shoes \\ud800"}]', says="surrogate", sse=True),
    case("history second turn low surrogate", "history[1].content",
         history='[{"role": "user", "content": "shoes"}, '
                 '{"role": "assistant", "content": "ok \\udfff"}]', says="surrogate"),
    case("history reversed surrogate pair", "history[0].content",
         history='[{"role": "user", "content": "\\udc00\\ud800"}]'),
    case("history 9 turns", "history", history=[USER, ASSISTANT] * 4 + [USER], says="9"),
    case("history 1000 turns", "history", history=[USER] * 1000),
    # ------------------------------------------------------------------ unknown inputs
    case("unknown input", "questions", extra={"questions": "where is my order"}, triton=True,
         http=False),  # HTTP generate passes unknown keys as request parameters
    case("rufus_llm input", "text_input", extra={"text_input": "hi"}, triton=True, http=False),
    case("unknown body key (a request parameter)", "parameters", extra={"temperature": 0},
         grpc=False, says="unknown key"),
    # ------------------------------------------------------------------ accepted
    # decided: JSON null means "no history", the same as absent, for every model
    case("history null", "", history="null", ok=True, sse=True),
    case("history empty list", "", history="[]", ok=True),
    case("history 8 turns", "", history=[USER, ASSISTANT] * 4, ok=True),
    case("history system turn and name", "",
         history=[{"role": "system", "content": "Be brief."}, {**USER, "name": "sam"}], ok=True),
]


# ------------------------------------------------------------------------- transports

@dataclass
class Answer:
    error: str | None = None
    responses: int = 0
    plan: dict[str, Any] | None = None
    products: list[dict[str, Any]] | None = None
    text: str = ""
    finish_reason: str = ""


def _tensor(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        a = value
    elif isinstance(value, bytes):
        a = np.array([value], dtype=np.object_)
    else:
        a = np.array([str(value).encode("utf-8")], dtype=np.object_)
    dtype = {np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32",
             np.dtype(np.float32): "FP32"}.get(a.dtype, "BYTES")
    inp = grpcclient.InferInput(name, list(a.shape), dtype)
    inp.set_data_from_numpy(a)
    return inp


def _str(result: Any, name: str) -> str | None:
    a = result.as_numpy(name)
    if a is None or a.size == 0:
        return None
    v = a.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def grpc_ask(url: str, inputs: dict[str, Any], timeout: float = 240) -> Answer:
    """One rufus_assistant stream: every response until the final one, or the error."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    out = Answer()
    try:
        client.async_stream_infer(MODEL, [_tensor(k, v) for k, v in inputs.items()],
                                  enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                out.error = str(error)
                return out
            out.responses += 1
            if _str(result, "products") is not None:
                out.plan = json.loads(_str(result, "plan") or "null")
                out.products = json.loads(_str(result, "products") or "null")
            out.text += _str(result, "text_output") or ""
            out.finish_reason = _str(result, "finish_reason") or out.finish_reason
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def wire_code(message: str) -> str:
    """The status in a streamed error's wire form ``[CODE] <field>: <reason>`` ("" if none:
    Triton's own errors start ``[request id: ...]``)."""
    m = re.search(r"\[([A-Z][A-Z_]+)\] ", message)
    return m.group(1) if m else ""


def http_call(base: str, inputs: dict[str, Any], stream: bool) -> tuple[int, str]:
    req = urllib.request.Request(
        f"{base}/v2/models/{MODEL}/{'generate_stream' if stream else 'generate'}",
        data=json.dumps(inputs).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=240) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def sse_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]


def is_ready(base: str, model: str = MODEL) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/v2/models/{model}/ready", timeout=10) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def check_answers(a: Answer, what: str, products: bool = False) -> None:
    """A normal answer: no error, the first response's plan and cards, a final reason."""
    assert a.error is None, f"{what}: {assert_clean_error(a.error, what)}"
    assert a.plan is not None and a.products is not None, f"{what}: no plan/cards: {a}"
    assert a.finish_reason in ("service", "stop", "length"), f"{what}: {a}"
    assert a.text.strip(), f"{what}: no answer text: {a}"
    if products:
        assert a.products, f"{what}: no product cards for a product question: {a.plan}"


# ------------------------------------------------------------------------- fixtures

class Alongside:
    """Good product streams, one after another, beside the whole bad-input run."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.done, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                check_answers(grpc_ask(self.url, {"question": ALONGSIDE}), "alongside",
                              products=True)
                self.done += 1
            except Exception as exc:  # noqa: BLE001 - collected, asserted at the end
                self.errors.append(f"{type(exc).__name__}: {exc}"[:600])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(300)


@dataclass
class Target:
    grpc: str
    http: str
    alongside: Alongside


@pytest.fixture(scope="module")
def target(stack):
    grpc_url = f"127.0.0.1:{stack.grpc_port}"
    t = Target(grpc_url, f"http://127.0.0.1:{stack.http_port}", Alongside(grpc_url))
    yield t
    t.alongside.stop()


def _params() -> list[Any]:
    out = []
    for c in CASES:
        if c.grpc:
            out.append(pytest.param(c, "grpc", id=f"grpc-{c.id}"))
        if c.http and not c.ok:
            out.append(pytest.param(c, "http", id=f"http-{c.id}"))
        if c.http and c.sse:
            out.append(pytest.param(c, "sse", id=f"sse-{c.id}"))
    return out


# ------------------------------------------------------------------------- tests

def _check_error(c: Case, transport: str, message: str, status: int | None) -> None:
    where = f"{transport} {c.id}"
    assert_clean_error(message, where)
    if c.triton:
        assert f"input '{c.field}'" in message, f"{where}: {message[:400]!r}"
        if status is not None:
            assert status == 400, f"{where}: HTTP {status} {message[:300]!r}"
        return
    if status is not None:
        assert status == 400, f"{where}: HTTP {status} {message[:300]!r}"
    assert wire_code(message) == "INVALID_ARG", f"{where}: status not INVALID_ARG: " \
                                                f"{message[:400]!r}"
    assert f"{c.field}:" in message, f"{where}: does not name {c.field}: {message[:400]!r}"
    assert c.says.lower() in message.lower(), f"{where}: no {c.says!r} in {message[:400]!r}"


@pytest.mark.parametrize("c, transport", _params())
def test_bad_input_is_a_named_error_and_nothing_breaks(target, c, transport):
    ok = False
    try:
        if transport == "grpc":
            a = grpc_ask(target.grpc, c.inputs)
            if c.ok:
                check_answers(a, c.id)
            else:
                assert a.error is not None, f"{c.id}: accepted ({a.finish_reason!r}, {a.plan})"
                _check_error(c, transport, a.error, None)
        else:
            status, body = http_call(target.http, c.http_body(), stream=transport == "sse")
            if c.ok:
                events = sse_events(body)
                assert status == 200 and events, f"{c.id}: HTTP {status} {body[:300]!r}"
                assert not any("error" in e for e in events), assert_clean_error(body, c.id)
                assert events[-1].get("finish_reason") in ("service", "stop", "length"), body
            else:
                _check_error(c, transport, body, status)
        assert is_ready(target.http), f"{MODEL} not ready after {c.id}"
        check_answers(grpc_ask(target.grpc, {"question": CHEAP}), f"good request after {c.id}")
        if len(RESULTS) % FULL_ANSWER_EVERY == FULL_ANSWER_EVERY - 1:
            check_answers(grpc_ask(target.grpc, {"question": PRODUCT}),
                          f"product answer after {c.id}", products=True)
        ok = True
    finally:
        RESULTS.append(ok)


def test_zz_alongside_stream_ran_and_engines_hold_nothing(stack, target):
    target.alongside.stop()
    side = target.alongside
    assert not side.errors, f"good streams alongside failed: {side.errors[:3]}"
    assert side.done > 0, "no good stream finished alongside the bad inputs"
    for engine in ENGINES:
        assert wait_for(lambda e=engine: metric_value(scrape(stack), "rufus_engine_requests",
                                                      model=e) == 0, timeout=30), \
            f"{engine} still holds requests after the bad-input run (leak)"
    for model in (MODEL, *ENGINES):
        assert is_ready(target.http, model), f"{model} not ready at the end"
    check_answers(grpc_ask(target.grpc, {"question": PRODUCT}), "product answer at the end",
                  products=True)
    tried, passed = len(RESULTS), sum(RESULTS)
    print(f"\nadversarial {MODEL}: {tried} cases tried, {passed} passed "
          f"({side.done} good streams alongside)")
    (stack.log_path.parent / f"adversarial-{MODEL}.json").write_text(
        json.dumps({"tried": tried, "passed": passed, "at": time.time()}))
