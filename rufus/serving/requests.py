"""Triton inputs -> one validated, typed request. Every error names the field and the reason.

Pure Python (numpy only): the adapters extract tensors and request parameters from
``pb_utils`` and call :func:`parse_generate_request`; unit tests call it directly.

* Each model's inputs are declared once (:data:`LLM_INPUT_SPECS`, an :class:`InputSpec` table):
  the table drives the auto-completed Triton config, decoding (:func:`decode_inputs`) and the
  known-inputs set; ``tests/unit/test_inputs.py`` checks it against ``config.pbtxt``.
* Sampling values follow the official Triton vLLM backend's conversion rule (a string is
  read as the field's type, ``{"temperature": "0"}``) and every check vLLM 0.32 makes in
  ``SamplingParams`` and its input processor is made here first, naming the field: a value
  vLLM would reject must never reach the engine (some, such as ints beyond 64 bits or lone
  surrogates, are registered by vLLM and then fail to serialise, leaking the request).
* Every JSON input is bounded before it is parsed: size (bytes) first, then nesting depth by
  a non-recursive pre-scan, so neither a huge value nor deep nesting reaches ``json.loads``.
* Errors quote at most a short prefix of client data (:func:`quote`, :class:`InvalidInput`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_LOGPROBS = 20
CHAT_ROLES = ("system", "user", "assistant")
QUOTE_CHARS = 40          # client data quoted in an error: at most this many characters
MAX_REASON_CHARS = 300    # an error's reason (and so its log line) is never longer
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_MESSAGES = 512
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
GREEDY_EPS = 1e-5         # vLLM's _SAMPLING_EPS: below it, temperature means greedy
# vLLM's own bound on a structured-output JSON schema's nesting (MAX_STRUCTURED_OUTPUT_JSON_NESTING).
MAX_SCHEMA_DEPTH = 64


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of client data, cut to a short prefix (a 1 MB value must not echo back)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class InvalidInput(ValueError):
    """A client error: becomes a Triton INVALID_ARG error ``<field>: <reason>``.

    ``field`` and ``reason`` are data, so callers re-target an error (e.g. the planner's
    ``history``) by the field, never by rewriting the message.
    """

    def __init__(self, field_name: str, reason: str) -> None:
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "..."
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


# ---------------------------------------------------------------------- limits

@dataclass(frozen=True)
class Limits:
    """Bounds applied before parsing, and facts about the engine vLLM would check against.

    Configurable per model in config.pbtxt ``parameters`` (or ``RUFUS_<NAME>`` in the
    environment): ``max_input_bytes``, ``max_parameters_bytes``, ``max_json_depth``.
    """

    max_input_bytes: int = 1 << 20        # text_input, messages, question, history
    max_parameters_bytes: int = 256 << 10  # sampling_parameters tensor, request parameters
    max_json_depth: int = 32
    vocab_size: int | None = None          # stop_token_ids must be below it (vLLM's check)
    max_logprobs: int = MAX_LOGPROBS
    loras: tuple[str, ...] | None = None   # None: LoRA not enabled for the model

    @classmethod
    def from_settings(cls, get: Callable[[str, str], str], **facts: Any) -> Limits:
        """``get(name, default)`` reads a config parameter (environment first)."""
        kw: dict[str, Any] = {}
        for name in ("max_input_bytes", "max_parameters_bytes", "max_json_depth"):
            raw = get(name, str(getattr(cls, name)))
            try:
                kw[name] = int(raw)
            except ValueError as exc:
                raise ValueError(f"config parameter {name} (RUFUS_{name.upper()}) must be an "
                                 f"integer, got {raw!r}") from exc
            if kw[name] < 1:
                raise ValueError(f"config parameter {name} must be >= 1, got {raw!r}")
        return cls(**kw, **facts)


    @classmethod
    def for_model(cls, get: Callable[[str, str], str], engine: Any,
                  loras: Iterable[str] | None = None) -> Limits:
        """Configured bounds plus what the running engine knows (vocabulary size)."""
        vocab = None
        try:
            vocab = int(engine.model_config.get_vocab_size())
        except Exception:  # noqa: BLE001 - an engine without it: the int32 bound applies
            vocab = None
        return cls.from_settings(get, vocab_size=vocab,
                                 loras=None if loras is None else tuple(loras))


DEFAULT_LIMITS = Limits()


# ---------------------------------------------------------------------- input table

@dataclass(frozen=True)
class InputSpec:
    """One Triton input: its config entry and which size bound applies to it."""

    name: str
    data_type: str
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    bound: str = "max_input_bytes"  # Limits attribute bounding a TYPE_STRING input

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "data_type": self.data_type, "dims": list(self.dims),
                "optional": self.optional}


@dataclass(frozen=True)
class OutputSpec:
    name: str
    data_type: str
    dims: tuple[int, ...] = (-1,)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "data_type": self.data_type, "dims": list(self.dims)}


RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
# rufus_llm: the official Triton vLLM backend's inputs (text only) plus ``messages``.
LLM_INPUT_SPECS: tuple[InputSpec, ...] = (
    InputSpec("text_input", "TYPE_STRING"),
    InputSpec("messages", "TYPE_STRING"),
    InputSpec("stream", "TYPE_BOOL"),
    InputSpec("sampling_parameters", "TYPE_STRING", bound="max_parameters_bytes"),
    InputSpec("exclude_input_in_output", "TYPE_BOOL"),
    *(InputSpec(name, "TYPE_BOOL") for name in RETURN_FLAGS),
)
LLM_OUTPUT_SPECS: tuple[OutputSpec, ...] = (
    OutputSpec("text_output", "TYPE_STRING"),
    OutputSpec("finish_reason", "TYPE_STRING"),
    OutputSpec("cumulative_logprob", "TYPE_FP32"),
    OutputSpec("logprobs", "TYPE_STRING"),
    OutputSpec("num_input_tokens", "TYPE_UINT32", (1,)),
    OutputSpec("num_output_tokens", "TYPE_UINT32"),
)
KNOWN_INPUTS = frozenset(spec.name for spec in LLM_INPUT_SPECS)


def _single(name: str, arr: np.ndarray) -> Any:
    flat = np.asarray(arr).reshape(-1)
    if flat.size != 1:
        raise InvalidInput(name, f"expected exactly one element, got {flat.size}")
    return flat[0]


def read_string(name: str, arr: np.ndarray, max_bytes: int) -> str:
    """One TYPE_STRING element as text: size bound first, then strict UTF-8."""
    value = _single(name, arr)
    if isinstance(value, bytes | np.bytes_):
        raw = bytes(value)
        if len(raw) > max_bytes:
            raise InvalidInput(name, f"is {len(raw)} bytes; at most {max_bytes}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(name, f"is not valid UTF-8 (byte {exc.start})") from exc
    if isinstance(value, str):
        if len(value) > max_bytes:
            raise InvalidInput(name, f"is {len(value)} characters; at most {max_bytes}")
        check_text(name, value)
        return value
    raise InvalidInput(name, f"must be a string (TYPE_STRING/BYTES), got {np.asarray(arr).dtype}")


def read_text(name: str, arr: np.ndarray) -> str:
    """:func:`read_string` with the default input bound (for adapters without Limits)."""
    return read_string(name, arr, DEFAULT_LIMITS.max_input_bytes)


_text = read_text  # old private name, still imported by rufus/assistant/triton_model.py


def read_bool(name: str, arr: np.ndarray) -> bool:
    value = _single(name, arr)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidInput(name, f"must be TYPE_BOOL, got {np.asarray(arr).dtype}")


def decode_inputs(specs: Iterable[InputSpec], inputs: Mapping[str, np.ndarray | None],
                  limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The inputs present, each read as its declared type (str or bool)."""
    out: dict[str, Any] = {}
    for spec in specs:
        arr = inputs.get(spec.name)
        if arr is None:
            continue
        if spec.data_type == "TYPE_STRING":
            out[spec.name] = read_string(spec.name, arr, getattr(limits, spec.bound))
        elif spec.data_type == "TYPE_BOOL":
            out[spec.name] = read_bool(spec.name, arr)
        else:  # pragma: no cover - the tables only declare these two
            raise TypeError(f"no decoder for {spec.data_type}")
    return out


# ---------------------------------------------------------------------- JSON, bounded

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_depth_exceeds(text: str, limit: int) -> bool:
    """True when arrays/objects nest deeper than ``limit``; a loop, never recursion."""
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def check_text(name: str, text: str) -> None:
    """Reject lone surrogates (JSON ``"\\ud800"``): the tokenizer and vLLM's msgpack
    transport cannot encode them."""
    m = _SURROGATE.search(text)
    if m:
        raise InvalidInput(name, f"contains a lone surrogate (U+{ord(m.group()):04X}) at "
                                 f"character {m.start()}; send valid Unicode")


def load_json(name: str, text: str, limits: Limits = DEFAULT_LIMITS,
              max_bytes: int | None = None) -> Any:
    """``json.loads`` behind a size bound and a nesting bound (no RecursionError possible)."""
    bound = limits.max_parameters_bytes if max_bytes is None else max_bytes
    if len(text) > bound:
        raise InvalidInput(name, f"is {len(text)} characters; at most {bound}")
    if json_depth_exceeds(text, limits.max_json_depth):
        raise InvalidInput(name, f"nests deeper than {limits.max_json_depth} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(name, f"is not valid JSON ({exc.msg} at character {exc.pos})") from exc
    except RecursionError as exc:  # pragma: no cover - the pre-scan bounds depth first
        raise InvalidInput(name, "nests too deeply") from exc


# ---------------------------------------------------------------- sampling parameters

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


def find_surrogate(value: Any) -> str | None:
    """Path (``.key[3]``) of the first string or key holding a lone surrogate; iterative."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return path
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and _SURROGATE.search(k):
                    return f"{path}.{k.encode('utf-8', 'replace').decode()[:QUOTE_CHARS]}"
                stack.append((f"{path}.{k}", item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
    return None


def validate_sampling(raw: Mapping[str, Any], from_parameters: bool = False,
                      limits: Limits = DEFAULT_LIMITS,
                      allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """Check keys, convert and range-check values; returns kwargs for ``vllm.SamplingParams``
    (plus ``lora_name``). Strings are read as the field's type wherever they come from, as
    the official backend does; ``from_parameters`` is kept for callers and changes nothing."""
    keys = set(SAMPLING_FIELDS) if allowed is None else set(allowed)
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise InvalidInput("sampling_parameters",
                           f"unknown key(s) {quote(unknown, 120)}; supported: {sorted(keys)}")
    out = {name: SAMPLING_FIELDS[name](name, value, limits) for name, value in raw.items()}
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


# ---------------------------------------------------------------------- chat messages

def parse_messages(text: str, field_name: str = "messages", limits: Limits = DEFAULT_LIMITS,
                   *, last_may_be_assistant: bool = False,
                   allow_empty: bool = False) -> list[dict[str, str]]:
    """A JSON list of ``{role, content}`` chat turns; errors name ``field_name[i].key``."""
    value = load_json(field_name, text, limits, max_bytes=limits.max_input_bytes)
    if not isinstance(value, list) or (not value and not allow_empty):
        raise InvalidInput(field_name, "must be a non-empty JSON list of {role, content}")
    if len(value) > MAX_MESSAGES:
        raise InvalidInput(field_name, f"{len(value)} messages; at most {MAX_MESSAGES}")
    out = []
    for i, msg in enumerate(value):
        where = f"{field_name}[{i}]"
        if not isinstance(msg, dict):
            raise InvalidInput(where, "must be an object with 'role' and 'content'")
        extra = sorted(set(msg) - {"role", "content", "name"})
        if extra:
            raise InvalidInput(where, f"unknown key(s) {quote(extra, 120)}")
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            raise InvalidInput(f"{where}.role", f"must be one of {list(CHAT_ROLES)}, got {quote(role)}")
        if not isinstance(content, str):
            raise InvalidInput(f"{where}.content", "must be a string")
        check_text(f"{where}.content", content)
        out.append({"role": role, "content": content})
    if out and out[-1]["role"] == "assistant" and not last_may_be_assistant:
        raise InvalidInput(field_name, "the last message must not be from the assistant")
    if out and not any(m["content"].strip() for m in out):
        raise InvalidInput(field_name, "all messages are empty")
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
    # The client's field to blame when the rendered prompt is unusable (too long, empty).
    prompt_field: str = "text_input"
    # Did the client ask for per-token logprobs (sampling_parameters.logprobs)? Without it the
    # ``logprobs`` output is JSON null, as in the official backend.
    logprobs_requested: bool = False
    lora_name: str | None = None


def request_parameters(parameters_json: str | None, limits: Limits) -> dict[str, Any]:
    """Triton request parameters (gRPC ``parameters`` / HTTP generate ``"parameters"``)."""
    if not parameters_json:
        return {}
    return parse_sampling_json(parameters_json, limits, name="parameters")


def _param_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise InvalidInput(f"parameters.{name}", f"must be true or false, got {quote(v)}")


def parse_generate_request(
    inputs: Mapping[str, np.ndarray | None],
    parameters_json: str | None = None,
    default_max_tokens: int = 256,
    limits: Limits = DEFAULT_LIMITS,
) -> GenerateRequest:
    """Validate the tensors and request parameters of one rufus_llm request.

    ``sampling_parameters`` may come as the input tensor (official backend style) and/or
    as Triton request parameters; the tensor wins on conflicts. ``stream`` may also come as
    a request parameter (the official README's HTTP generate example sends it there).
    """
    values = decode_inputs(LLM_INPUT_SPECS, inputs, limits)
    text, msgs_raw = values.get("text_input"), values.get("messages")
    if text is None and msgs_raw is None:
        raise InvalidInput("text_input", "missing: send 'text_input' or 'messages'")
    if text is not None and msgs_raw is not None:
        raise InvalidInput("messages", "send either 'text_input' or 'messages', not both")
    if text is not None:
        check_text("text_input", text)
        if not text.strip():
            raise InvalidInput("text_input", "is empty")
    messages = parse_messages(msgs_raw, limits=limits) if msgs_raw is not None else None

    params = request_parameters(parameters_json, limits)
    stream_param = params.pop("stream", None)
    stream = values.get("stream")
    if stream is None:
        stream = False if stream_param is None else _param_bool("stream", stream_param)
    sampling = merge_sampling(values.get("sampling_parameters"), params, limits=limits,
                              default_max_tokens=default_max_tokens)
    if stream and sampling.get("n", 1) > 1:
        raise InvalidInput("sampling_parameters.n", "n > 1 is not supported with stream=true")

    # The official default: streaming excludes the input, non-streaming prepends it;
    # chat callers (``messages``, our extension) want the answer only.
    exclude = values.get("exclude_input_in_output")
    if exclude is None:
        exclude = stream or messages is not None
    if stream and not exclude:
        raise InvalidInput("exclude_input_in_output",
                           "When streaming, `exclude_input_in_output` = False is not allowed.")
    req = GenerateRequest(
        prompt=text,
        messages=messages,
        stream=stream,
        sampling=sampling,
        exclude_input_in_output=exclude,
        prompt_field="messages" if messages is not None else "text_input",
        lora_name=sampling.pop("lora_name", None),
    )
    for name in RETURN_FLAGS:
        setattr(req, name, values.get(name, False))
    finish_logprobs(req)
    return req


def finish_logprobs(req: GenerateRequest) -> None:
    """``logprobs`` output is null unless the client set ``sampling_parameters.logprobs``;
    a requested cumulative logprob still needs vLLM to compute the sampled token's."""
    req.logprobs_requested = "logprobs" in req.sampling
    if req.return_cumulative_logprob and not req.logprobs_requested:
        req.sampling["logprobs"] = 0


def check_prompt_length(n_prompt: int, max_tokens: int, max_model_len: int, field_name: str) -> None:
    """Reject prompts the engine could never finish, before they take a slot."""
    if n_prompt == 0:
        raise InvalidInput(field_name, "prompt is empty after tokenization")
    if n_prompt >= max_model_len:
        raise InvalidInput(
            field_name,
            f"prompt has {n_prompt} tokens; the model's context is {max_model_len} tokens",
        )
