"""Hostile requests against the OpenAI-compatible frontend's routes (issue: bad input, OpenAI).

Routes: ``/v1/chat/completions`` and ``/v1/completions`` with model ``rufus_llm``, and chat
completions with model ``rufus-assistant`` (the assistant pipeline). Each case sends one bad
request and checks: an HTTP 4xx with OpenAI's error body ``{"error": {"message", "type",
"param", "code"}}``, ``param`` naming the parameter where there is one (and the message
naming it too), no traceback or server path in the body (``conftest.assert_clean_error``),
the frontend still healthy, and a good request right after succeeding. Requests a JSON object
can carry go through the official ``openai`` client (the body exactly as given, through
``extra_body``; the client raises ``openai.BadRequestError`` etc.); malformed bodies (not
JSON, not an object, 100,000 levels deep, 20 MB, invalid UTF-8) through raw httpx.

A good stream (rufus_llm and rufus-assistant in turn) runs alongside every bad request and
must finish normally each time. Then clients that go away (mid-stream after one chunk, or
before the first byte) must leave nothing behind: ``rufus_engine_requests`` of rufus_llm and
rufus_qp_medusa back to 0, the frontend's in-flight gauge back to 0, and the next request
succeeds. Prints ``adversarial openai: N cases tried, M passed``.

Uses the session ``stack`` and ``assistant_frontend`` (conftest.py), shared with
test_assistant.py: no server of its own.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from .conftest import assert_clean_error, metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
LLM, ASSISTANT = "rufus_llm", "rufus-assistant"
ENGINES = ("rufus_llm", "rufus_qp_medusa")
RESULTS: list[bool] = []
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

HI = [{"role": "user", "content": "Name three fruits."}]
ORDER = [{"role": "user", "content": "where is my order"}]  # the assistant's fixed reply
DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000
LONG = "word " * 3000  # over rufus_llm's context (1024 tokens in the test stack)


@dataclass
class Case:
    id: str
    route: str                          # chat | completions | a path
    body: dict[str, Any] | bytes        # dict: the openai client sends it; bytes: raw httpx
    param: str | None                   # the param the error names; None: there is none
    status: int = 400
    says: str = ""                      # a word the message must contain (case-insensitive)
    method: str = "POST"
    params: tuple[str | None, ...] = ()  # other acceptable params (see the case's comment)
    good_model: str = ""                # the good request's model (default: the body's)

    @property
    def path(self) -> str:
        return PATHS.get(self.route, self.route)

    @property
    def model(self) -> str:
        m = self.body.get("model") if isinstance(self.body, dict) else self.good_model
        return ASSISTANT if m == ASSISTANT else LLM


def chat(id: str, param: str | None, model: str = LLM, messages: Any = None, **fields: Any
         ) -> Case:
    kw = {k: fields.pop(k) for k in ("status", "says", "params") if k in fields}
    body = {"model": model, "messages": HI if messages is None else messages, **fields}
    return Case(id, "chat", body, param, **kw)


def asst(id: str, param: str | None, messages: Any = None, **fields: Any) -> Case:
    c = chat(id, param, ASSISTANT, ORDER if messages is None else messages, **fields)
    c.id = f"assistant {id}"
    return c


def comp(id: str, param: str | None, prompt: Any = "The capital of France is", **fields: Any
         ) -> Case:
    kw = {k: fields.pop(k) for k in ("status", "says", "params") if k in fields}
    body = {"model": LLM, "prompt": prompt, **fields}
    return Case(f"completions {id}", "completions", body, param, **kw)


def raw(id: str, body: bytes | str, param: str | None = None, route: str = "chat",
        **kw: Any) -> Case:
    return Case(id, route, body.encode() if isinstance(body, str) else body, param, **kw)


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def rawjson(**fields: Any) -> str:
    """A chat body as JSON text, for values json.dumps cannot write (1e999, NaN)."""
    return json.dumps({"model": LLM, "messages": HI}).rstrip("}") + "".join(
        f', "{k}": {v}' for k, v in fields.items()) + "}"


CASES = [
    # ------------------------------------------------------------------ the body itself
    raw("body not JSON", "{nope", says="JSON"),
    raw("body empty", b""),
    raw("body JSON array", "[]", says="object"),
    raw("body array of a request", json.dumps([{"model": LLM, "messages": HI}]), says="object"),
    raw("body number", "5", says="object"),
    raw("body string", '"hi"', says="object"),
    raw("body null", "null", says="object"),
    raw("completions body array", "[]", route="completions", says="object"),
    raw("body deep arrays", DEEP),
    raw("body deep objects", DEEP_OBJECT),
    raw("completions body deep", DEEP, route="completions"),
    raw("body deep in content", json.dumps({"model": LLM, "messages": None})
        .replace("null", '[{"role": "user", "content": ' + DEEP + "}]")),
    raw("assistant body deep", json.dumps({"model": ASSISTANT, "messages": None})
        .replace("null", '[{"role": "user", "content": ' + DEEP + "}]"), good_model=ASSISTANT),
    raw("body invalid UTF-8", b'{"model": "rufus_llm", "messages": [{"role": "user", '
                              b'"content": "\xff\xfe"}]}'),
    # a lone surrogate escape: the JSON parser refuses the body (no param), or the
    # content check names the content; either is a 400
    raw("body lone surrogate in content",
        '{"model": "rufus_llm", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
        param="messages[0].content", params=(None,)),
    raw("assistant lone surrogate in question",
        '{"model": "rufus-assistant", "messages": [{"role": "user", "content": "\\ud800"}]}',
        param="messages[0].content", params=(None,), good_model=ASSISTANT),
    raw("body 20 MB", json.dumps({"model": LLM, "messages": user("x" * (20 << 20))}),
        status=413),
    raw("assistant body 20 MB", json.dumps({"model": ASSISTANT,
                                            "messages": user("x" * (20 << 20))}),
        status=413, good_model=ASSISTANT),
    raw("completions body 20 MB", json.dumps({"model": LLM, "prompt": "x" * (20 << 20)}),
        route="completions", status=413),
    raw("temperature 1e999", rawjson(temperature="1e999"), param="temperature"),
    raw("temperature NaN", rawjson(temperature="NaN"), param="temperature"),
    raw("chat GET", b"", method="GET", status=405),
    raw("unknown route", "{}", route="/v1/chat/completion", status=404),
    # ------------------------------------------------------------------ model
    chat("model unknown", "model", model="gpt-4o", status=404),
    chat("model number", "model", model=5),
    chat("model missing", "model", model=openai.omit, says="required"),
    chat("model empty", "model", model="", status=404),
    comp("model rufus-assistant", "model", model=ASSISTANT, says="chat"),
    comp("model unknown", "model", model="davinci-002", status=404),
    # ------------------------------------------------------------------ sampling parameters
    chat("temperature word", "temperature", temperature="hot"),
    chat("temperature negative", "temperature", temperature=-0.1),
    chat("temperature 2.5", "temperature", temperature=2.5),
    chat("temperature list", "temperature", temperature=[1]),
    chat("top_p negative", "top_p", top_p=-1),
    chat("top_p 1.5", "top_p", top_p=1.5),
    chat("top_p word", "top_p", top_p="x"),
    chat("n 0", "n", n=0),
    chat("n 17", "n", n=17),
    chat("n fraction", "n", n=1.5),
    chat("n word", "n", n="two"),
    chat("n 2 streaming", "n", n=2, stream=True),
    chat("max_tokens 0", "max_tokens", max_tokens=0),
    chat("max_tokens -1", "max_tokens", max_tokens=-1),
    chat("max_tokens fraction", "max_tokens", max_tokens=1.5),
    chat("max_tokens word", "max_tokens", max_tokens="many"),
    chat("max_tokens 2^64", "max_tokens", max_tokens=2**64),
    chat("max_completion_tokens 0", "max_completion_tokens", max_completion_tokens=0),
    chat("max_completion_tokens word", "max_completion_tokens", max_completion_tokens="x"),
    chat("max_tokens conflicts", "max_tokens", max_tokens=5, max_completion_tokens=6),
    chat("stop number", "stop", stop=5),
    chat("stop list of numbers", "stop", stop=[1]),
    chat("stop object", "stop", stop={"a": 1}),
    chat("stop empty", "stop", stop=""),
    chat("stop empty in list", "stop", stop=["ok", ""]),
    chat("stop 17 strings", "stop", stop=[f"s{i}" for i in range(17)]),
    chat("stop 2000 chars", "stop[0]", stop=["y" * 2000]),
    chat("seed negative", "seed", seed=-3),
    chat("seed 2^64", "seed", seed=2**64),
    chat("seed word", "seed", seed="x"),
    chat("seed fraction", "seed", seed=1.5),
    chat("presence_penalty 3", "presence_penalty", presence_penalty=3),
    chat("presence_penalty word", "presence_penalty", presence_penalty="x"),
    chat("frequency_penalty -2.5", "frequency_penalty", frequency_penalty=-2.5),
    chat("frequency_penalty list", "frequency_penalty", frequency_penalty=[0]),
    chat("logprobs 5", "logprobs", logprobs=5),
    chat("logprobs word", "logprobs", logprobs="x"),
    chat("top_logprobs 21", "top_logprobs", logprobs=True, top_logprobs=21),
    chat("top_logprobs -1", "top_logprobs", logprobs=True, top_logprobs=-1),
    chat("top_logprobs without logprobs", "top_logprobs", top_logprobs=2),
    chat("top_logprobs word", "top_logprobs", logprobs=True, top_logprobs="x"),
    chat("logit_bias", "logit_bias", logit_bias={"50256": -100}),
    chat("logit_bias not object", "logit_bias", logit_bias="x"),
    chat("logit_bias word value", "logit_bias.1", logit_bias={"1": "x"}),
    chat("stream_options without stream", "stream_options",
         stream_options={"include_usage": True}),
    chat("stream_options not object", "stream_options", stream=True, stream_options="x"),
    chat("stream_options unknown key", "stream_options.bogus", stream=True,
         stream_options={"bogus": 1}),
    chat("stream_options include_usage word", "stream_options.include_usage", stream=True,
         stream_options={"include_usage": "x"}),
    chat("stream word", "stream", stream="maybe"),
    chat("top_k -2", "top_k", top_k=-2),
    chat("min_p 2", "min_p", min_p=2),
    chat("repetition_penalty 0", "repetition_penalty", repetition_penalty=0),
    chat("min_tokens above max_tokens", "min_tokens", min_tokens=9, max_tokens=8),
    chat("ignore_eos word", "ignore_eos", ignore_eos="x"),
    chat("stop_token_ids negative", "stop_token_ids", stop_token_ids=[-1]),
    chat("stop_token_ids beyond vocab", "stop_token_ids", stop_token_ids=[49152]),  # rufus_llm
    chat("user number", "user", user=5),
    chat("tools", "tools", tools=[{"type": "function", "function": {"name": "f"}}]),
    chat("response_format json_object", "response_format",
         response_format={"type": "json_object"}),
    chat("unknown parameter", "bogus", bogus=1, says="Unrecognized"),
    # ------------------------------------------------------------------ messages
    chat("messages missing", "messages", messages=openai.omit, says="required"),
    chat("messages empty", "messages", messages=[]),
    chat("messages string", "messages", messages="hi"),
    chat("messages object", "messages", messages={"role": "user", "content": "hi"}),
    chat("messages entry string", "messages[0]", messages=["hi"]),
    chat("messages role robot", "messages[0].role", messages=[{"role": "robot", "content": "x"}]),
    chat("messages role tool", "messages[0].role", messages=[{"role": "tool", "content": "x"}]),
    chat("messages role number", "messages[0].role", messages=[{"role": 5, "content": "x"}]),
    chat("messages role missing", "messages[0].role", messages=[{"content": "x"}]),
    chat("messages content number", "messages[0].content", messages=user(5)),
    chat("messages content null", "messages[0].content", messages=user(None)),
    chat("messages content object", "messages[0].content", messages=user({"text": "x"})),
    chat("messages content image", "messages[0].content[0].type",
         messages=user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])),
    chat("messages content missing", "messages[0].content", messages=[{"role": "user"}]),
    chat("messages unknown key", "messages[0].bogus",
         messages=[{"role": "user", "content": "x", "bogus": 1}]),
    chat("messages tool_calls", "messages[0].tool_calls",
         messages=[{"role": "assistant", "content": "x", "tool_calls": []}, *HI]),
    chat("messages last assistant", "messages",
         messages=[{"role": "assistant", "content": "x"}]),
    chat("messages all empty", "messages", messages=user("  ")),
    chat("messages 600", "messages", messages=HI * 600),
    chat("messages over the context", "messages", messages=user(LONG)),  # rufus_llm
    # ------------------------------------------------------------------ completions
    comp("prompt token ids", "prompt", prompt=[1, 2]),
    comp("prompt token id lists", "prompt", prompt=[[1, 2]]),
    comp("prompt empty list", "prompt", prompt=[]),
    comp("prompt number", "prompt", prompt=5),
    comp("prompt mixed list", "prompt", prompt=["a", 1]),
    comp("prompt null", "prompt", prompt=None),
    comp("prompt missing", "prompt", prompt=openai.omit, says="required"),
    comp("prompt empty", "prompt", prompt=""),
    comp("prompt whitespace in list", "prompt[1]", prompt=["ok", "  "]),
    comp("prompt 17 strings", "prompt", prompt=["a"] * 17),
    comp("prompt over the context", "prompt", prompt=LONG),  # rufus_llm
    comp("logprobs 21", "logprobs", logprobs=21),
    comp("logprobs -1", "logprobs", logprobs=-1),
    comp("logprobs word", "logprobs", logprobs="x"),
    comp("echo with logprobs", "echo", echo=True, logprobs=1),
    comp("suffix", "suffix", suffix="x"),
    comp("best_of 3", "best_of", best_of=3),
    comp("n 17", "n", n=17),
    comp("temperature 3", "temperature", temperature=3),
    comp("max_tokens 0", "max_tokens", max_tokens=0),
    comp("max_tokens word", "max_tokens", max_tokens="x"),
    comp("stop 17 strings", "stop", stop=[f"s{i}" for i in range(17)]),
    comp("seed -1", "seed", seed=-1),
    comp("stream_options without stream", "stream_options", stream_options={}),
    comp("logit_bias", "logit_bias", logit_bias={"1": 1}),
    comp("unknown parameter", "messages", messages=HI, says="Unrecognized"),
    # ------------------------------------------------------------------ rufus-assistant
    asst("n 2", "n", n=2),
    asst("n 2 streaming", "n", n=2, stream=True),
    asst("temperature 5", "temperature", temperature=5),
    asst("max_tokens 0", "max_tokens", max_tokens=0),
    asst("stream_options without stream", "stream_options",
         stream_options={"include_usage": True}),
    asst("tools", "tools", tools=[{"type": "function", "function": {"name": "f"}}]),
    asst("unknown parameter", "bogus", bogus=1),
    asst("messages empty", "messages", messages=[]),
    asst("messages last assistant", "messages",
         messages=[*ORDER, {"role": "assistant", "content": "x"}]),
    asst("messages only system", "messages", messages=[{"role": "system", "content": "x"}]),
    asst("question 1001 chars", "messages", messages=user("x" * 1001), says="1001"),
    asst("question 1001 chars streaming", "messages", messages=user("x" * 1001), stream=True),
    asst("question whitespace", "messages", messages=user(" \n ")),
    asst("messages role robot", "messages[0].role", messages=[{"role": "robot", "content": "x"}]),
    asst("messages content number", "messages[0].content", messages=user(5)),
    asst("messages content image", "messages[0].content[0].type",
         messages=user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])),
    asst("messages 600", "messages", messages=ORDER * 600),
]


# ------------------------------------------------------------------------- transports

def send(client: openai.OpenAI, base: str, c: Case) -> tuple[int, str]:
    """(HTTP status, body text) of one bad request; 0 when it was accepted."""
    if isinstance(c.body, bytes) or c.route not in PATHS:
        r = httpx.request(c.method, base + c.path, content=c.body,
                          headers={"Content-Type": "application/json"}, timeout=120)
        return r.status_code, r.text
    body = dict(c.body)
    try:
        # the typed arguments are placeholders: extra_body wins, so the body is exactly
        # c.body (openai.omit removes a key)
        if c.route == "chat":
            client.chat.completions.create(model="placeholder", messages=[], extra_body=body)
        else:
            client.completions.create(model="placeholder", prompt="", extra_body=body)
    except openai.APIStatusError as exc:
        return exc.status_code, exc.response.text
    return 0, ""


def good(client: openai.OpenAI, c: Case) -> None:
    """A good request on the case's route and model; it must answer."""
    if c.model == ASSISTANT:
        r = client.chat.completions.create(model=ASSISTANT, messages=ORDER)
        assert r.choices[0].message.content, r
    elif c.route == "completions":
        r = client.completions.create(model=LLM, prompt="The capital of France is",
                                      max_tokens=2, temperature=0)
        assert r.choices[0].text and r.choices[0].finish_reason in ("stop", "length"), r
    else:
        r = client.chat.completions.create(model=LLM, messages=HI, max_tokens=2, temperature=0)
        assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


def healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def frontend_metric(base: str, name: str, **labels: str) -> float:
    return metric_value(httpx.get(base + "/metrics", timeout=10).text, name, **labels)


def in_flight(base: str) -> float:
    return frontend_metric(base, "rufus_openai_requests_in_flight")


def gone_count(base: str, model: str) -> float:
    """Requests the frontend saw end because their client went away (status 499)."""
    return frontend_metric(base, "rufus_openai_requests_total", model=model, status="499")


def engines_idle(stack) -> bool:
    text = scrape(stack)
    return all(metric_value(text, "rufus_engine_requests", model=e) == 0
               and metric_value(text, "rufus_requests_outstanding", model=e) == 0
               for e in ENGINES)


# ------------------------------------------------------------------------- fixtures

class Alongside:
    """Good streams (rufus_llm, then rufus-assistant, in turn) beside the bad requests."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client = client
        self.done, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _one(self, model: str) -> None:
        kw: dict[str, Any] = ({"max_tokens": 24, "temperature": 0} if model == LLM else {})
        messages = HI if model == LLM else user("wireless earbuds under $50")
        chunks = list(self.client.chat.completions.create(model=model, messages=messages,
                                                          stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert text.strip() and finish and finish[-1] in ("stop", "length"), (model, chunks[-3:])

    def _run(self) -> None:
        while not self._stop.is_set():
            model = (LLM, ASSISTANT)[self.done % 2]
            try:
                self._one(model)
                self.done += 1
            except Exception as exc:  # noqa: BLE001 - collected, asserted later
                self.errors.append(f"{model}: {type(exc).__name__}: {exc}"[:600])
                self.done += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(300)


@pytest.fixture(scope="module")
def client(assistant_frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=assistant_frontend + "/v1", api_key="unused",
                         max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def alongside(client):
    side = Alongside(client)
    yield side
    side.stop()


# ------------------------------------------------------------------------- tests

@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_request_is_an_openai_error_and_nothing_breaks(assistant_frontend, client,
                                                           alongside, c):
    ok = False
    try:
        status, text = send(client, assistant_frontend, c)
        assert status, f"{c.id}: accepted"
        assert_clean_error(text, c.id)
        assert status == c.status, f"{c.id}: HTTP {status}, expected {c.status}: {text[:300]}"
        body = json.loads(text)
        assert set(body) == {"error"}, f"{c.id}: {text[:300]}"
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, f"{c.id}: {err}"
        assert isinstance(err["message"], str) and err["message"], f"{c.id}: {err}"
        assert err["type"] == "invalid_request_error", f"{c.id}: {err}"
        assert err["param"] in (c.param, *c.params), \
            f"{c.id}: param {err['param']!r}, expected {c.param!r}: {err['message']}"
        if err["param"]:
            assert err["param"] in err["message"], f"{c.id}: {err}"
        assert c.says.lower() in err["message"].lower(), f"{c.id}: no {c.says!r} in {err}"
        if status == 404 and err["param"] == "model":
            assert err["code"] == "model_not_found", f"{c.id}: {err}"
        assert healthy(assistant_frontend), f"frontend not healthy after {c.id}"
        good(client, c)
        ok = True
    finally:
        RESULTS.append(ok)


def test_alongside_streams_finished_normally(alongside):
    alongside.stop()
    assert not alongside.errors, f"good streams alongside failed: {alongside.errors[:3]}"
    assert alongside.done >= 2, "no good stream ran alongside the bad requests"


def _stream_body(model: str, route: str) -> dict[str, Any]:
    """A long request: 900 tokens take about 25 s on 2 idle cores, so a request a client
    left behind would still hold its engine slot when the check below gives up (15 s)."""
    if model == ASSISTANT:
        return {"model": ASSISTANT, "stream": True,
                "messages": user("tell me everything about winter jackets")}
    body: dict[str, Any] = {"model": LLM, "stream": True, "max_tokens": 900, "temperature": 0,
                            "ignore_eos": True}
    if route == "completions":
        return {**body, "prompt": "Once upon a time"}
    return {**body, "messages": HI}


def _gone_at_once(base: str, path: str, body: dict[str, Any]) -> None:
    """Send the whole request, then close the connection before any byte comes back."""
    u = urlsplit(base)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(0.05)


GONE = [
    ("chat rufus_llm, after one chunk", LLM, "chat", "chunk"),
    ("completions rufus_llm, after one chunk", LLM, "completions", "chunk"),
    ("chat rufus-assistant, after the first answer text", ASSISTANT, "chat", "text"),
    ("chat rufus_llm, before the first byte", LLM, "chat", "at once"),
    ("chat rufus_llm non-streaming, before the answer", LLM, "chat", "at once, whole"),
    ("chat rufus-assistant, before the first byte", ASSISTANT, "chat", "at once"),
]


@pytest.mark.parametrize("what, model, route, when", GONE, ids=[g[0] for g in GONE])
def test_client_gone_leaves_nothing_behind(stack, assistant_frontend, client, what, model,
                                           route, when):
    ok = False
    try:
        assert wait_for(lambda: engines_idle(stack), timeout=60), "engines busy before the case"
        gone0 = gone_count(assistant_frontend, model)
        body = _stream_body(model, route)
        if when.startswith("at once"):
            if when.endswith("whole"):
                body["stream"] = False
            _gone_at_once(assistant_frontend, PATHS[route], body)
        else:
            with httpx.Client(timeout=300) as h, \
                    h.stream("POST", assistant_frontend + PATHS[route], json=body) as r:
                assert r.status_code == 200, r.read()[:300]
                texts = 0
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if when == "chunk":
                        break
                    delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] \
                        else ""
                    texts += bool(delta)
                    if texts == 2:  # the cards' markdown came first; then the answer's text
                        break
            # leaving both blocks closes the response and the connection mid-stream
        # the request reached the frontend and ended as "client went away" (not vacuous)
        assert wait_for(lambda: gone_count(assistant_frontend, model) > gone0, timeout=30), \
            f"{what}: the frontend never saw the request end as cancelled (499)"
        time.sleep(1.0)  # gauges are published every 0.5 s
        assert wait_for(lambda: engines_idle(stack), timeout=15), \
            f"{what}: an engine still holds the request of a client that went away"
        assert wait_for(lambda: in_flight(assistant_frontend) == 0, timeout=15), \
            f"{what}: the frontend still counts the request in flight"
        assert healthy(assistant_frontend)
        good(client, Case(what, route, {"model": model}, None))
        ok = True
    finally:
        RESULTS.append(ok)


def test_zz_engines_hold_nothing(stack, assistant_frontend, client):
    assert wait_for(lambda: engines_idle(stack), timeout=30), \
        "an engine still holds requests after the bad-request run (leak)"
    assert in_flight(assistant_frontend) == 0
    for model in ("rufus_assistant", *ENGINES):
        assert stack.is_ready(model), f"{model} not ready at the end"
    stream = client.chat.completions.create(model=ASSISTANT, stream=True,
                                            messages=user("running shoes under $80"))
    chunks = list(stream)
    assert chunks[0].model_extra.get("x_rufus_products"), chunks[0]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    tried, passed = len(RESULTS), sum(RESULTS)
    print(f"\nadversarial openai: {tried} cases tried, {passed} passed")
    (stack.log_path.parent / "adversarial-openai.json").write_text(
        json.dumps({"tried": tried, "passed": passed, "at": time.time()}))
