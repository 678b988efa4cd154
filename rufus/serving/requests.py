"""Triton inputs -> one validated, typed request. Every error names the field and the reason.

Pure Python (numpy only): the adapters extract tensors and request parameters from
``pb_utils`` and call :func:`parse_generate_request`; unit tests call it directly.
The input names are the official Triton vLLM backend's, plus ``messages``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_LOGPROBS = 20
CHAT_ROLES = ("system", "user", "assistant")


class InvalidInput(ValueError):
    """A client error: becomes a Triton INVALID_ARG error ``<field>: <reason>``."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


# ---------------------------------------------------------------- sampling parameters

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str, Any], Any]:
    def check(name: str, v: Any) -> int:
        if not _is_int(v):
            raise InvalidInput(f"sampling_parameters.{name}", f"must be an integer, got {v!r}")
        if lo is not None and v < lo:
            raise InvalidInput(f"sampling_parameters.{name}", f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise InvalidInput(f"sampling_parameters.{name}", f"must be <= {hi}, got {v}")
        return v

    return check


def _float(test: Callable[[float], bool], rule: str) -> Callable[[str, Any], Any]:
    def check(name: str, v: Any) -> float:
        if not _is_num(v):
            raise InvalidInput(f"sampling_parameters.{name}", f"must be a number, got {v!r}")
        if not test(float(v)):
            raise InvalidInput(f"sampling_parameters.{name}", f"must be {rule}, got {v}")
        return float(v)

    return check


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidInput(f"sampling_parameters.{name}", f"must be true or false, got {v!r}")
    return v


def _top_k(name: str, v: Any) -> int:
    v = _int_range()(name, v)
    if v < -1:
        raise InvalidInput(f"sampling_parameters.{name}", f"must be -1, 0 (off) or >= 1, got {v}")
    return v


def _stop(name: str, v: Any) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise InvalidInput(
            f"sampling_parameters.{name}", "must be a non-empty string or a list of them"
        )
    if len(items) > 16:
        raise InvalidInput(f"sampling_parameters.{name}", "at most 16 stop strings")
    return items


def _token_ids(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(_is_int(t) and t >= 0 for t in v):
        raise InvalidInput(
            f"sampling_parameters.{name}", "must be a list of non-negative integers"
        )
    return v


SAMPLING_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "max_tokens": _int_range(1),
    "min_tokens": _int_range(0),
    "n": _int_range(1, 16),
    "temperature": _float(lambda x: x >= 0, ">= 0"),
    "top_p": _float(lambda x: 0 < x <= 1, "in (0, 1]"),
    "top_k": _top_k,
    "min_p": _float(lambda x: 0 <= x <= 1, "in [0, 1]"),
    "presence_penalty": _float(lambda x: -2 <= x <= 2, "in [-2, 2]"),
    "frequency_penalty": _float(lambda x: -2 <= x <= 2, "in [-2, 2]"),
    "repetition_penalty": _float(lambda x: 0 < x <= 10, "in (0, 10]"),
    "seed": _int_range(0, 2**63 - 1),
    "stop": _stop,
    "stop_token_ids": _token_ids,
    "ignore_eos": _bool,
    "logprobs": _int_range(0, MAX_LOGPROBS),
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "include_stop_str_in_output": _bool,
}
_NUMERIC = {k for k in SAMPLING_FIELDS if k not in {"stop", "stop_token_ids"}}


def _coerce_param_string(name: str, v: Any) -> Any:
    """Triton request parameters arrive as strings for some clients: read them as JSON."""
    if isinstance(v, str) and name in _NUMERIC:
        try:
            return json.loads(v.lower() if v.lower() in ("true", "false") else v)
        except json.JSONDecodeError:
            return v
    return v


def validate_sampling(raw: Mapping[str, Any], from_parameters: bool = False) -> dict[str, Any]:
    """Check keys, types and ranges; returns kwargs for ``vllm.SamplingParams``."""
    unknown = sorted(set(raw) - set(SAMPLING_FIELDS))
    if unknown:
        raise InvalidInput(
            "sampling_parameters",
            f"unknown key(s) {unknown}; supported: {sorted(SAMPLING_FIELDS)}",
        )
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if from_parameters:
            value = _coerce_param_string(name, value)
        out[name] = SAMPLING_FIELDS[name](name, value)
    if "min_tokens" in out and out["min_tokens"] > out.get("max_tokens", out["min_tokens"]):
        raise InvalidInput("sampling_parameters.min_tokens", "must be <= max_tokens")
    return out


def parse_sampling_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise InvalidInput("sampling_parameters", f"is not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise InvalidInput(
            "sampling_parameters", f"must be a JSON object, got {type(value).__name__}"
        )
    return value


# ---------------------------------------------------------------------- tensors

def _single(name: str, arr: np.ndarray) -> Any:
    flat = np.asarray(arr).reshape(-1)
    if flat.size != 1:
        raise InvalidInput(name, f"expected exactly one element, got {flat.size}")
    return flat[0]


def _text(name: str, arr: np.ndarray) -> str:
    value = _single(name, arr)
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(name, f"is not valid UTF-8 (byte {exc.start})") from exc
    if isinstance(value, str):
        return value
    raise InvalidInput(name, f"must be a string (TYPE_STRING/BYTES), got {arr.dtype}")


def _flag(name: str, arr: np.ndarray | None, default: bool) -> bool:
    if arr is None:
        return default
    value = _single(name, arr)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidInput(name, f"must be TYPE_BOOL, got {np.asarray(arr).dtype}")


def parse_messages(text: str) -> list[dict[str, str]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput("messages", f"is not valid JSON ({exc.msg})") from exc
    if not isinstance(value, list) or not value:
        raise InvalidInput("messages", "must be a non-empty JSON list of {role, content}")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidInput(where, "must be an object with 'role' and 'content'")
        extra = sorted(set(msg) - {"role", "content", "name"})
        if extra:
            raise InvalidInput(where, f"unknown key(s) {extra}")
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            raise InvalidInput(f"{where}.role", f"must be one of {list(CHAT_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise InvalidInput(f"{where}.content", "must be a string")
        out.append({"role": role, "content": content})
    if out[-1]["role"] == "assistant":
        raise InvalidInput("messages", "the last message must not be from the assistant")
    if not any(m["content"].strip() for m in out):
        raise InvalidInput("messages", "all messages are empty")
    return out


# ---------------------------------------------------------------------- request

@dataclass
class GenerateRequest:
    """One validated generation request, independent of Triton types."""

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    stream: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    exclude_input_in_output: bool = False
    return_finish_reason: bool = False
    return_cumulative_logprob: bool = False
    return_logprobs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    # Not a Triton input of rufus_llm: set by models built on run_generate (rufus_qp_medusa).
    return_token_ids: bool = False


RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
KNOWN_INPUTS = {"text_input", "messages", "stream", "sampling_parameters",
                "exclude_input_in_output", *RETURN_FLAGS}


def parse_generate_request(
    inputs: Mapping[str, np.ndarray | None],
    parameters_json: str | None = None,
    default_max_tokens: int = 256,
) -> GenerateRequest:
    """Validate the tensors and request parameters of one inference request.

    ``sampling_parameters`` may come as the input tensor (official backend style) and/or
    as Triton request parameters; the tensor wins on conflicts.
    """
    inputs = {k: v for k, v in inputs.items() if v is not None}
    text = _text("text_input", inputs["text_input"]) if "text_input" in inputs else None
    msgs_raw = _text("messages", inputs["messages"]) if "messages" in inputs else None
    if text is None and msgs_raw is None:
        raise InvalidInput("text_input", "missing: send 'text_input' or 'messages'")
    if text is not None and msgs_raw is not None:
        raise InvalidInput("messages", "send either 'text_input' or 'messages', not both")
    messages = parse_messages(msgs_raw) if msgs_raw is not None else None
    if text is not None and not text.strip():
        raise InvalidInput("text_input", "is empty")

    sampling: dict[str, Any] = {}
    if parameters_json:
        params = parse_sampling_json(parameters_json)
        sampling.update(validate_sampling(params, from_parameters=True))
    if "sampling_parameters" in inputs:
        raw = parse_sampling_json(_text("sampling_parameters", inputs["sampling_parameters"]))
        sampling.update(validate_sampling(raw))
    sampling.setdefault("max_tokens", default_max_tokens)
    if "min_tokens" in sampling and sampling["min_tokens"] > sampling["max_tokens"]:
        raise InvalidInput("sampling_parameters.min_tokens", "must be <= max_tokens")

    stream = _flag("stream", inputs.get("stream"), False)
    if stream and sampling.get("n", 1) > 1:
        raise InvalidInput("sampling_parameters.n", "n > 1 is not supported with stream=true")
    req = GenerateRequest(
        prompt=text,
        messages=messages,
        stream=stream,
        sampling=sampling,
        # Chat callers want the answer only; raw-prompt callers get the official default.
        exclude_input_in_output=_flag(
            "exclude_input_in_output", inputs.get("exclude_input_in_output"), messages is not None
        ),
    )
    for name in RETURN_FLAGS:
        setattr(req, name, _flag(name, inputs.get(name), False))
    if req.return_logprobs and "logprobs" not in sampling:
        sampling["logprobs"] = 0
    return req


def check_prompt_length(n_prompt: int, max_tokens: int, max_model_len: int, field_name: str) -> None:
    """Reject prompts the engine could never finish, before they take a slot."""
    if n_prompt == 0:
        raise InvalidInput(field_name, "prompt is empty after tokenization")
    if n_prompt >= max_model_len:
        raise InvalidInput(
            field_name,
            f"prompt has {n_prompt} tokens; the model's context is {max_model_len} tokens",
        )
