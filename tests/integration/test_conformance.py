"""rufus_llm as a client of the official Triton vLLM backend sees it (issue 13).

Our own tests, written from the official backend's observable behaviour (its src/model.py,
src/utils/ and README; none of its code or tests copied): string-valued sampling
parameters, output conventions, ``exclude_input_in_output`` defaults, the HTTP generate
endpoints its README teaches, structured outputs, LoRA selection errors and the ``vllm:*``
metric family. Uses the shared ``llm_server`` (tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .conftest import metric_value, scrape, serving, wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_llm"
PROMPT = "The best way to keep running shoes clean is"


def official_inputs(prompt: str, stream: bool, sampling: dict | None = None,
                    **flags: bool) -> list:
    """Inputs as the official backend's sample client builds them."""
    def tensor(name: str, arr: np.ndarray, dtype: str):
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        return inp

    out = [tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
           tensor("stream", np.array([stream], dtype=bool), "BOOL")]
    if sampling is not None:
        out.append(tensor("sampling_parameters",
                          np.array([json.dumps(sampling).encode()], dtype=np.object_), "BYTES"))
    for k, v in flags.items():
        out.append(tensor(k, np.array([v], dtype=bool), "BOOL"))
    return out


def grpc_stream(url: str, inputs: list, parameters: dict | None = None,
                outputs: tuple[str, ...] = ("text_output",)) -> list[dict]:
    """One request over tritonclient's gRPC stream; returns each response's outputs."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer(MODEL, inputs, parameters=parameters,
                                  enable_empty_final_response=True)
        got = []
        while True:
            result, error = q.get(timeout=180)
            if error is not None:
                raise RuntimeError(str(error))
            resp = result.get_response()
            outs = {}
            for name in outputs:
                arr = result.as_numpy(name)
                if arr is not None:
                    outs[name] = arr
            if outs:
                got.append(outs)
            if resp.parameters.get("triton_final_response") and \
                    resp.parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()
        client.close()


def text_of(responses: list[dict]) -> str:
    return "".join(r["text_output"][0].decode() for r in responses)


@pytest.fixture(scope="module")
def http(llm_server) -> str:
    return f"http://127.0.0.1:{llm_server.http_port}"


def post(url: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sse_events(body: str) -> list[dict]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]


@pytest.fixture(scope="module")
def greedy_ref(url) -> str:
    return text_of(grpc_stream(url, official_inputs(PROMPT, False, {"temperature": 0.0,
                                                                      "max_tokens": 16},
                                                    exclude_input_in_output=True)))


def test_string_sampling_values_are_converted(url, greedy_ref):
    """The official CI's first request: {"temperature": "0", "top_p": "1"} as strings."""
    got = grpc_stream(url, official_inputs(PROMPT, False, {"temperature": "0", "top_p": "1",
                                                           "max_tokens": "16"},
                                           exclude_input_in_output=True))
    assert text_of(got) == greedy_ref
    streamed = grpc_stream(url, official_inputs(PROMPT, True, {"temperature": "0",
                                                               "max_tokens": "16"}))
    assert len(streamed) > 1 and text_of(streamed) == greedy_ref


def test_string_values_as_grpc_request_parameters(url, greedy_ref):
    got = grpc_stream(url, official_inputs(PROMPT, False, exclude_input_in_output=True),
                      parameters={"temperature": "0", "max_tokens": "16"})
    assert text_of(got) == greedy_ref


def test_exclude_input_in_output_defaults_per_mode(url, greedy_ref):
    # non-streaming: the prompt is prepended unless excluded
    assert text_of(grpc_stream(url, official_inputs(PROMPT, False, {"temperature": 0,
                                                                    "max_tokens": 16}))) \
        == PROMPT + greedy_ref
    # streaming: excluded by default; explicitly false is the official backend's error
    assert text_of(grpc_stream(url, official_inputs(PROMPT, True, {"temperature": 0,
                                                                   "max_tokens": 16}))) \
        == greedy_ref
    with pytest.raises(RuntimeError) as exc:
        grpc_stream(url, official_inputs(PROMPT, True, {"max_tokens": 4},
                                         exclude_input_in_output=False))
    assert "When streaming, `exclude_input_in_output` = False is not allowed." in str(exc.value)
    assert "exclude_input_in_output:" in str(exc.value)


def test_streamed_finish_reason_is_str_of_vllms_value(url):
    got = grpc_stream(url, official_inputs(PROMPT, True, {"temperature": 0, "max_tokens": 5},
                                           return_finish_reason=True),
                      outputs=("text_output", "finish_reason"))
    reasons = [r["finish_reason"][0].decode() for r in got]
    assert reasons[-1] == "length"
    assert len(reasons) > 1 and set(reasons[:-1]) == {"None"}


def test_logprobs_null_without_the_sampling_key(url):
    outs = ("text_output", "logprobs", "cumulative_logprob")
    (plain,) = grpc_stream(url, official_inputs(PROMPT, False, {"temperature": 0,
                                                                "max_tokens": 3},
                                                return_logprobs=True), outputs=outs)
    assert plain["logprobs"][0] == b"null"
    (asked,) = grpc_stream(url, official_inputs(PROMPT, False, {"temperature": 0,
                                                                "max_tokens": 3,
                                                                "logprobs": 2},
                                                return_logprobs=True,
                                                return_cumulative_logprob=True), outputs=outs)
    per_token = json.loads(asked["logprobs"][0])
    assert len(per_token) == 3
    first = next(iter(per_token[0].values()))
    assert set(first) == {"logprob", "rank", "decoded_token"}
    assert asked["cumulative_logprob"][0] < 0


def test_http_generate_with_string_parameters(http, greedy_ref):
    """The official README's curl, with string values (as its CI sends them)."""
    status, body = post(f"{http}/v2/models/{MODEL}/generate",
                        {"text_input": PROMPT,
                         "parameters": {"stream": False, "temperature": "0", "max_tokens": "16"}})
    assert status == 200, body
    out = json.loads(body)
    assert out["model_name"] == MODEL and out["text_output"] == PROMPT + greedy_ref
    # the README's example as written (numeric values)
    status, body = post(f"{http}/v2/models/{MODEL}/generate",
                        {"text_input": PROMPT, "parameters": {"stream": False, "temperature": 0,
                                                              "max_tokens": 16}})
    assert status == 200 and json.loads(body)["text_output"] == PROMPT + greedy_ref


def test_http_generate_stream(http, url, greedy_ref):
    status, body = post(f"{http}/v2/models/{MODEL}/generate_stream",
                        {"text_input": PROMPT, "stream": True, "return_finish_reason": True,
                         "parameters": {"temperature": "0", "max_tokens": "16"}})
    assert status == 200, body
    events = sse_events(body)
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == greedy_ref
    # the reason gRPC gives the same request: "length" where the model runs on to 16 tokens,
    # "stop" where its greedy answer ends earlier (fp32, measured on CPUs without native bf16)
    got = grpc_stream(url, official_inputs(PROMPT, True, {"temperature": 0, "max_tokens": 16},
                                           return_finish_reason=True),
                      outputs=("text_output", "finish_reason"))
    want = got[-1]["finish_reason"][0].decode()
    assert want in ("length", "stop")
    assert events[-1]["finish_reason"] == want


def test_structured_outputs_like_the_official_backend(url):
    """``structured_outputs`` is a JSON string of vLLM's StructuredOutputsParams."""
    so = json.dumps({"choice": ["yes", "no"]})
    got = grpc_stream(url, official_inputs("Is water wet? Answer:", False,
                                           {"temperature": 0, "max_tokens": 4,
                                            "structured_outputs": so},
                                           exclude_input_in_output=True))
    assert text_of(got) in ("yes", "no")
    schema = {"type": "object", "properties": {"size": {"type": "integer"}},
              "required": ["size"], "additionalProperties": False}
    got = grpc_stream(url, official_inputs("Shoe size as JSON:", False,
                                           {"temperature": 0, "max_tokens": 24,
                                            "structured_outputs": json.dumps({"json": schema})},
                                           exclude_input_in_output=True))
    assert isinstance(json.loads(text_of(got))["size"], int)


def test_lora_name_without_multi_lora_json_is_refused(url):
    with pytest.raises(RuntimeError) as exc:
        grpc_stream(url, official_inputs(PROMPT, False, {"lora_name": "alpaca"}))
    assert "sampling_parameters.lora_name:" in str(exc.value)
    assert "LoRA feature is not enabled" in str(exc.value)


OFFICIAL_FAMILIES = {
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
}


def test_vllm_metric_family_alongside_ours(llm_server, url):
    grpc_stream(url, official_inputs(PROMPT, False, {"temperature": 0, "max_tokens": 4}))
    labels = {"model": MODEL, "version": "1"}
    assert wait_for(lambda: metric_value(scrape(llm_server), "vllm:prompt_tokens_total",
                                         **labels) > 0, timeout=30)
    text = scrape(llm_server)
    for name, kind in OFFICIAL_FAMILIES.items():
        assert f"# TYPE {name} {kind}" in text, name
    assert metric_value(text, "vllm:generation_tokens_total", **labels) > 0
    assert metric_value(text, "vllm:e2e_request_latency_seconds_count", **labels) > 0
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model="rufus_llm",version="1"}' \
        in text or 'le="0.001"' in text
    assert "# TYPE vllm:num_requests_running gauge" in text
    assert metric_value(text, "rufus_generation_tokens_total", **labels) > 0


# ------------------------------------------------------------------ LoRA (multi_lora.json)

def write_peft_adapter(src_dir, out_dir) -> None:
    """The committed planner LoRA (data/qp/lora.*) in PEFT's layout, which vLLM loads."""
    from safetensors.torch import load_file, save_file

    meta = json.loads((src_dir / "lora.json").read_text())
    weights = load_file(str(src_dir / "lora.safetensors"))
    out_dir.mkdir(parents=True)
    save_file({f"base_model.model.{k}.weight": v.contiguous() for k, v in weights.items()},
              str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": meta["rank"],
        "lora_alpha": meta["alpha"], "target_modules": meta["targets"], "bias": "none",
        "lora_dropout": 0.0, "fan_in_fan_out": False, "base_model_name_or_path": None}))


@pytest.fixture(scope="module")
def lora_url(tmp_path_factory, log_dir):
    import shutil

    from rufus.launch.server import ROOT, TritonServer, free_port

    repo = tmp_path_factory.mktemp("lora_repo")
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL,
                    ignore=shutil.ignore_patterns("__pycache__"))
    write_peft_adapter(ROOT / "data" / "qp", repo / MODEL / "1" / "planner_lora")
    (repo / MODEL / "1" / "multi_lora.json").write_text(json.dumps({"planner": "planner_lora"}))
    srv = TritonServer(models=[MODEL], model_repository=repo, grpc_port=free_port(),
                       http_port=free_port(), metrics_port=free_port(),
                       log_path=log_dir / "tritonserver-lora.log",
                       extra_env={"RUFUS_RUFUS_LLM_ENGINE_ARGS":
                                  '{"max_num_seqs": 4, "max_model_len": 1024}'})
    for s in serving(srv):
        yield f"127.0.0.1:{s.grpc_port}"


def test_lora_name_selects_an_adapter_per_request(lora_url):
    from rufus.qp.plan import build_messages

    chat = build_messages("waterproof hiking boots under 100 dollars")

    def ask(sampling: dict) -> str:
        client_inputs = [i for i in official_inputs("x", False, sampling,
                                                    exclude_input_in_output=True)
                         if i.name() != "text_input"]
        arr = np.array([json.dumps(chat).encode()], dtype=np.object_)
        msg = grpcclient.InferInput("messages", [1], "BYTES")
        msg.set_data_from_numpy(arr)
        return text_of(grpc_stream(lora_url, [msg, *client_inputs]))

    greedy = {"temperature": 0, "max_tokens": 32}
    base = ask(greedy)
    tuned = ask({**greedy, "lora_name": "planner"})
    assert tuned != base  # the adapter changed the model's output
    assert tuned.lstrip().startswith("{")  # the planner LoRA answers with a JSON plan
    assert ask(greedy) == base  # and the next request without lora_name is the base model again
    with pytest.raises(RuntimeError) as exc:
        ask({**greedy, "lora_name": "alpaca"})
    assert "sampling_parameters.lora_name:" in str(exc.value)
    assert "is not supported, we currently support" in str(exc.value)
