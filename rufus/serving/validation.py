"""Validation rules shared by every model and the OpenAI frontend: nothing a client sends
reaches an engine before it has passed them, and every error names the field.

Pure Python (numpy only), independent of Triton: a model's adapter extracts tensors, and
its parser (declared with the model: ``rufus/serving/llm.py``, ``rufus/qp/model.py``,
``rufus/assistant/triton_model.py``) calls these rules.

* Each model's inputs are declared once, as an :class:`InputSpec` table: the table drives the
  auto-completed Triton config, decoding (:func:`decode_inputs`) and the known-inputs set;
  ``tests/unit/test_inputs.py`` checks every table against its ``config.pbtxt``.
* Every JSON input is bounded before it is parsed: size (bytes) first, then nesting depth by
  a non-recursive pre-scan, so neither a huge value nor deep nesting reaches ``json.loads``.
* A conversation (the planner's and the assistant's ``question`` + ``history``, the
  frontend's ``rufus-assistant`` messages) has one set of bounds, here
  (:data:`MAX_QUESTION_CHARS`, :data:`MAX_HISTORY_TURNS`, :func:`read_conversation`).
* Errors are :class:`rufus.errors.InvalidInput` and quote at most a short prefix of client
  data (:func:`quote`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rufus.errors import InvalidInput
from rufus.serving.settings import param

MAX_LOGPROBS = 20
CHAT_ROLES = ("system", "user", "assistant")
QUOTE_CHARS = 40          # client data quoted in an error: at most this many characters
MAX_MESSAGES = 512
# A conversation's bounds, the same for the planner, the assistant and the frontend: a valid
# assistant request is a valid planner request.
MAX_QUESTION_CHARS = 1000
MAX_HISTORY_TURNS = 8


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of client data, cut to a short prefix (a 1 MB value must not echo back)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"



# ---------------------------------------------------------------------- limits

@dataclass(frozen=True)
class Limits:
    """Bounds applied before parsing, and facts about the engine vLLM would check against.

    The first three are config.pbtxt ``parameters`` of every model (``RUFUS_<NAME>`` in the
    environment wins; rufus/serving/settings.py reads them once at load).
    """

    max_input_bytes: int = param("max_input_bytes", 1 << 20, "bytes of one string input "
                                 "(text_input, messages, question, history)", minimum=1)
    max_parameters_bytes: int = param("max_parameters_bytes", 256 << 10,
                                      "bytes of the sampling_parameters input and of the "
                                      "request parameters", minimum=1)
    max_json_depth: int = param("max_json_depth", 32, "nesting depth of a JSON input",
                                minimum=1)
    vocab_size: int | None = None          # stop_token_ids must be below it (vLLM's check)
    max_logprobs: int = MAX_LOGPROBS
    loras: tuple[str, ...] | None = None   # None: LoRA not enabled for the model
    # the engine drafts tokens (speculative_config): vLLM then refuses min_p and logit_bias
    speculative: bool = False

    def with_engine(self, engine: Any, loras: Iterable[str] | None = None) -> Limits:
        """These bounds plus what the running engine knows (vocabulary size)."""
        vocab = None
        try:
            vocab = int(engine.model_config.get_vocab_size())
        except Exception:  # noqa: BLE001 - an engine without it: the int32 bound applies
            vocab = None
        spec = getattr(getattr(engine, "vllm_config", None), "speculative_config", None)
        return replace(self, vocab_size=vocab, loras=None if loras is None else tuple(loras),
                       speculative=spec is not None)


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


# ---------------------------------------------------------------------- chat messages

def check_turns(value: list[Any], field_name: str) -> list[dict[str, str]]:
    """Each item a ``{role, content[, name]}`` turn with a known role and text content;
    errors name ``field_name[i].key``. Iterative: nothing here recurses into client data."""
    if len(value) > MAX_MESSAGES:
        raise InvalidInput(field_name, f"{len(value)} messages; at most {MAX_MESSAGES}")
    out = []
    for i, msg in enumerate(value):
        where = f"{field_name}[{i}]"
        if not isinstance(msg, dict):
            raise InvalidInput(where, "must be an object with 'role' and 'content'")
        extra = sorted(str(k) for k in set(msg) - {"role", "content", "name"})
        if extra:
            raise InvalidInput(where, f"unknown key(s) {quote(extra, 120)}")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidInput(f"{where}.role", f"must be one of {list(CHAT_ROLES)}, got {quote(role)}")
        if not isinstance(content, str):
            raise InvalidInput(f"{where}.content", "must be a string")
        check_text(f"{where}.content", content)
        out.append({"role": role, "content": content})
    return out


def check_messages(value: Any, field_name: str = "messages") -> list[dict[str, str]]:
    """A chat to answer: a non-empty list of turns, not ending with the assistant, not all
    empty (rufus_llm's ``messages``, the frontend's chat ``messages``)."""
    if not isinstance(value, list) or not value:
        raise InvalidInput(field_name, "must be a non-empty JSON list of {role, content}")
    out = check_turns(value, field_name)
    if out[-1]["role"] == "assistant":
        raise InvalidInput(field_name, "the last message must not be from the assistant")
    if not any(m["content"].strip() for m in out):
        raise InvalidInput(field_name, "all messages are empty")
    return out


def parse_messages(text: str, field_name: str = "messages",
                   limits: Limits = DEFAULT_LIMITS) -> list[dict[str, str]]:
    """:func:`check_messages` of a JSON text, bounded before it is parsed."""
    return check_messages(load_json(field_name, text, limits, max_bytes=limits.max_input_bytes),
                          field_name)


# ---------------------------------------------------------------------- conversation

def check_question(question: Any) -> str:
    """The customer's question: text, not blank, at most :data:`MAX_QUESTION_CHARS`."""
    if question is None:
        raise InvalidInput("question", "missing: send the customer's question")
    if not isinstance(question, str):
        raise InvalidInput("question", f"must be a string, got {type(question).__name__}")
    check_text("question", question)
    if not question.strip():
        raise InvalidInput("question", "is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InvalidInput("question", f"is {len(question)} characters; at most "
                                       f"{MAX_QUESTION_CHARS}")
    return question


def check_history(value: Any) -> list[dict[str, str]]:
    """Earlier turns of the conversation: a list of at most :data:`MAX_HISTORY_TURNS`
    ``{role, content}`` turns (it may end with the assistant's reply). ``None`` (JSON
    ``null``), like an absent ``history`` or ``[]``, means no earlier turns: the same for
    the planner, the assistant and the frontend."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("history", "must be a JSON list of {role, content} turns (or null), "
                                      f"got {type(value).__name__}")
    if len(value) > MAX_HISTORY_TURNS:
        raise InvalidInput("history", f"{len(value)} turns; at most {MAX_HISTORY_TURNS}")
    return check_turns(value, "history")


def read_conversation(values: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS
                      ) -> tuple[str, list[dict[str, str]]]:
    """``question`` and ``history`` as :func:`decode_inputs` read them (history is JSON text,
    bounded before it is parsed) -> the question and the earlier turns."""
    question = check_question(values.get("question"))
    text = values.get("history")
    history = None if text is None else load_json("history", text, limits,
                                                   max_bytes=limits.max_input_bytes)
    return question, check_history(history)


# The conversation key (rufus.wire.CONVERSATION_HEADER): an opaque routing key, never
# shown to a model; short printable ASCII so it is safe in headers, logs and hashes.
CONVERSATION_KEY_MAX = 128
_CONVERSATION_KEY = re.compile(r"[\x21-\x7e]+")


def check_conversation_key(value: Any, field_name: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field_name, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= CONVERSATION_KEY_MAX:
        raise InvalidInput(field_name, f"must be 1-{CONVERSATION_KEY_MAX} characters, "
                                       f"got {len(value)}")
    if not _CONVERSATION_KEY.fullmatch(value):
        raise InvalidInput(field_name, f"must be printable ASCII without spaces, got "
                                       f"{quote(value, 40)}")
    return value


def split_conversation(parameters_json: str | None, name: str,
                       limits: Limits = DEFAULT_LIMITS) -> tuple[str | None, str]:
    """Request parameters -> (the other parameters' JSON or None, the conversation key or "").

    tritonserver forwards the conversation header as a request parameter named ``name``
    (``--grpc-header-forward-pattern``); it is routing metadata, so it is taken out here,
    before any model reads its parameters. Hot path: requests without it are not parsed
    twice."""
    rest, key, _trace = split_metadata(parameters_json, name, limits)
    return rest, key


TRACE_PARAMETERS = ("traceparent", "tracestate")  # W3C Trace Context, forwarded like the key


def split_metadata(parameters_json: str | None, name: str, limits: Limits = DEFAULT_LIMITS
                   ) -> tuple[str | None, str, dict[str, str]]:
    """Request parameters -> (the rest's JSON or None, the conversation key or "", the W3C
    trace headers). Both are metadata tritonserver forwards from headers
    (``--grpc-header-forward-pattern``), taken out before any model reads its parameters.
    The key is checked (a bad one names it); a trace header that is no string is dropped,
    and a malformed one is ignored where it is read (W3C: the trace then starts there).
    Hot path: requests without either are not parsed."""
    if not parameters_json or (name not in parameters_json
                               and "trace" not in parameters_json):
        return parameters_json, "", {}
    params = load_json("parameters", parameters_json, limits)
    if not isinstance(params, dict) or not (name in params
                                            or any(t in params for t in TRACE_PARAMETERS)):
        return parameters_json, "", {}
    key = check_conversation_key(params.pop(name), name) if name in params else ""
    trace = {t: v for t in TRACE_PARAMETERS
             if isinstance(v := params.pop(t, None), str)}
    return (json.dumps(params) if params else None), key, trace
