"""The OpenAI-compatible frontend with the official ``openai`` client against the real stack:
the session's tritonserver (rufus_llm, real default model) behind ``python -m rufus.frontend``.

A second frontend points at a port where no Triton listens: the "unit down" case (503).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from rufus.launch.server import free_port
from rufus.launch.stack import start_frontend, stop_process

from .conftest import ADMISSION_LIMIT, metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_llm"
CHAT = [{"role": "user", "content": "Name three fruits."}]


def _get(url: str) -> tuple[int, str, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}
    except (urllib.error.URLError, OSError):
        return 0, "", {}


def _frontend(log_dir, name: str, grpc_url: str, extra: list[str] | None = None):
    port = free_port()
    proc = start_frontend(grpc_url, port, "rufus_llm", extra_args=extra,
                          log_path=str(log_dir / f"{name}.log"))
    base = f"http://127.0.0.1:{port}"
    if not wait_for(lambda: _get(base + "/v1/models")[0] == 200, timeout=60):
        stop_process(proc)
        raise RuntimeError((log_dir / f"{name}.log").read_text()[-3000:])
    return proc, base


@pytest.fixture(scope="session")
def frontend(llm_server, log_dir):
    proc, base = _frontend(log_dir, "frontend", f"127.0.0.1:{llm_server.grpc_port}")
    assert wait_for(lambda: _get(base + "/health")[0] == 200, timeout=30)
    yield base
    stop_process(proc)


@pytest.fixture(scope="session")
def frontend_no_triton(log_dir):
    """A frontend whose Triton is down (nothing listens on its gRPC port)."""
    proc, base = _frontend(log_dir, "frontend-down", f"127.0.0.1:{free_port()}",
                           ["--retries", "1"])
    yield base
    stop_process(proc)


@pytest.fixture(scope="session")
def client(frontend):
    return openai.OpenAI(base_url=frontend + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def aclient_factory(frontend):
    return lambda: openai.AsyncOpenAI(base_url=frontend + "/v1", api_key="unused",
                                      max_retries=0, timeout=300)


def _engine_idle(server) -> bool:
    m = scrape(server)
    return (metric_value(m, "rufus_engine_requests", model=MODEL) == 0
            and metric_value(m, "rufus_requests_outstanding", model=MODEL) == 0)


# ------------------------------------------------------------------------ basics
def test_models_and_health(client, frontend):
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids
    assert client.models.retrieve(MODEL).id == MODEL
    status, body, _ = _get(frontend + "/health")
    assert status == 200 and json.loads(body)["models"][MODEL] == "ready"


def test_chat_non_streaming_and_streaming_agree(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12,
                                          temperature=0)
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert full.usage.prompt_tokens > 5 and 0 < full.usage.completion_tokens <= 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == choice.finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streaming_and_not(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert full.object == "text_completion" and full.choices[0].text
    assert full.usage.completion_tokens <= 8
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    echo = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                     echo=True)
    assert echo.choices[0].text == prompt + full.choices[0].text
    two = client.completions.create(model=MODEL, prompt=[prompt, "Hello"], n=2, max_tokens=4,
                                    temperature=0.8, seed=1)
    assert sorted(c.index for c in two.choices) == [0, 1, 2, 3]


def test_stop_strings(client):
    prompt = "Count: 1, 2, 3,"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    text = free.choices[0].text
    assert len(text) > 6, text
    stop = text[3:6]
    cut = text[:text.index(stop)]
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                        temperature=0, stop=[stop])
    assert stopped.choices[0].text == cut
    assert stopped.choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 2
        # greedy: the sampled token is the most likely one
        assert tok.top_logprobs[0].logprob == pytest.approx(tok.logprob, abs=1e-4)
    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0,
                                  logprobs=1)
    assert len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens


# ------------------------------------------------------------------------ errors
def test_errors_with_a_good_stream_alongside(client, frontend):
    good = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24,
                                          temperature=0, stream=True)
    it = iter(good)
    next(it)
    for kwargs, param in [
        ({"temperature": 5}, "temperature"),
        ({"top_p": -1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -3}, "seed"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"n": 2, "stream": True}, "n"),
        ({"extra_body": {"bogus": 1}}, "bogus"),
    ]:
        args = {"model": MODEL, "messages": CHAT, **kwargs}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**args)
        assert info.value.status_code == 400
        assert info.value.body["param"] == param, info.value.body
        assert param in info.value.body["message"], info.value.body
    # caught by rufus_llm itself (needs the tokenizer): the prompt is over the context
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="word " * 3000, max_tokens=4)
    assert info.value.body["param"] == "prompt" and "context" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-nope", messages=CHAT)
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    raw = urllib.request.Request(frontend + "/v1/chat/completions", data=b"{nope",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(raw, timeout=10)
    assert http.value.code == 400 and "error" in json.loads(http.value.read())
    # the good stream was not disturbed
    rest = "".join(c.choices[0].delta.content or "" for c in it if c.choices)
    assert rest


def test_unit_down_is_503_with_retry_after(frontend_no_triton):
    c = openai.OpenAI(base_url=frontend_no_triton + "/v1", api_key="x", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as info:
            r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                          stream=stream)
            list(r) if stream else None
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "1"
        assert info.value.body["type"] == "server_error"
    status, _, headers = _get(frontend_no_triton + "/health")
    assert status == 503 and headers.get("retry-after") == "1"


def test_at_capacity_is_503_and_abandoned_streams_free_the_engine(
        llm_server, aclient_factory, frontend):
    """ADMISSION_LIMIT streams fill rufus_llm's admission bound; one more is refused with 503;
    closing the HTTP streams cancels every Triton request (the engine is idle again)."""

    async def hold(ac) -> None:
        stream = await ac.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=900, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        async for _ in stream:
            pass

    async def scenario() -> None:
        ac = aclient_factory()
        # not awaited: streams beyond vLLM's max_num_seqs wait for a slot before any token
        holders = [asyncio.create_task(hold(ac)) for _ in range(ADMISSION_LIMIT)]
        try:
            def full() -> bool:
                return metric_value(scrape(llm_server), "rufus_requests_outstanding",
                                    model=MODEL) >= ADMISSION_LIMIT
            assert await asyncio.to_thread(wait_for, full, 60)
            assert not any(t.done() for t in holders), [t for t in holders if t.done()]
            with pytest.raises(openai.InternalServerError) as info:
                await ac.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
            assert info.value.status_code == 503 and "capacity" in info.value.body["message"]
            assert info.value.response.headers["retry-after"] == "1"
        finally:
            for t in holders:  # the HTTP clients go away
                t.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            await ac.close()

    asyncio.run(scenario())
    time.sleep(1.0)  # gauges are published every 0.5 s
    assert wait_for(lambda: _engine_idle(llm_server), timeout=30), "closed streams still held"


def test_mid_stream_abort_frees_the_engine_slot(llm_server, client, frontend):
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=900,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    it = iter(stream)
    for _ in range(4):  # it is really generating
        next(it)
    assert wait_for(lambda: metric_value(scrape(llm_server), "rufus_engine_requests",
                                         model=MODEL) >= 1, timeout=5)
    stream.close()  # the HTTP client goes away mid-stream
    assert wait_for(lambda: _engine_idle(llm_server), timeout=15), \
        "aborted request still held by vLLM"
    _, text, _ = _get(frontend + "/metrics")
    assert metric_value(text, "rufus_openai_requests_in_flight") == 0


def test_non_streaming_client_that_gives_up_frees_the_engine_slot(llm_server, client):
    impatient = client.with_options(timeout=3.0)
    with pytest.raises(openai.APITimeoutError):  # the client closes its connection
        impatient.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=900,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert wait_for(lambda: _engine_idle(llm_server), timeout=15), \
        "abandoned non-streaming request still held by vLLM"


def test_sixteen_concurrent_streams(aclient_factory, frontend):
    async def one(ac, i: int) -> tuple[str, int]:
        text, usage = "", None
        stream = await ac.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say a word about {i}."}],
            max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True})
        async for c in stream:
            if c.choices:
                text += c.choices[0].delta.content or ""
            if c.usage:
                usage = c.usage.completion_tokens
        return text, usage

    async def run() -> list[tuple[str, int]]:
        ac = aclient_factory()
        try:
            return await asyncio.gather(*[one(ac, i) for i in range(16)])
        finally:
            await ac.close()

    results = asyncio.run(run())
    assert len(results) == 16
    assert all(text and 0 < n <= 16 for text, n in results), results
    _, metrics, _ = _get(frontend + "/metrics")
    assert metric_value(metrics, "rufus_openai_requests_total", endpoint="chat",
                        status="200") >= 16
    assert metric_value(metrics, "rufus_openai_time_to_first_token_seconds_count",
                        endpoint="chat") >= 16
