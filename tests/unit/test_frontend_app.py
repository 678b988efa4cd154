"""The frontend app in-process (no Triton): model listing, errors, the rufus-assistant hook's
chunk shapes with a fake pipeline, authentication. The real stack: tests/integration/
test_openai.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from fastapi.testclient import TestClient

from rufus.assistant.pipeline import (
    AssistantEvent,
    DoneEvent,
    PlanEvent,
    ProductsEvent,
    TextEvent,
)
from rufus.frontend import targets
from rufus.frontend.app import Settings, create_app
from rufus.frontend.assistant_hook import AssistantHook, card_markdown, split_messages
from rufus.frontend.protocol import APIError

CARD = {"id": "p1", "title": "Trail Runner [2]", "brand": "Acme", "price": 59.5, "rating": 4.25,
        "url": "https://shop.example/p1", "image_url": "https://shop.example/p1.jpg"}


class FakeAssistant:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []
        self.keys: list[str | None] = []

    async def stream(self, question, history, conversation=None, ticket=None, span=None
                     ) -> AsyncIterator[AssistantEvent]:
        self.calls.append((question, history))
        self.keys.append(conversation)
        yield PlanEvent(plan={"intent": "product_search"})
        yield ProductsEvent(products=[CARD], path="products")
        yield TextEvent(text="Try [Trail Runner](https://shop.example/p1).")
        yield DoneEvent(finish_reason="stop")


@pytest.fixture
def fake_assistant(monkeypatch):
    fake = FakeAssistant()

    async def get(self):
        return fake

    monkeypatch.setattr(AssistantHook, "assistant", get)
    monkeypatch.setattr(targets, "HOOKS", dict(targets.HOOKS))
    return fake


@pytest.fixture
def app_client(fake_assistant):
    app = create_app(Settings(triton_url="127.0.0.1:1", retries=0))
    with TestClient(app) as c:
        yield c


def test_card_markdown_and_messages_split():
    md = card_markdown([CARD])
    assert md == ("1. [Trail Runner (2)](https://shop.example/p1) - Acme, $59.50, 4.2 stars\n\n")
    assert card_markdown([]) == ""
    q, hist = split_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                              {"role": "assistant", "content": "b"},
                              {"role": "user", "content": "c"}])
    assert q == "c" and hist == [{"role": "user", "content": "a"},
                                 {"role": "assistant", "content": "b"}]
    with pytest.raises(APIError):
        split_messages([{"role": "system", "content": "s"}])


def test_models_lists_triton_models_and_the_assistant(app_client):
    ids = [m["id"] for m in app_client.get("/v1/models").json()["data"]]
    assert ids == ["rufus_llm", "rufus-assistant"]
    r = app_client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_assistant_streams_cards_as_links_and_extension(app_client, fake_assistant):
    r = app_client.post("/v1/chat/completions", json={
        "model": "rufus-assistant", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                     {"role": "user", "content": "running shoes"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["x_rufus_products"] == [CARD]
    assert chunks[0]["x_rufus_plan"]["intent"] == "product_search"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.startswith("1. [Trail Runner (2)](https://shop.example/p1)")
    assert text.endswith("Try [Trail Runner](https://shop.example/p1).")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 0
    assert fake_assistant.calls == [("running shoes", [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "yo"}])]


def test_assistant_non_streaming(app_client):
    r = app_client.post("/v1/chat/completions", json={
        "model": "rufus-assistant", "messages": [{"role": "user", "content": "shoes"}]})
    body = r.json()
    assert r.status_code == 200 and body["x_rufus_products"] == [CARD]
    assert "[Trail Runner (2)]" in body["choices"][0]["message"]["content"]


def test_assistant_gets_the_conversation_key(app_client, fake_assistant):
    """prompt_cache_key (or the x-rufus-conversation header, or user) becomes the hashed
    key the assistant sends with its answer-model calls."""
    from rufus.frontend.protocol import conversation_key

    msgs = [{"role": "user", "content": "shoes"}]
    app_client.post("/v1/chat/completions", json={
        "model": "rufus-assistant", "messages": msgs, "prompt_cache_key": "conv-9"})
    app_client.post("/v1/chat/completions", json={"model": "rufus-assistant", "messages": msgs},
                    headers={"x-rufus-conversation": "conv-9"})
    app_client.post("/v1/chat/completions", json={"model": "rufus-assistant", "messages": msgs})
    assert fake_assistant.keys == [conversation_key("conv-9", None, None),
                                   conversation_key(None, "conv-9", None), None]


def test_assistant_is_chat_only(app_client):
    r = app_client.post("/v1/completions", json={"model": "rufus-assistant", "prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_errors_have_openai_shape(app_client):
    r = app_client.post("/v1/chat/completions", json={"model": "rufus_llm", "messages": [],
                                                      "temperature": 1})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = app_client.post("/v1/chat/completions", content=b"\xff\xfe")
    assert r.status_code == 400
    r = app_client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert "rufus_openai_requests_total" in app_client.get("/metrics").text


def test_triton_down_is_503(app_client):
    r = app_client.post("/v1/chat/completions", json={
        "model": "rufus_llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "server_error"
    h = app_client.get("/health")
    assert h.status_code == 503 and h.json()["status"] == "unavailable"


def test_api_key(fake_assistant):
    app = create_app(Settings(triton_url="127.0.0.1:1", api_key="k1", hooks=False))
    with TestClient(app) as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        assert c.get("/metrics").status_code == 200


def test_assistant_refusal_is_a_503_with_retry_after(app_client, fake_assistant):
    """The assistant's SLO admission refuses (Unavailable) before any event: streaming or
    not, the client gets 503 with Retry-After, retryable, before any byte of a stream."""
    from rufus.errors import Unavailable

    async def refuse(question, history, conversation=None, ticket=None, span=None):
        raise Unavailable("overloaded: first answer text estimated in 2.00 s")
        yield  # pragma: no cover

    fake_assistant.stream = refuse
    for stream in (True, False):
        r = app_client.post("/v1/chat/completions", json={
            "model": "rufus-assistant", "stream": stream,
            "messages": [{"role": "user", "content": "shoes"}]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["code"] == "service_unavailable"


def test_assistant_usage_is_the_answer_models(app_client, fake_assistant):
    """stream_options.include_usage (and the non-streaming body) report the answer model's
    prompt and generated tokens, as vLLM's server reports its model's."""
    async def stream(question, history, conversation=None, ticket=None, span=None):
        yield PlanEvent(plan={"intent": "product_search"})
        yield ProductsEvent(products=[CARD], path="products")
        yield TextEvent(text="1. [x](https://shop.example/p1) — $59.50, 4.2 stars.")
        yield DoneEvent(finish_reason="stop",
                        timings={"answer_tokens": 9.0, "answer_prompt_tokens": 212.0})

    fake_assistant.stream = stream
    r = app_client.post("/v1/chat/completions", json={
        "model": "rufus-assistant", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "shoes"}]})
    last = json.loads([e for e in r.text.split("\n\n") if e][-2].removeprefix("data: "))
    assert last["usage"] == {"prompt_tokens": 212, "completion_tokens": 9, "total_tokens": 221}
    r = app_client.post("/v1/chat/completions", json={
        "model": "rufus-assistant", "messages": [{"role": "user", "content": "shoes"}]})
    assert r.json()["usage"]["completion_tokens"] == 9


def test_the_assistant_is_built_at_start_and_its_admission_is_in_metrics(app_client, fake_assistant):
    """The frontend builds rufus-assistant as it starts (the first turn does not wait for the
    product index), and /metrics carries that assistant's admission series."""
    hook = app_client.app.state.frontend.hooks["rufus-assistant"]
    hook.series.estimate(0.42)
    hook.series.estimate_error(-0.05)
    text = app_client.get("/metrics").text
    assert "rufus_openai_assistant_first_token_estimate_seconds 0.42" in text
    assert 'rufus_openai_assistant_first_token_estimate_error_seconds_bucket{le="0.0"} 1.0' in text
    assert "rufus_openai_requests" in text  # the frontend's own series still first


def test_a_hook_that_fails_to_build_at_start_still_serves(monkeypatch):
    async def broken(self):
        raise OSError("catalog index unreadable")

    monkeypatch.setattr(AssistantHook, "assistant", broken)
    monkeypatch.setattr(targets, "HOOKS", dict(targets.HOOKS))
    with TestClient(create_app(Settings(triton_url="127.0.0.1:1", retries=0))) as c:
        assert c.get("/v1/models").status_code == 200
