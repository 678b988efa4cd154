"""Parameter parsing and validation (no server)."""

import json

import numpy as np
import pytest

from rufus.serving.requests import InvalidInput, parse_generate_request, validate_sampling


def t(s: str | bytes) -> np.ndarray:
    return np.array([s.encode() if isinstance(s, str) else s], dtype=np.object_)


def b(v: bool) -> np.ndarray:
    return np.array([v], dtype=bool)


def parse(**inputs):
    params = inputs.pop("_params", None)
    return parse_generate_request(inputs, params)


def test_minimal_text_request_defaults():
    r = parse(text_input=t("hi"))
    assert r.prompt == "hi" and r.messages is None
    assert r.stream is False and r.exclude_input_in_output is False
    assert r.sampling == {"max_tokens": 256}


def test_sampling_tensor_overrides_request_parameters():
    r = parse(text_input=t("hi"), sampling_parameters=t('{"temperature": 0.5}'),
              _params=json.dumps({"temperature": "0.9", "max_tokens": "12"}))
    assert r.sampling == {"temperature": 0.5, "max_tokens": 12}


def test_messages_default_exclude_input_and_validate():
    r = parse(messages=t(json.dumps([{"role": "user", "content": "shoes?"}])), stream=b(True))
    assert r.messages == [{"role": "user", "content": "shoes?"}]
    assert r.exclude_input_in_output is True and r.stream is True


def test_return_logprobs_requests_sampled_logprob():
    r = parse(text_input=t("hi"), return_logprobs=b(True))
    assert r.sampling["logprobs"] == 0


@pytest.mark.parametrize(
    "inputs, field, reason",
    [
        ({}, "text_input", "missing"),
        ({"text_input": t("a"), "messages": t("[]")}, "messages", "not both"),
        ({"text_input": t("   ")}, "text_input", "empty"),
        ({"text_input": t(b"\xff\xfe")}, "text_input", "UTF-8"),
        ({"text_input": t("a"), "sampling_parameters": t("{")}, "sampling_parameters", "JSON"),
        ({"text_input": t("a"), "sampling_parameters": t("[1]")}, "sampling_parameters", "object"),
        ({"text_input": t("a"), "sampling_parameters": t('{"bogus": 1}')}, "sampling_parameters",
         "unknown"),
        ({"text_input": t("a"), "sampling_parameters": t('{"max_tokens": "x"}')},
         "sampling_parameters.max_tokens", "integer"),
        ({"text_input": t("a"), "sampling_parameters": t('{"max_tokens": 0}')},
         "sampling_parameters.max_tokens", ">= 1"),
        ({"text_input": t("a"), "sampling_parameters": t('{"temperature": -1}')},
         "sampling_parameters.temperature", ">= 0"),
        ({"text_input": t("a"), "sampling_parameters": t('{"top_p": 0}')},
         "sampling_parameters.top_p", "(0, 1]"),
        ({"text_input": t("a"), "sampling_parameters": t('{"top_p": 1.5}')},
         "sampling_parameters.top_p", "(0, 1]"),
        ({"text_input": t("a"), "sampling_parameters": t('{"n": 2}'), "stream": b(True)},
         "sampling_parameters.n", "stream"),
        ({"text_input": t("a"), "sampling_parameters": t('{"stop": [1]}')},
         "sampling_parameters.stop", "string"),
        ({"text_input": t("a"), "sampling_parameters": t('{"ignore_eos": 1}')},
         "sampling_parameters.ignore_eos", "true or false"),
        ({"messages": t("not json")}, "messages", "JSON"),
        ({"messages": t("[]")}, "messages", "non-empty"),
        ({"messages": t('[{"role": "robot", "content": "x"}]')}, "messages[0].role", "one of"),
        ({"messages": t('[{"role": "user", "content": 5}]')}, "messages[0].content", "string"),
        ({"messages": t('[{"role": "user", "content": "x", "extra": 1}]')}, "messages[0]",
         "unknown"),
        ({"text_input": t("a"), "stream": np.array([1], dtype=np.int32)}, "stream", "TYPE_BOOL"),
        ({"text_input": np.array([b"a", b"b"], dtype=np.object_)}, "text_input", "exactly one"),
    ],
)
def test_bad_input_names_field_and_reason(inputs, field, reason):
    with pytest.raises(InvalidInput) as exc:
        parse(**inputs)
    assert exc.value.field == field
    assert reason in str(exc.value)
    assert str(exc.value).startswith(field + ":")


def test_request_parameters_strings_are_coerced():
    out = validate_sampling({"max_tokens": "5", "ignore_eos": "true", "top_p": "0.5"},
                            from_parameters=True)
    assert out == {"max_tokens": 5, "ignore_eos": True, "top_p": 0.5}


def test_bool_is_not_an_integer():
    with pytest.raises(InvalidInput):
        validate_sampling({"max_tokens": True})


def test_min_tokens_above_max_tokens():
    with pytest.raises(InvalidInput, match="min_tokens"):
        parse(text_input=t("a"), sampling_parameters=t('{"max_tokens": 2, "min_tokens": 5}'))
