"""Hostile inputs against the real server, both models, gRPC and HTTP (issue 12, bad input).

Every case sends one bad request and checks that the error names the field
(``<field>: <reason>``), that the model is still ready and that a good request right after
succeeds. A good stream runs alongside the whole suite for each model, and at the end
vLLM holds no request (``rufus_engine_requests`` back to 0: the requests vLLM used to leak,
``top_k`` beyond 2^64 and a lone-surrogate ``stop``, are among the cases). Transports:
tritonclient gRPC streaming (every case), HTTP ``/v2/models/<m>/generate`` (every case a
JSON body can carry) and ``generate_stream`` (a subset). The counts are printed at the end
(``adversarial: N cases tried, M passed``).

rufus_llm uses the shared ``llm_server``, rufus_qp_medusa the shared ``stack``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from rufus.launch.server import TritonServer

from .conftest import metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
LLM, QP = "rufus_llm", "rufus_qp_medusa"
RESULTS: dict[str, list[bool]] = {LLM: [], QP: []}


@dataclass
class Case:
    id: str
    inputs: dict[str, Any]
    field: str
    params: dict[str, Any] | None = None
    http: bool = True      # a JSON body can carry it
    stream_http: bool = False  # also sent to generate_stream
    extra: dict[str, Any] = field(default_factory=dict)


def sp(obj: Any) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj)


def llm(id: str, sampling: Any = None, field: str = "", **kw: Any) -> Case:
    inputs = {"text_input": "hello", "stream": False}
    if sampling is not None:
        inputs["sampling_parameters"] = sp(sampling)
    inputs.update(kw.pop("inputs", {}))
    inputs = {k: v for k, v in inputs.items() if v is not None}
    return Case(id, inputs, field, **kw)


DEEP = "[" * 3000 + "]" * 3000
LONG_PROMPT = "shoes " * 1500  # > max_model_len (1024) tokens in the test server
CHAT = [{"role": "user", "content": "hi"}]


def msgs(value: Any) -> dict[str, Any]:
    return {"text_input": None, "messages": value if isinstance(value, str) else json.dumps(value)}


LLM_CASES = [
    llm("missing prompt", inputs={"text_input": None}, field="text_input", stream_http=True),
    llm("prompt and messages", inputs={"messages": json.dumps(CHAT)}, field="messages"),
    llm("empty prompt", inputs={"text_input": "   "}, field="text_input", stream_http=True),
    llm("non-UTF-8 prompt", inputs={"text_input": b"\xff\xfe\xfa"}, field="text_input",
        http=False),
    llm("surrogate bytes prompt", inputs={"text_input": b"a\xed\xa0\x80"}, field="text_input",
        http=False),
    # Triton itself refuses a shape the config does not declare, naming the input
    llm("two-element prompt", inputs={"text_input": np.array([b"a", b"b"], dtype=np.object_)},
        field="text_input", http=False, extra={"triton": True}),
    llm("prompt over the context", inputs={"text_input": LONG_PROMPT}, field="text_input",
        stream_http=True),
    llm("prompt over max_input_bytes", inputs={"text_input": "x" * ((1 << 20) + 10)},
        field="text_input"),
    llm("stream with exclude false", inputs={"stream": True, "exclude_input_in_output": False},
        field="exclude_input_in_output", stream_http=True),
    llm("sampling not JSON", "{oops", "sampling_parameters", stream_http=True),
    llm("sampling not object", [1, 2], "sampling_parameters"),
    llm("sampling unknown key", {"max_tokenz": 3}, "sampling_parameters"),
    llm("sampling deep nesting", '{"stop": ' + DEEP + "}", "sampling_parameters",
        stream_http=True),
    llm("sampling over size", " " * (300 << 10) + "{}", "sampling_parameters"),
    llm("max_tokens word", {"max_tokens": "many"}, "sampling_parameters.max_tokens"),
    llm("max_tokens 0", {"max_tokens": 0}, "sampling_parameters.max_tokens"),
    llm("max_tokens fraction", {"max_tokens": 1.5}, "sampling_parameters.max_tokens"),
    llm("max_tokens 2^64", {"max_tokens": 2**64}, "sampling_parameters.max_tokens"),
    llm("temperature negative", {"temperature": -0.5}, "sampling_parameters.temperature"),
    llm("temperature above 2", {"temperature": 2.5}, "sampling_parameters.temperature",
        stream_http=True),
    llm("temperature nan text", {"temperature": "nan"}, "sampling_parameters.temperature"),
    llm("temperature infinite", '{"temperature": 1e999}', "sampling_parameters.temperature"),
    llm("top_p 0", {"top_p": 0.0}, "sampling_parameters.top_p"),
    llm("top_p above 1", {"top_p": 1.01}, "sampling_parameters.top_p"),
    llm("top_k beyond 2^64", {"top_k": 2**64 + 1}, "sampling_parameters.top_k", stream_http=True),
    llm("top_k -2", {"top_k": -2}, "sampling_parameters.top_k"),
    llm("top_k fraction", {"top_k": 1.5}, "sampling_parameters.top_k"),
    llm("min_p 2", {"min_p": 2}, "sampling_parameters.min_p"),
    llm("presence_penalty 5", {"presence_penalty": 5}, "sampling_parameters.presence_penalty"),
    llm("frequency_penalty -3", {"frequency_penalty": -3},
        "sampling_parameters.frequency_penalty"),
    llm("repetition_penalty 0", {"repetition_penalty": 0},
        "sampling_parameters.repetition_penalty"),
    llm("seed negative", {"seed": -5}, "sampling_parameters.seed"),
    llm("seed 2^64", {"seed": 2**64}, "sampling_parameters.seed"),
    llm("stop lone surrogate", '{"stop": "\\ud800"}', "sampling_parameters.stop[0]",
        stream_http=True),
    llm("stop list surrogate", '{"stop": ["ok", "x\\udfff"]}', "sampling_parameters.stop[1]"),
    llm("stop not strings", {"stop": [1]}, "sampling_parameters.stop"),
    llm("stop empty", {"stop": ""}, "sampling_parameters.stop"),
    llm("stop 17 strings", {"stop": [f"s{i}" for i in range(17)]}, "sampling_parameters.stop"),
    llm("stop 2000 chars", {"stop": ["y" * 2000]}, "sampling_parameters.stop[0]"),
    llm("stop_token_ids beyond vocab", {"stop_token_ids": [49152]},
        "sampling_parameters.stop_token_ids", stream_http=True),
    llm("stop_token_ids negative", {"stop_token_ids": [-1]}, "sampling_parameters.stop_token_ids"),
    llm("stop_token_ids 2^70", {"stop_token_ids": [2**70]}, "sampling_parameters.stop_token_ids"),
    llm("stop_token_ids not list", {"stop_token_ids": "x"}, "sampling_parameters.stop_token_ids"),
    llm("n 2 greedy", {"n": 2, "temperature": 0}, "sampling_parameters.n", stream_http=True),
    llm("n 2 streaming", {"n": 2}, "sampling_parameters.n", inputs={"stream": True}),
    llm("n 17", {"n": 17}, "sampling_parameters.n"),
    llm("min_tokens above max_tokens", {"min_tokens": 9, "max_tokens": 8},
        "sampling_parameters.min_tokens"),
    llm("min_tokens above clamped max_tokens", {"min_tokens": 900, "max_tokens": 1000},
        "sampling_parameters.min_tokens", inputs={"text_input": "shoes " * 200},
        stream_http=True),
    llm("logprobs 21", {"logprobs": 21}, "sampling_parameters.logprobs"),
    llm("logprobs -1", {"logprobs": -1}, "sampling_parameters.logprobs"),
    llm("ignore_eos 1", {"ignore_eos": 1}, "sampling_parameters.ignore_eos"),
    llm("ignore_eos word", {"ignore_eos": "maybe"}, "sampling_parameters.ignore_eos"),
    llm("structured_outputs not JSON", {"structured_outputs": "{"},
        "sampling_parameters.structured_outputs"),
    llm("structured_outputs two constraints", {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        "sampling_parameters.structured_outputs"),
    llm("structured_outputs unknown key", {"structured_outputs": {"bogus": 1}},
        "sampling_parameters.structured_outputs"),
    llm("structured_outputs bad regex", {"structured_outputs": json.dumps({"regex": "(["})},
        "sampling_parameters.structured_outputs", stream_http=True),
    llm("structured_outputs deep schema", {"structured_outputs": {"json": DEEP}},
        "sampling_parameters.structured_outputs.json"),
    llm("structured_outputs empty choice", {"structured_outputs": {"choice": []}},
        "sampling_parameters.structured_outputs.choice"),
    llm("lora_name without LoRA", {"lora_name": "alpaca"}, "sampling_parameters.lora_name"),
    llm("lora_name not string", {"lora_name": 5}, "sampling_parameters.lora_name"),
    llm("param temperature word", params={"temperature": "hot"},
        field="sampling_parameters.temperature"),
    llm("param top_k huge", params={"top_k": "99999999999999999999999"},
        field="sampling_parameters.top_k", stream_http=True),
    llm("param unknown key", params={"bogus": 1}, field="sampling_parameters"),
    llm("param min_tokens above max", params={"min_tokens": 5, "max_tokens": 2},
        field="sampling_parameters.min_tokens"),
    llm("messages not JSON", inputs=msgs("not json"), field="messages", stream_http=True),
    llm("messages not list", inputs=msgs({"role": "user"}), field="messages"),
    llm("messages empty", inputs=msgs([]), field="messages"),
    llm("messages bad role", inputs=msgs([{"role": "robot", "content": "x"}]),
        field="messages[0].role"),
    llm("messages content number", inputs=msgs([{"role": "user", "content": 5}]),
        field="messages[0].content"),
    llm("messages extra key", inputs=msgs([{"role": "user", "content": "x", "tool": 1}]),
        field="messages[0]"),
    llm("messages last assistant", inputs=msgs([{"role": "assistant", "content": "x"}]),
        field="messages"),
    llm("messages all empty", inputs=msgs([{"role": "user", "content": " "}]), field="messages"),
    llm("messages deep nesting", inputs=msgs(DEEP), field="messages", stream_http=True),
    llm("messages content surrogate", inputs=msgs('[{"role": "user", "content": "hi \\ud800"}]'),
        field="messages[0].content", stream_http=True),
    llm("messages role surrogate", inputs=msgs('[{"role": "\\udc00", "content": "x"}]'),
        field="messages[0].role"),
    llm("messages 600 turns", inputs=msgs([{"role": "user", "content": "x"}] * 600),
        field="messages"),
    llm("messages entry not object", inputs=msgs(["hi"]), field="messages[0]"),
    llm("messages over the context", inputs=msgs([{"role": "user", "content": LONG_PROMPT}]),
        field="messages", stream_http=True),
    llm("messages over max_input_bytes",
        inputs=msgs([{"role": "user", "content": "x" * ((1 << 20) + 10)}]), field="messages"),
]


def qp(id: str, field: str, question: Any = "red running shoes", history: Any = None,
       sampling: Any = None, **kw: Any) -> Case:
    inputs: dict[str, Any] = {}
    if question is not None:
        inputs["question"] = question
    if history is not None:
        inputs["history"] = history if isinstance(history, str | bytes) else json.dumps(history)
    if sampling is not None:
        inputs["sampling_parameters"] = sp(sampling)
    return Case(id, inputs, field, **kw)


TURN = {"role": "user", "content": "x"}
QP_CASES = [
    qp("question missing", "question", question=None, stream_http=True),
    qp("question empty", "question", question="  "),
    qp("question non-UTF-8", "question", question=b"\xc3\x28", http=False),
    qp("question 5000 chars", "question", question="q" * 5000, stream_http=True),
    qp("question over max_input_bytes", "question", question="q" * ((1 << 20) + 10)),
    qp("history not JSON", "history", history="{oops", stream_http=True),
    qp("history not list", "history", history={"role": "user"}),
    qp("history deep nesting", "history", history=DEEP, stream_http=True),
    qp("history bad role", "history[0].role", history=[{"role": "robot", "content": "x"}]),
    qp("history content surrogate", "history[0].content",
       history='[{"role": "user", "content": "\\ud800"}]', stream_http=True),
    qp("history 9 turns", "history", history=[TURN] * 9),
    qp("history extra key", "history[0]", history=[{**TURN, "x": 1}]),
    qp("history over max_input_bytes", "history",
       history=[{"role": "user", "content": "x" * ((1 << 20) + 10)}]),
    qp("history over the context", "history",
       history=[{"role": "user", "content": "boots " * 800}] * 4, stream_http=True),
    qp("sampling temperature", "sampling_parameters", sampling={"temperature": 0.7},
       stream_http=True),
    qp("sampling max_tokens -1", "sampling_parameters.max_tokens", sampling={"max_tokens": -1}),
    qp("sampling max_tokens word", "sampling_parameters.max_tokens", sampling={"max_tokens": "x"}),
    qp("sampling logprobs 21", "sampling_parameters.logprobs", sampling={"logprobs": 21}),
    qp("sampling deep nesting", "sampling_parameters", sampling='{"a": ' + DEEP + "}"),
    qp("sampling not JSON", "sampling_parameters", sampling="{"),
    qp("param unknown key", "sampling_parameters", params={"top_k": 3}),
    qp("param max_tokens word", "sampling_parameters.max_tokens", params={"max_tokens": "lots"}),
]


# ------------------------------------------------------------------------- transports

def _tensor(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, bool):
        arr = np.array([value], dtype=bool)
    elif isinstance(value, bytes):
        arr = np.array([value], dtype=np.object_)
    else:
        arr = np.array([str(value).encode("utf-8")], dtype=np.object_)
    dtype = "BOOL" if arr.dtype == bool else "BYTES"
    inp = grpcclient.InferInput(name, list(arr.shape), dtype)
    inp.set_data_from_numpy(arr)
    return inp


def grpc_call(url: str, model: str, inputs: dict[str, Any], params: dict | None = None,
              timeout: float = 180) -> tuple[str | None, int]:
    """(error message or None, number of responses)."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer(model, [_tensor(k, v) for k, v in inputs.items()],
                                  parameters=params, enable_empty_final_response=True)
        n = 0
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                return str(error), n
            n += 1
            p = result.get_response().parameters.get("triton_final_response")
            if p is not None and p.bool_param:
                return None, n
    finally:
        client.stop_stream()
        client.close()


def http_call(base: str, model: str, inputs: dict[str, Any], params: dict | None,
              stream: bool) -> tuple[int, str]:
    body = dict(inputs)
    if params:
        body["parameters"] = params
    path = "generate_stream" if stream else "generate"
    req = urllib.request.Request(f"{base}/v2/models/{model}/{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def is_ready(base: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/v2/models/{model}/ready", timeout=10) as r:
            return r.status == 200
    except urllib.error.URLError:
        return False


# ------------------------------------------------------------------------- servers

@dataclass
class Target:
    model: str
    server: TritonServer
    good: dict[str, Any]
    good_params: dict[str, Any] | None = None

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"


@pytest.fixture(scope="module")
def qp_server(stack):
    """The session's stack serves the planner as configured (its own settings are the
    assistant's): the planner's cases run there, one server start fewer."""
    return stack


class Alongside:
    """A good request loop (streaming for rufus_llm) running beside the bad inputs."""

    def __init__(self, target: Target, inputs: dict[str, Any]) -> None:
        self.target, self.inputs = target, inputs
        self.done, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            err, n = grpc_call(self.target.grpc, self.target.model, self.inputs)
            if err is not None or n < 1:
                self.errors.append(err)
            else:
                self.done += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(240)


@pytest.fixture(scope="module")
def targets(llm_server, qp_server):
    t = {
        LLM: Target(LLM, llm_server, {"text_input": "Hello", "stream": False,
                                      "sampling_parameters": '{"max_tokens": 2}'}),
        QP: Target(QP, qp_server, {"question": "red running shoes",
                                   "sampling_parameters": '{"max_tokens": 8}'}),
    }
    side = {
        LLM: Alongside(t[LLM], {"text_input": "Tell me about tents.", "stream": True,
                                "sampling_parameters": '{"max_tokens": 24, "temperature": 0}'}),
        QP: Alongside(t[QP], {"question": "waterproof hiking boots under 100 dollars",
                              "sampling_parameters": '{"max_tokens": 16}'}),
    }
    yield t, side
    for s in side.values():
        s.stop()


def _cases(model: str, cases: list[Case]) -> list[Any]:
    out = []
    for c in cases:
        out.append(pytest.param(model, c, "grpc", id=f"{model}-grpc-{c.id}"))
        if c.http:
            out.append(pytest.param(model, c, "http", id=f"{model}-http-{c.id}"))
        if c.http and c.stream_http:
            out.append(pytest.param(model, c, "http-stream", id=f"{model}-sse-{c.id}"))
    return out


ALL = _cases(LLM, LLM_CASES) + _cases(QP, QP_CASES)


@pytest.mark.parametrize("model, case, transport", ALL)
def test_bad_input_is_a_named_error_and_nothing_breaks(targets, model, case, transport):
    t = targets[0][model]
    ok = False
    try:
        if transport == "grpc":
            err, _ = grpc_call(t.grpc, model, case.inputs, case.params)
            assert err is not None, f"{case.id}: accepted"
            message = err
        else:
            status, body = http_call(t.http, model, case.inputs, case.params,
                                     stream=transport == "http-stream")
            if transport == "http":
                assert status == 400, f"{case.id}: HTTP {status} {body[:300]}"
            message = body
        if case.extra.get("triton"):
            assert f"input '{case.field}'" in message, f"{case.id}: {message[:400]}"
        else:
            assert f"{case.field}:" in message, f"{case.id}: {message[:400]}"
            assert "INVALID_ARG" in message or transport != "grpc", message[:300]
        assert len(message) < 2000, f"{case.id}: error echoes {len(message)} chars"
        assert is_ready(t.http, model), f"{model} not ready after {case.id}"
        err, n = grpc_call(t.grpc, model, t.good, t.good_params)
        assert err is None and n >= 1, f"good request after {case.id} failed: {err}"
        ok = True
    finally:
        RESULTS[model].append(ok)


@pytest.mark.parametrize("model", [LLM, QP])
def test_zz_alongside_streams_ran_and_engine_holds_nothing(targets, model):
    t, s = targets[0][model], targets[1][model]
    s.stop()
    assert not s.errors, f"{model}: good requests alongside failed: {s.errors[:3]}"
    assert s.done > 0
    assert wait_for(lambda: metric_value(scrape(t.server), "rufus_engine_requests",
                                         model=model) == 0, timeout=30), \
        f"{model}: vLLM still holds requests (leak)"
    assert is_ready(t.http, model)
    tried, passed = len(RESULTS[model]), sum(RESULTS[model])
    print(f"\nadversarial {model}: {tried} cases tried, {passed} passed")
    (t.server.log_path.parent / f"adversarial-{model}.json").write_text(
        json.dumps({"tried": tried, "passed": passed, "at": time.time()}))
