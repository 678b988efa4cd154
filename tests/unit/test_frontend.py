"""OpenAI request -> rufus_llm request mapping, response rendering and error mapping of the
OpenAI frontend (no server: the pure functions of rufus/frontend/)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rufus.frontend.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    UNTIL_CONTEXT_END,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    openai_error,
    parse_body,
    parse_chat,
    parse_completion,
)
from rufus.frontend.render import ChunkWriter, chat_logprobs, completion_logprobs, parse_outputs


def chat(**kw):
    body = {"model": "rufus_llm", "messages": [{"role": "user", "content": "hi"}], **kw}
    return parse_chat(parse_body(ChatCompletionRequest, json.dumps(body).encode()))


def completion(**kw):
    body = {"model": "rufus_llm", "prompt": "Once upon", **kw}
    return parse_completion(parse_body(CompletionRequest, json.dumps(body).encode()))


def error_of(fn, **kw) -> APIError:
    with pytest.raises(APIError) as info:
        fn(**kw)
    return info.value


# ------------------------------------------------------------------ chat mapping
def test_chat_maps_to_messages_and_sampling():
    plan = chat(max_completion_tokens=7, temperature=0.5, top_p=0.9, stop="\n", seed=3,
                presence_penalty=0.1, frequency_penalty=-0.2)
    (call,) = plan.calls
    assert call.prompt is None and call.messages == [{"role": "user", "content": "hi"}]
    assert call.sampling == {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"],
                             "seed": 3, "presence_penalty": 0.1, "frequency_penalty": -0.2}
    assert plan.kind == "chat" and not plan.stream and plan.n == 1


def test_chat_defaults_follow_openai():
    (call,) = chat().calls
    # no max_tokens: until the context is full (rufus_llm caps at max_model_len - prompt)
    assert call.sampling == {"max_tokens": UNTIL_CONTEXT_END}
    assert chat(max_tokens=5).calls[0].sampling["max_tokens"] == 5


def test_chat_roles_and_content_parts():
    plan = chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "name": "bot"},
        {"role": "user", "content": "more"},
    ])
    assert plan.calls[0].messages == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]


def test_stream_options_and_usage():
    plan = chat(stream=True, stream_options={"include_usage": True})
    assert plan.stream and plan.include_usage
    assert not chat(stream=True).include_usage
    e = error_of(chat, stream_options={"include_usage": True})
    assert e.status == 400 and e.param == "stream_options"


def test_logprobs_mapping():
    assert chat(logprobs=True, top_logprobs=3).calls[0].sampling["logprobs"] == 3
    assert chat(logprobs=True).calls[0].sampling["logprobs"] == 0
    assert "logprobs" not in chat().calls[0].sampling
    assert error_of(chat, top_logprobs=2).param == "top_logprobs"
    assert completion(logprobs=2).calls[0].sampling["logprobs"] == 2
    assert error_of(completion, logprobs=99).param == "logprobs"


def test_top_p_zero_means_greedy():
    s = chat(top_p=0).calls[0].sampling
    assert s["temperature"] == 0.0 and "top_p" not in s


def test_n_only_without_streaming():
    assert chat(n=3).calls[0].sampling["n"] == 3
    e = error_of(chat, n=2, stream=True)
    assert e.status == 400 and e.param == "n"
    assert error_of(chat, n=17).param == "n"


@pytest.mark.parametrize("kw,param", [
    ({"temperature": 3}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"seed": -1}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"presence_penalty": 9}, "presence_penalty"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages[0].colour"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"frobnicate": True}, "frobnicate"),
    ({"model": None}, "model"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
])
def test_chat_errors_name_the_parameter(kw, param):
    e = error_of(chat, **kw)
    assert e.status == 400, e.message
    assert e.param == param, e.message
    assert e.body()["error"]["type"] == "invalid_request_error"
    assert e.body()["error"]["param"] == param


def test_unknown_argument_uses_openais_wording():
    e = error_of(chat, frobnicate=1)
    assert e.message == "Unrecognized request argument supplied: frobnicate"


def test_error_quotes_little_client_data():
    e = error_of(chat, messages=[{"role": "x" * 5000, "content": "hi"}])
    assert len(e.message) < 200


def test_body_errors():
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, b"{not json")
    assert info.value.status == 400 and "JSON" in info.value.message
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, b"[1]")
    assert info.value.status == 400
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, b'{"model": "m"}')
    assert info.value.param == "messages"


def test_ignored_openai_fields_are_accepted():
    plan = chat(user="u1", metadata={"a": "b"}, store=False, service_tier="auto",
                response_format={"type": "text"})
    assert plan.calls[0].sampling == {"max_tokens": UNTIL_CONTEXT_END}


def test_conversation_key_from_prompt_cache_key_then_header_then_user():
    """The key routes a conversation to one unit; it is a hash (a user id never leaves the
    frontend) and the most specific source wins."""
    from rufus.frontend.protocol import conversation_key

    assert chat().conversation is None
    by_user = chat(user="u1").conversation
    assert by_user and len(by_user) == 32 and "u1" not in by_user
    assert chat(user="u1", prompt_cache_key="conv-7").conversation == \
        conversation_key("conv-7", None, None) != by_user
    body = {"model": "rufus_llm", "messages": [{"role": "user", "content": "hi"}], "user": "u1"}
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    assert parse_chat(req, "hdr-1").conversation == conversation_key(None, "hdr-1", None)
    assert completion(prompt="x", user="u1").conversation == by_user
    with pytest.raises(APIError) as info:
        conversation_key(None, "h" * 2000, None)
    assert info.value.param == "x-rufus-conversation"
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, json.dumps({**body, "user": "u" * 2000}).encode())
    assert info.value.param == "user"


def test_vllm_extensions_pass_through():
    s = completion(ignore_eos=True, repetition_penalty=1.0, top_k=5, min_tokens=2,
                   max_tokens=8, logprobs=None).calls[0].sampling
    assert s == {"max_tokens": 8, "ignore_eos": True, "repetition_penalty": 1.0, "top_k": 5,
                 "min_tokens": 2}


# ------------------------------------------------------------------ completions mapping
def test_completion_maps_to_text_input():
    plan = completion()
    (call,) = plan.calls
    assert call.prompt == "Once upon" and call.messages is None
    assert call.sampling == {"max_tokens": COMPLETIONS_DEFAULT_MAX_TOKENS}


def test_completion_batch_of_prompts():
    plan = completion(prompt=["a", "b"], n=2)
    assert [c.prompt for c in plan.calls] == ["a", "b"] and plan.n == 2


@pytest.mark.parametrize("kw,param", [
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["ok", " "]}, "prompt[1]"),
    ({"suffix": "x"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"prompt": ["p"] * 17}, "prompt"),
])
def test_completion_errors_name_the_parameter(kw, param):
    e = error_of(completion, **kw)
    assert e.status == 400 and e.param == param, e.message


# ------------------------------------------------------------------ Triton errors
def map_triton_error(status: str, message: str, kind: str):
    """A Triton error as the client receives it (one parser: rufus.errors.from_wire), then
    the frontend's mapping of the typed error."""
    from rufus.client import RequestFailed

    return openai_error(RequestFailed(message, status).error)


def test_triton_errors_map_to_http_statuses():
    e = map_triton_error("INVALID_ARG", "[INVALID_ARG] sampling_parameters.top_k: must be >= 1",
                         "chat")
    assert (e.status, e.param) == (400, "top_k")
    e = map_triton_error("INVALID_ARG", "[INVALID_ARG] text_input: prompt has 5000 tokens; ...",
                         "completion")
    assert (e.status, e.param) == (400, "prompt")
    e = map_triton_error("UNAVAILABLE", "[UNAVAILABLE] at capacity (24 requests)", "chat")
    assert e.status == 503 and e.retry_after == 1 and e.type == "server_error"
    e = map_triton_error("NOT_FOUND", "Request for unknown model: 'rufus_llm' is not found", "chat")
    assert e.status == 503  # a served model that is not loaded: its unit is down
    assert map_triton_error("INTERNAL", "[INTERNAL] boom", "chat").status == 500
    assert map_triton_error("DEADLINE_EXCEEDED", "late", "chat").status == 504


# ------------------------------------------------------------------ rendering
def _outputs(texts, finish, n_out, n_in=4, logprobs=None):
    out = {"text_output": np.array([t.encode() for t in texts], dtype=np.object_),
           "finish_reason": np.array([f.encode() for f in finish], dtype=np.object_),
           "num_output_tokens": np.array(n_out, dtype=np.uint32),
           "num_input_tokens": np.array([n_in], dtype=np.uint32)}
    if logprobs is not None:
        out["logprobs"] = np.array([json.dumps(lp).encode() for lp in logprobs], dtype=np.object_)
    return out


def test_parse_outputs_finish_conventions():
    d = parse_outputs(_outputs(["a", "b"], ["", "None"], [1, 2]))
    assert d.texts == ["a", "b"] and d.finish == [None, None] and d.n_out == [1, 2] and d.n_in == 4
    assert parse_outputs(_outputs(["a"], ["length"], [1])).finish == ["length"]


def test_logprobs_sampled_token_first_then_top():
    lp = [{"7": {"logprob": -1.5, "rank": 3, "decoded_token": " x"},
           "1": {"logprob": -0.1, "rank": 1, "decoded_token": " a"},
           "2": {"logprob": -0.9, "rank": 2, "decoded_token": " b"}}]
    d = parse_outputs(_outputs([" x"], ["stop"], [1], logprobs=[lp]))
    c = chat_logprobs(d.logprobs[0], 2)
    assert c["content"][0]["token"] == " x" and c["content"][0]["logprob"] == -1.5
    assert [t["token"] for t in c["content"][0]["top_logprobs"]] == [" a", " b"]
    assert c["content"][0]["bytes"] == list(b" x")
    t = completion_logprobs(d.logprobs[0], 1, 10)
    assert t == {"tokens": [" x"], "token_logprobs": [-1.5], "top_logprobs": [{" a": -0.1}],
                 "text_offset": [10]}
    assert parse_outputs(_outputs(["x"], ["stop"], [1], logprobs=[None])).logprobs == [None]


def test_chunk_writer_sse_shapes():
    w = ChunkWriter("chat", "rufus_llm", include_usage=True)
    first = json.loads(w.role(0, {"x_rufus_products": []})[6:])
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["x_rufus_products"] == []
    d = json.loads(w.delta(0, "hi", None)[6:])
    assert d["choices"][0]["delta"] == {"content": "hi"} and d["id"] == first["id"]
    u = json.loads(w.usage(3, 4)[6:])
    assert u["choices"] == [] and u["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                                  "total_tokens": 7}
    assert w.done() == b"data: [DONE]\n\n"
    w = ChunkWriter("completion", "rufus_llm", include_usage=False)
    d = json.loads(w.delta(0, "hi", "stop")[6:])
    assert d["object"] == "text_completion" and "usage" not in d
    assert d["choices"][0] == {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}
