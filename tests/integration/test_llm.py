"""rufus_llm through a real tritonserver over gRPC, with the real default model."""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from rufus.client import RequestFailed, build_inputs, generate

from .conftest import ADMISSION_LIMIT, metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_llm"
PROMPT = "The best way to keep running shoes clean is"
GREEDY = {"temperature": 0.0, "max_tokens": 24}


def run(url, prompt=PROMPT, **kw):
    chunks = list(generate(url, MODEL, prompt, **kw))
    return chunks


def text(chunks) -> str:
    return "".join(c.text for c in chunks)


@pytest.fixture(scope="module")
def reference(url) -> str:
    """Greedy non-streaming completion of PROMPT (input excluded)."""
    return text(run(url, stream=False, sampling=GREEDY, flags={"exclude_input_in_output": True}))


def test_streaming_is_incremental_and_matches_non_streaming(url, reference):
    chunks = run(url, stream=True, sampling=GREEDY)
    assert len(chunks) > 1, "streaming must deliver more than one response"
    assert text(chunks) == reference
    assert len(reference) > 0


def test_non_streaming_prepends_prompt_by_default(url, reference):
    out = text(run(url, stream=False, sampling=GREEDY))
    assert out == PROMPT + reference


def test_return_flags(url):
    flags = {k: True for k in ("return_finish_reason", "return_cumulative_logprob",
                               "return_logprobs", "return_num_input_tokens",
                               "return_num_output_tokens")}
    # "logprobs": 0 added for conformance (issue 13): like the official backend, the logprobs
    # output is JSON null unless sampling_parameters has a logprobs key.
    chunks = run(url, stream=False, sampling={"max_tokens": 5, "temperature": 0, "logprobs": 0},
                 flags=flags)
    (out,) = [c.outputs for c in chunks]
    assert out["finish_reason"][0] == b"length"
    assert out["num_output_tokens"][0] == 5
    assert out["num_input_tokens"][0] > 3
    assert out["cumulative_logprob"][0] < 0
    assert len(json.loads(out["logprobs"][0])) == 5
    streamed = run(url, stream=True, sampling={"max_tokens": 5, "temperature": 0}, flags=flags)
    assert sum(int(c.outputs["num_output_tokens"][0]) for c in streamed) == 5
    assert streamed[-1].outputs["finish_reason"][0] == b"length"


def test_sampling_parameters_as_request_parameters(url, reference):
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    inputs = build_inputs(grpcclient, PROMPT, stream=False,
                          flags={"exclude_input_in_output": True})
    client.async_stream_infer(MODEL, inputs, parameters={"max_tokens": 24, "temperature": 0.0})
    result, error = q.get(timeout=120)
    client.stop_stream()
    assert error is None, error
    assert result.as_numpy("text_output")[0].decode() == reference


def test_chat_messages_use_the_template(url):
    messages = [{"role": "system", "content": "You are a shopping assistant."},
                {"role": "user", "content": "Suggest a gift for a runner."}]
    chunks = list(generate(url, MODEL, messages=messages, stream=True,
                           sampling={"max_tokens": 16, "temperature": 0}))
    out = text(chunks)
    assert out and "<|im_start|>" not in out and "Suggest a gift" not in out


def test_sixteen_concurrent_streams(url):
    prompts = [f"Question {i}: what is a good {w}?" for i, w in
               enumerate(["tent", "laptop", "kettle", "bike"] * 4)]

    def one(p):
        return run(url, p, stream=True, sampling={"max_tokens": 16, "temperature": 0,
                                                   "ignore_eos": True},
                   flags={"return_num_output_tokens": True})

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, prompts))
    for chunks in results:
        assert sum(int(c.outputs["num_output_tokens"][0]) for c in chunks) == 16


BAD_INPUTS = [
    # (description, kwargs for generate, expected field in message)
    ("missing prompt", {"prompt": None}, "text_input: missing"),
    ("both prompt and messages", {"messages": [{"role": "user", "content": "x"}]},
     "messages: send either"),
    ("empty prompt", {"prompt": "   "}, "text_input: is empty"),
    ("non-UTF-8", {"prompt": None,
                   "raw": {"text_input": np.array([b"\xff\xfe\xfa"], dtype=np.object_)}},
     "text_input: is not valid UTF-8"),
    ("sampling not JSON", {"raw": {"sampling_parameters": np.array([b"{oops"], dtype=np.object_)}},
     "sampling_parameters: is not valid JSON"),
    ("sampling not object", {"sampling": [1, 2]}, "sampling_parameters: must be a JSON object"),
    ("unknown key", {"sampling": {"max_tokenz": 3}}, "sampling_parameters: unknown key"),
    ("wrong type", {"sampling": {"max_tokens": "many"}},
     "sampling_parameters.max_tokens: must be an integer"),
    ("max_tokens 0", {"sampling": {"max_tokens": 0}}, "sampling_parameters.max_tokens: must be >= 1"),
    ("negative temperature", {"sampling": {"temperature": -0.5}},
     "sampling_parameters.temperature: must be >= 0"),
    ("top_p 0", {"sampling": {"top_p": 0.0}}, "sampling_parameters.top_p: must be in (0, 1]"),
    ("top_p > 1", {"sampling": {"top_p": 1.01}}, "sampling_parameters.top_p: must be in (0, 1]"),
    ("n>1 streaming", {"sampling": {"n": 2}, "stream": True},
     "sampling_parameters.n: n > 1 is not supported"),
    ("malformed messages", {"prompt": None, "raw": {
        "messages": np.array([b'[{"role": "user"}]'], dtype=np.object_)}},
     "messages[0].content: must be a string"),
    ("messages not a list", {"prompt": None, "raw": {
        "messages": np.array([b'{"role": "user"}'], dtype=np.object_)}},
     "messages: must be a non-empty JSON list"),
    ("prompt too long", {"prompt": "shoes " * 1500}, "text_input: prompt has"),
]


@pytest.mark.parametrize("desc, kwargs, expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_clear_error(url, desc, kwargs, expected):
    kw = {"prompt": "hello", "stream": False, **kwargs}
    prompt = kw.pop("prompt")
    with pytest.raises(RequestFailed) as exc:
        list(generate(url, MODEL, prompt, **kw))
    assert expected in str(exc.value), f"{desc}: {exc.value}"
    assert "INVALID_ARG" in exc.value.status or "INVALID_ARGUMENT" in exc.value.status


def test_bad_inputs_do_not_disturb_a_running_stream(url, reference):
    """A good stream runs while every bad input is sent; it must finish unchanged."""
    long_sampling = {"temperature": 0.0, "max_tokens": 24}
    got: dict[str, object] = {}

    def good():
        try:
            chunks = []
            for c in generate(url, MODEL, PROMPT, stream=True, sampling=long_sampling):
                chunks.append(c)
                time.sleep(0.05)  # stretch the stream over the bad requests
            got["text"] = text(chunks)
            got["n"] = len(chunks)
        except Exception as e:  # noqa: BLE001
            got["error"] = e

    th = threading.Thread(target=good)
    th.start()
    for _desc, kwargs, expected in BAD_INPUTS:
        kw = {"prompt": "hello", "stream": False, **kwargs}
        prompt = kw.pop("prompt")
        with pytest.raises(RequestFailed, match=expected.split(":")[0].replace("[", r"\[")):
            list(generate(url, MODEL, prompt, **kw))
    th.join(120)
    assert "error" not in got, got.get("error")
    assert got["text"] == reference and got["n"] > 1


def _settled(server, names: tuple[str, ...], labels: dict[str, str]) -> str:
    """A scrape taken once no request is in flight and the buffered metrics of earlier tests
    have all been replayed (two scrapes a flush interval apart agree)."""
    assert wait_for(lambda: _engine_idle(server), timeout=60)
    last = scrape(server)
    for _ in range(20):
        time.sleep(1.0)  # > the stub's 0.5 s metric flush interval
        now = scrape(server)
        if all(metric_value(now, n, **labels) == metric_value(last, n, **labels) for n in names):
            return now
        last = now
    return last


def test_metrics_present_and_increasing(llm_server, url):
    labels = {"model": MODEL, "version": "1"}
    counters = ("rufus_time_to_first_token_seconds_count",
                "rufus_inter_token_latency_seconds_count",
                "rufus_generation_tokens_total", "rufus_prompt_tokens_total")
    before = _settled(llm_server, counters, labels)
    run(url, stream=True, sampling={"max_tokens": 8, "temperature": 0, "ignore_eos": True})

    def flushed() -> bool:
        """Metrics are replayed to Triton by a background thread every 0.5 s, so one scrape
        can see part of a request's updates: wait until every counter has moved."""
        now = scrape(llm_server)
        return all(metric_value(now, name, **labels) > metric_value(before, name, **labels)
                   for name in counters) and metric_value(
            now, "rufus_generation_tokens_total", **labels) >= metric_value(
            before, "rufus_generation_tokens_total", **labels) + 8

    assert wait_for(flushed, timeout=20), {name: metric_value(scrape(llm_server), name, **labels)
                                           for name in counters}
    after = scrape(llm_server)
    assert metric_value(after, "rufus_generation_tokens_total", **labels) - metric_value(
        before, "rufus_generation_tokens_total", **labels) == 8
    for gauge in ("rufus_requests_running", "rufus_requests_waiting",
                  "rufus_kv_cache_usage_ratio", "rufus_engine_requests",
                  "rufus_requests_outstanding"):
        assert f"{gauge}{{" in after, gauge


def _engine_idle(server) -> bool:
    m = scrape(server)
    return (metric_value(m, "rufus_engine_requests", model=MODEL) == 0
            and metric_value(m, "rufus_requests_outstanding", model=MODEL) == 0)


def test_cancellation_frees_the_engine_slot(llm_server, url):
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer(MODEL, build_inputs(
        grpcclient, PROMPT, stream=True,
        sampling={"max_tokens": 900, "ignore_eos": True, "temperature": 0}))
    for _ in range(3):  # it is really generating
        _result, error = q.get(timeout=120)
        assert error is None
    assert wait_for(lambda: metric_value(scrape(llm_server), "rufus_engine_requests",
                                         model=MODEL) >= 1, timeout=5)
    client.stop_stream(cancel_requests=True)
    client.close()
    assert wait_for(lambda: _engine_idle(llm_server), timeout=15), \
        "cancelled request still held by vLLM"


def _post_generate(url: str, body: dict) -> tuple[int, str]:
    """(status, body) of one HTTP generate request, errors included."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_admission_bound_rejects_immediately(llm_server, url):
    """Past the bound, requests fail at once with UNAVAILABLE instead of queueing."""
    extra = 4
    clients, errors, oks = [], queue.Queue(), queue.Queue()
    for _ in range(ADMISSION_LIMIT + extra):
        c = grpcclient.InferenceServerClient(url)
        c.start_stream(callback=lambda result, error: (errors if error else oks).put(
            (time.monotonic(), error)))
        clients.append(c)
    t0 = time.monotonic()
    for c in clients:
        c.async_stream_infer(MODEL, build_inputs(
            grpcclient, PROMPT, stream=True,
            sampling={"max_tokens": 900, "ignore_eos": True, "temperature": 0}))
    rejected = []
    deadline = time.monotonic() + 60
    while len(rejected) < extra and time.monotonic() < deadline:
        try:
            rejected.append(errors.get(timeout=1))
        except queue.Empty:
            pass
    # the same refusal on Triton's HTTP generate endpoint, while the bound is still full.
    # This tritonserver answers every model error on generate with HTTP 400, whatever its
    # code: the code is in the body ("[UNAVAILABLE] ...", rufus.errors' wire form)
    http_status, http_body = _post_generate(llm_server.url(f"/v2/models/{MODEL}/generate"),
                                            {"text_input": PROMPT, "max_tokens": 4})
    for c in clients:
        c.stop_stream(cancel_requests=True)
        c.close()
    assert http_status == 400, (http_status, http_body[:200])
    assert json.loads(http_body)["error"].startswith("[UNAVAILABLE] server at capacity")
    assert len(rejected) == extra
    for t, err in rejected:
        assert "at capacity" in str(err) and str(err).startswith("[UNAVAILABLE]")
        assert t - t0 < 30
    time.sleep(1.0)  # gauges are published every 0.5 s: don't read a value from before the burst
    assert wait_for(lambda: _engine_idle(llm_server), timeout=30)
    # And the server still serves.
    assert text(run(url, stream=False, sampling={"max_tokens": 4, "temperature": 0}))



def test_engine_death_fails_fast_then_heals_in_place(llm_server, url):
    """Kill vLLM's engine core mid-stream: the stream ends with UNAVAILABLE, the engine
    reports not ready (``rufus_engine_ready`` 0) within 10 s, new requests fail at once;
    then, with no load call, a new engine serves again. Runs last in this module, after
    the requests (metrics, 24 cancelled admission streams) that used to leave an unloaded
    instance stalled; the model is no longer unloaded (tests/integration/test_recovery.py
    has the same in its own server)."""
    cores = llm_server.engine_cores()
    core = cores[0] if cores else None
    assert core is not None, "no EngineCore process under tritonserver"
    before = text(run(url, stream=False, sampling=GREEDY, flags={"exclude_input_in_output": True}))
    errors: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: errors.put(error) if error else None)
    client.async_stream_infer(MODEL, build_inputs(
        grpcclient, PROMPT, stream=True,
        sampling={"max_tokens": 900, "ignore_eos": True, "temperature": 0}))
    time.sleep(1.0)
    t0 = time.monotonic()
    core.kill()
    err = errors.get(timeout=20)
    assert "UNAVAILABLE" in str(err), err
    client.stop_stream()
    client.close()

    def engine_ready() -> float:
        return metric_value(scrape(llm_server), "rufus_engine_ready", model=MODEL)

    assert wait_for(lambda: engine_ready() == 0, timeout=10)
    detect_s = time.monotonic() - t0
    with pytest.raises(RequestFailed, match="UNAVAILABLE"):
        run(url, stream=False, sampling={"max_tokens": 4})
    assert wait_for(lambda: engine_ready() == 1, timeout=600, interval=0.5)
    healed_s = time.monotonic() - t0
    assert llm_server.is_ready(MODEL)
    after = text(run(url, stream=False, sampling=GREEDY, flags={"exclude_input_in_output": True}))
    assert after == before
    print(f"engine death: not ready after {detect_s:.1f} s, serving again after {healed_s:.1f} s")
