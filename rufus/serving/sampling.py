"""Sampling parameters: the rules for each field and the one merge every model uses.

Values follow the official Triton vLLM backend's conversion rule (a string is read as the
field's type, ``{"temperature": "0"}``) and every check vLLM 0.32 makes in ``SamplingParams``
and its input processor is made here first, naming the field: a value vLLM would reject
must never reach the engine (some, such as ints beyond 64 bits or lone surrogates, are
registered by vLLM and then fail to serialise, leaking the request). The OpenAI frontend
checks its requests with the same rules (:func:`validate_sampling`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rufus.errors import InvalidInput
from rufus.serving.validation import (
    DEFAULT_LIMITS,
    Limits,
    check_text,
    find_surrogate,
    load_json,
    quote,
)

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
GREEDY_EPS = 1e-5         # vLLM's _SAMPLING_EPS: below it, temperature means greedy
# vLLM's own bound on a structured-output JSON schema's nesting (MAX_STRUCTURED_OUTPUT_JSON_NESTING).
MAX_SCHEMA_DEPTH = 64


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_INT_TEXT = re.compile(r"\s*[+-]?\d{1,30}\s*")
_FLOAT_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def _to_int(name: str, v: Any) -> int:
    """An integer, converted from a string as the official backend does (``"16"`` -> 16);
    an integral float (16.0) is accepted, a fractional one is an error."""
    if isinstance(v, str) and _INT_TEXT.fullmatch(v):
        return int(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    if not _is_int(v):
        raise InvalidInput(f"sampling_parameters.{name}", f"must be an integer, got {quote(v)}")
    return v


def _to_float(name: str, v: Any) -> float:
    if isinstance(v, str) and _FLOAT_TEXT.fullmatch(v):
        v = float(v)
    if not (_is_int(v) or isinstance(v, float)):
        raise InvalidInput(f"sampling_parameters.{name}", f"must be a number, got {quote(v)}")
    try:
        x = float(v)
    except OverflowError:  # an int beyond float range
        x = math.inf
    if not math.isfinite(x):
        raise InvalidInput(f"sampling_parameters.{name}", f"must be a finite number, got {quote(v)}")
    return x


def _int_range(lo: int, hi: int, rule: str | None = None) -> Callable[[str, Any, Limits], int]:
    def check(name: str, v: Any, limits: Limits) -> int:
        n = _to_int(name, v)
        if not lo <= n <= hi:
            why = rule or (f"must be >= {lo}" if n < lo else f"must be <= {hi}")
            raise InvalidInput(f"sampling_parameters.{name}", f"{why}, got {quote(n)}")
        return n

    return check


def _float(test: Callable[[float], bool], rule: str) -> Callable[[str, Any, Limits], float]:
    def check(name: str, v: Any, limits: Limits) -> float:
        x = _to_float(name, v)
        if not test(x):
            raise InvalidInput(f"sampling_parameters.{name}", f"must be {rule}, got {x}")
        return x

    return check


def _bool(name: str, v: Any, limits: Limits) -> bool:
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if not isinstance(v, bool):
        raise InvalidInput(f"sampling_parameters.{name}", f"must be true or false, got {quote(v)}")
    return v


def _stop(name: str, v: Any, limits: Limits) -> list[str]:
    where = f"sampling_parameters.{name}"
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise InvalidInput(where, "must be a non-empty string or a list of them")
    if len(items) > MAX_STOP_STRINGS:
        raise InvalidInput(where, f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}")
    for i, s in enumerate(items):
        if len(s) > MAX_STOP_CHARS:
            raise InvalidInput(f"{where}[{i}]", f"is {len(s)} characters; at most {MAX_STOP_CHARS}")
        check_text(f"{where}[{i}]", s)
    return items


def _token_ids(name: str, v: Any, limits: Limits) -> list[int]:
    where = f"sampling_parameters.{name}"
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise InvalidInput(where, "must be a list of non-negative integers")
    if len(v) > MAX_STOP_TOKEN_IDS:
        raise InvalidInput(where, f"at most {MAX_STOP_TOKEN_IDS} token ids, got {len(v)}")
    hi = limits.vocab_size if limits.vocab_size is not None else INT32_MAX + 1
    bad = [t for t in v if not 0 <= t < hi]
    if bad:
        raise InvalidInput(where, f"token id(s) {quote(bad)} outside the vocabulary [0, {hi})")
    return v


def _logprobs(name: str, v: Any, limits: Limits) -> int:
    return _int_range(0, limits.max_logprobs)(name, v, limits)


def _lora_name(name: str, v: Any, limits: Limits) -> str:
    where = f"sampling_parameters.{name}"
    if not isinstance(v, str) or not v:
        raise InvalidInput(where, f"must be a non-empty string, got {quote(v)}")
    check_text(where, v)
    if limits.loras is None:
        # the official backend's words: "LoRA feature is not enabled."
        raise InvalidInput(where, "LoRA feature is not enabled. (no multi_lora.json for this "
                                  "model)")
    if v not in limits.loras:
        raise InvalidInput(where, f"LoRA {quote(v)} is not supported, we currently support "
                                  f"{quote(list(limits.loras), 200)}")
    return v


STRUCTURED_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
STRUCTURED_OPTIONS = ("disable_any_whitespace", "disable_additional_properties",
                      "whitespace_pattern")


def _structured_outputs(name: str, v: Any, limits: Limits) -> dict[str, Any]:
    """vLLM ``StructuredOutputsParams`` as a dict. The official backend sends it as a JSON
    string (``json.dumps({...})``); an object is accepted too."""
    where = f"sampling_parameters.{name}"
    if isinstance(v, str):
        v = load_json(where, v, limits)
    if not isinstance(v, dict):
        raise InvalidInput(where, "must be an object (or its JSON text) with one of "
                                  f"{list(STRUCTURED_CONSTRAINTS)}")
    unknown = sorted(set(v) - set(STRUCTURED_CONSTRAINTS) - set(STRUCTURED_OPTIONS))
    if unknown:
        raise InvalidInput(where, f"unknown key(s) {quote(unknown, 120)}; supported: "
                                  f"{[*STRUCTURED_CONSTRAINTS, *STRUCTURED_OPTIONS]}")
    given = [k for k in STRUCTURED_CONSTRAINTS if v.get(k) is not None]
    if len(given) != 1:
        raise InvalidInput(where, f"exactly one of {list(STRUCTURED_CONSTRAINTS)} must be set, "
                                  f"got {given or 'none'}")
    kind = given[0]
    value = v[kind]
    sub = f"{where}.{kind}"
    if kind == "json":
        text = value if isinstance(value, str) else None
        if text is None and not isinstance(value, dict):
            raise InvalidInput(sub, "must be a JSON schema (object or its JSON text)")
        if text is not None:
            value = load_json(sub, text, Limits(max_json_depth=MAX_SCHEMA_DEPTH,
                                                max_parameters_bytes=limits.max_parameters_bytes))
            if not isinstance(value, dict | bool):
                raise InvalidInput(sub, "must be a JSON schema (an object)")
    elif kind == "choice":
        if (not isinstance(value, list) or not value
                or not all(isinstance(c, str) and c for c in value)):
            raise InvalidInput(sub, "must be a non-empty list of non-empty strings")
    elif kind == "json_object":
        value = _bool(f"{name}.{kind}", value, limits)
    elif not isinstance(value, str) or not value:
        raise InvalidInput(sub, "must be a non-empty string")
    out: dict[str, Any] = {kind: value}
    for opt in STRUCTURED_OPTIONS:
        if opt in v and v[opt] is not None:
            if opt == "whitespace_pattern":
                if not isinstance(v[opt], str):
                    raise InvalidInput(f"{where}.{opt}", "must be a string")
                out[opt] = v[opt]
            else:
                out[opt] = _bool(f"{name}.{opt}", v[opt], limits)
    path = find_surrogate(out)
    if path is not None:
        raise InvalidInput(f"{where}{path}", "contains a lone surrogate; send valid Unicode")
    return out


SAMPLING_FIELDS: dict[str, Callable[[str, Any, Limits], Any]] = {
    "max_tokens": _int_range(1, INT64_MAX),
    "min_tokens": _int_range(0, INT64_MAX),
    "n": _int_range(1, 16),
    # vLLM 0.32 rejects temperatures outside [0, 2]
    "temperature": _float(lambda x: 0 <= x <= 2, ">= 0 and <= 2"),
    "top_p": _float(lambda x: 0 < x <= 1, "in (0, 1]"),
    # vLLM: -1 or 0 disables; the engine holds it as a 32-bit integer
    "top_k": _int_range(-1, INT32_MAX, f"must be -1, 0 (off) or between 1 and {INT32_MAX}"),
    "min_p": _float(lambda x: 0 <= x <= 1, "in [0, 1]"),
    "presence_penalty": _float(lambda x: -2 <= x <= 2, "in [-2, 2]"),
    "frequency_penalty": _float(lambda x: -2 <= x <= 2, "in [-2, 2]"),
    "repetition_penalty": _float(lambda x: 0 < x <= 10, "in (0, 10]"),
    "seed": _int_range(0, INT64_MAX),
    "stop": _stop,
    "stop_token_ids": _token_ids,
    "ignore_eos": _bool,
    "logprobs": _logprobs,
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "include_stop_str_in_output": _bool,
    "lora_name": _lora_name,
    "structured_outputs": _structured_outputs,
}


def validate_sampling(raw: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS,
                      allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """Check keys, convert and range-check values; returns kwargs for ``vllm.SamplingParams``
    (plus ``lora_name``). Strings are read as the field's type wherever they come from (the
    tensor or request parameters), as the official backend does."""
    keys = set(SAMPLING_FIELDS) if allowed is None else set(allowed)
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise InvalidInput("sampling_parameters",
                           f"unknown key(s) {quote(unknown, 120)}; supported: {sorted(keys)}")
    out = {name: SAMPLING_FIELDS[name](name, value, limits) for name, value in raw.items()}
    if limits.speculative and out.get("min_p", 0) > 0:
        # vLLM's own check, made here so the client sees which field and why
        raise InvalidInput("sampling_parameters.min_p",
                           "must be 0 on this model: it drafts tokens (speculative_config in "
                           f"its model.json), which vLLM does not combine with min_p; got "
                           f"{out['min_p']}")
    if "min_tokens" in out and "max_tokens" in out:
        check_min_tokens(out["min_tokens"], out["max_tokens"])
    return out


def check_min_tokens(min_tokens: int, max_tokens: int, why: str = "") -> None:
    """vLLM's rule (also applied after max_tokens is clamped to the context left)."""
    if min_tokens > max_tokens:
        raise InvalidInput("sampling_parameters.min_tokens",
                           f"must be <= max_tokens ({max_tokens}{why}), got {min_tokens}")


def parse_sampling_json(text: str, limits: Limits = DEFAULT_LIMITS,
                        name: str = "sampling_parameters") -> dict[str, Any]:
    value = load_json(name, text, limits) if text.strip() else {}
    if not isinstance(value, dict):
        raise InvalidInput(name, f"must be a JSON object, got {type(value).__name__}")
    return value


def merge_sampling(tensor_text: str | None, parameters: Mapping[str, Any] | None, *,
                   limits: Limits, default_max_tokens: int,
                   allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """The one sampling-parameter merge for every model: request parameters, then the
    ``sampling_parameters`` tensor (it wins on conflicts), default max_tokens, then the
    cross-field rules vLLM applies (min_tokens <= max_tokens, n = 1 when greedy)."""
    sampling: dict[str, Any] = {}
    if parameters:
        sampling.update(validate_sampling(parameters, limits=limits, allowed=allowed))
    if tensor_text is not None:
        sampling.update(validate_sampling(parse_sampling_json(tensor_text, limits),
                                          limits=limits, allowed=allowed))
    sampling.setdefault("max_tokens", default_max_tokens)
    check_min_tokens(sampling.get("min_tokens", 0), sampling["max_tokens"])
    if sampling.get("n", 1) > 1 and sampling.get("temperature", 1.0) < GREEDY_EPS:
        raise InvalidInput("sampling_parameters.n",
                           f"must be 1 with greedy sampling (temperature 0), got {sampling['n']}")
    return sampling


def request_parameters(parameters_json: str | None, limits: Limits) -> dict[str, Any]:
    """Triton request parameters (gRPC ``parameters`` / HTTP generate ``"parameters"``)."""
    if not parameters_json:
        return {}
    return parse_sampling_json(parameters_json, limits, name="parameters")
