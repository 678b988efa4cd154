"""OpenAI request bodies -> validated Triton calls for rufus_llm.

The request schema is a small pydantic model of OpenAI's (plus vLLM's sampling extensions),
not vLLM's own protocol classes: those import torch (7 s and ~570 MB measured here) for a
process that never runs a model. Sampling values are then checked by the very rules
rufus_llm applies (:func:`rufus.serving.sampling.validate_sampling`), so a bad value gets its
400 here without a round trip and the two can never disagree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from rufus.errors import InvalidInput, RufusError
from rufus.serving.sampling import validate_sampling
from rufus.serving.validation import MAX_LOGPROBS, check_messages

# No max_tokens in a chat request means "until the context is full" (OpenAI); rufus_llm caps
# max_tokens at what the context leaves (max_model_len - prompt), so any larger value says so.
UNTIL_CONTEXT_END = 1 << 20
# OpenAI's legacy completions default.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_N = 16  # rufus_llm's bound on n
MAX_PROMPTS = 16  # prompts of one batched completions request


class APIError(Exception):
    """An error with OpenAI's body ``{"error": {message, type, param, code}}``: what the
    client receives, not a second vocabulary. An error of :mod:`rufus.errors` becomes one
    in :func:`openai_error` (the input's 400s too: :func:`bad_request`); raised directly
    are only the refusals that vocabulary has no type for, because they are the HTTP
    frontend's own: an unknown model (404), a body too large (413), a wrong API key (401),
    a model that serves chat only, and an unrecognized argument in OpenAI's wording."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code
        self.retry_after = retry_after
        self.rufus_code: str | None = None  # set when made from an error of the vocabulary

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(param: str | None, reason: str) -> APIError:
    """The client's input is wrong (:class:`InvalidInput`): 400 naming ``param``, which is
    already OpenAI's name (kept as given, not re-targeted like a Triton field)."""
    err = openai_error(InvalidInput(param or "", reason))
    err.param = param
    return err


# longest prompt_cache_key / user / x-rufus-conversation header accepted (hashed, never sent on)
CONVERSATION_SOURCE_MAX = 1024


def conversation_key(prompt_cache_key: str | None, header: str | None,
                     user: str | None) -> str | None:
    """The conversation key sent to Triton (rufus.wire.CONVERSATION_HEADER): a hash of the
    first of OpenAI's ``prompt_cache_key``, the ``x-rufus-conversation`` header and ``user``,
    so the raw value (often a user id) never leaves the frontend and any string is a valid
    key. Requests with the same key stay on one unit behind the ingress (its prefix cache)."""
    for name, value in (("prompt_cache_key", prompt_cache_key),
                        ("x-rufus-conversation", header), ("user", user)):
        if value:
            if len(value) > CONVERSATION_SOURCE_MAX:
                raise bad_request(name, f"at most {CONVERSATION_SOURCE_MAX} characters, "
                                        f"got {len(value)}")
            return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return None


class _Strict(BaseModel):
    """Unknown fields fail validation (OpenAI's "Unrecognized request argument").

    ``REFUSED`` names the OpenAI fields this server knows but has no counterpart for: the
    schema takes them with any value and sets them aside, so they are refused by name
    (:meth:`refused`) only once the rest of the body is valid; a null one counts as absent."""

    model_config = ConfigDict(extra="forbid")
    REFUSED: ClassVar[tuple[str, ...]] = ()
    _refused: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _set_aside_refused(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not cls.REFUSED or not isinstance(data, dict):
            return handler(data)
        model = handler({k: v for k, v in data.items() if k not in cls.REFUSED})
        model._refused = [name for name in cls.REFUSED if data.get(name) is not None]
        return model

    def refused(self) -> str | None:
        """The first ``REFUSED`` field (in that order) the client sent a value for."""
        return self._refused[0] if self._refused else None


class StreamOptions(_Strict):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM's; accepted, not honoured (see README)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(_Strict):
    # fields of assistant/tool turns that a text-only chat template cannot carry
    REFUSED = ("tool_calls", "tool_call_id", "function_call", "audio")

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    refusal: Any = None  # an assistant turn's; accepted and ignored


class _Sampling(_Strict):
    """Fields shared by both endpoints: OpenAI's, then vLLM's sampling extensions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    # conversation affinity (see conversation_key): OpenAI's prompt_cache_key ("requests
    # that share a prefix"), else the x-rufus-conversation header, else user
    user: str | None = Field(None, max_length=CONVERSATION_SOURCE_MAX)
    prompt_cache_key: str | None = Field(None, max_length=CONVERSATION_SOURCE_MAX)
    # vLLM's extensions (its OpenAI server accepts them; vllm bench sends some)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None


class ChatCompletionRequest(_Sampling):
    # OpenAI features rufus_llm has no counterpart for: 400 when used
    REFUSED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
               "modalities", "audio", "prediction", "reasoning_effort", "web_search_options")

    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    # accepted and ignored: nothing is stored, no tiers
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


# ------------------------------------------------------------------------- parsing

def _loc(loc: tuple[Any, ...]) -> str:
    """pydantic's error location -> OpenAI's ``param`` (``messages[0].content``)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]", "list[int]", "list[list[int]]", "list[ContentPart]",
                      "StreamOptions") or str(part).startswith(("function-", "literal")):
            continue  # union member names pydantic adds
        else:
            out += ("." if out else "") + str(part)
    return out


def parse_body(model: type[_Sampling], body: bytes) -> Any:
    """JSON body -> request model, or a 400 naming the parameter."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            raise bad_request(None, f"request body is not valid JSON ({err['msg']})") from None
        if err["type"] == "model_type" and not err["loc"]:
            raise bad_request(None, "request body must be a JSON object") from None
        param = _loc(err["loc"])
        if err["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {param}",
                           param=param) from None
        if err["type"] == "missing":
            raise bad_request(param, "required") from None
        raise bad_request(param, err["msg"]) from None


# ------------------------------------------------------------------------- mapping

@dataclass
class TritonCall:
    """One rufus_llm request: either a raw prompt or chat messages."""

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParsedRequest:
    """What an endpoint does for one OpenAI request."""

    kind: Literal["chat", "completion"]
    model: str
    calls: list[TritonCall]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    echo: bool = False
    # the raw request (chat), for targets that are not rufus_llm (rufus-assistant)
    messages: list[dict[str, str]] | None = None
    # conversation affinity key (conversation_key), sent with every Triton call
    conversation: str | None = None
    # tracing on: this request's span, and the W3C headers that make it the parent of
    # every Triton call (rufus/telemetry/tracing.py)
    span: Any = None
    trace: dict[str, str] | None = None


_VLLM_EXTRAS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                "stop_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
                "include_stop_str_in_output")


def _param(field_name: str) -> str:
    return field_name.removeprefix("sampling_parameters.")


def _sampling(req: _Sampling, max_tokens: int) -> dict[str, Any]:
    """OpenAI fields -> rufus_llm's sampling_parameters, checked by rufus_llm's own rules."""
    if req.logit_bias:
        raise bad_request("logit_bias", "not supported by this server")
    out: dict[str, Any] = {"max_tokens": max_tokens}
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        if req.top_p == 0:  # the limit of nucleus sampling: always the most likely token
            out["temperature"] = 0.0
        else:
            out["top_p"] = req.top_p
    for name in ("stop", "seed", "presence_penalty", "frequency_penalty", *_VLLM_EXTRAS):
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    if req.n is not None and req.n > 1:
        out["n"] = req.n
    if isinstance(out.get("stop"), list) and not out["stop"]:
        del out["stop"]
    try:
        return validate_sampling(out)
    except InvalidInput as exc:
        name = _param(exc.field)
        raise bad_request(name, exc.reason) from None


def _stream_flags(req: _Sampling) -> tuple[bool, bool]:
    stream = bool(req.stream)
    if req.stream_options is not None and not stream:
        raise bad_request("stream_options", "only allowed when stream is true")
    include_usage = bool(stream and req.stream_options and req.stream_options.include_usage)
    n = req.n or 1
    if n > MAX_N:
        raise bad_request("n", f"must be <= {MAX_N}, got {n}")
    if stream and n > 1:
        raise bad_request("n", "n > 1 is not supported with stream=true")
    return stream, include_usage


def _max_tokens(value: int | None, name: str, default: int) -> int:
    if value is None:
        return default
    if value < 1:
        raise bad_request(name, f"must be >= 1, got {value}")
    return value


def _text_content(i: int, msg: Message) -> str:
    where = f"messages[{i}]"
    content = msg.content
    if content is None:
        raise bad_request(f"{where}.content", "required (tool calls are not supported)")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"{where}.content[{j}].type",
                              f"only 'text' content parts are supported, got {part.type[:20]!r}")
        texts.append(part.text)
    return "\n".join(texts)


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    """OpenAI messages -> rufus_llm's ``messages`` (system/user/assistant, text only)."""
    out = []
    for i, msg in enumerate(req.messages):
        if (extra := msg.refused()) is not None:
            raise bad_request(f"messages[{i}].{extra}", "not supported by this server")
        role = "system" if msg.role == "developer" else msg.role
        if role not in ("system", "user", "assistant"):
            raise bad_request(f"messages[{i}].role",
                              "must be one of system, developer, user, assistant; "
                              f"got {msg.role[:20]!r}")
        out.append({"role": role, "content": _text_content(i, msg)})
    try:
        return check_messages(out)
    except InvalidInput as exc:
        raise bad_request(exc.field, exc.reason) from None


def parse_chat(req: ChatCompletionRequest, conversation: str | None = None) -> ParsedRequest:
    """``conversation``: the x-rufus-conversation header, if the client sent one."""
    if (name := req.refused()) is not None:
        raise bad_request(name, "not supported by this server")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise bad_request("response_format", "only {'type': 'text'} is supported")
    stream, include_usage = _stream_flags(req)
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens", "conflicts with max_completion_tokens; send one")
    name, value = (("max_completion_tokens", req.max_completion_tokens)
                   if req.max_completion_tokens is not None else ("max_tokens", req.max_tokens))
    sampling = _sampling(req, _max_tokens(value, name, UNTIL_CONTEXT_END))
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise bad_request("top_logprobs", "requires logprobs=true")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad_request("top_logprobs", f"must be in [0, {MAX_LOGPROBS}]")
    if req.logprobs:
        sampling["logprobs"] = req.top_logprobs or 0
    messages = chat_messages(req)
    return ParsedRequest("chat", req.model, [TritonCall(messages=messages, sampling=sampling)],
                n=req.n or 1, stream=stream, include_usage=include_usage,
                logprobs=bool(req.logprobs), messages=messages,
                conversation=conversation_key(req.prompt_cache_key, conversation, req.user))


def parse_completion(req: CompletionRequest, conversation: str | None = None) -> ParsedRequest:
    if req.suffix:
        raise bad_request("suffix", "not supported by this server")
    given = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    prompts = [p for p in given if isinstance(p, str)]
    if not given or len(prompts) < len(given):
        raise bad_request("prompt", "must be a string or a non-empty list of strings "
                          "(token id prompts are not supported)")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request("prompt", f"at most {MAX_PROMPTS} prompts per request")
    for i, p in enumerate(prompts):
        if not p.strip():
            raise bad_request("prompt" if len(prompts) == 1 else f"prompt[{i}]", "is empty")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise bad_request("best_of", "only best_of == n is supported")
    stream, include_usage = _stream_flags(req)
    sampling = _sampling(req, _max_tokens(req.max_tokens, "max_tokens",
                                          COMPLETIONS_DEFAULT_MAX_TOKENS))
    if req.logprobs is not None:
        if not 0 <= req.logprobs <= MAX_LOGPROBS:
            raise bad_request("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {req.logprobs}")
        if req.echo:
            raise bad_request("echo", "echo with logprobs (prompt logprobs) is not supported")
        sampling["logprobs"] = req.logprobs
    return ParsedRequest("completion", req.model,
                [TritonCall(prompt=p, sampling=dict(sampling)) for p in prompts],
                n=req.n or 1, stream=stream, include_usage=include_usage,
                logprobs=req.logprobs is not None, echo=bool(req.echo),
                conversation=conversation_key(req.prompt_cache_key, conversation, req.user))


def openai_error(err: RufusError) -> APIError:
    """An error of the vocabulary (:mod:`rufus.errors`) -> OpenAI's error body, with the
    HTTP status the error's type derives. An INVALID_ARG names its OpenAI ``param``
    (rufus_llm's ``sampling_parameters.top_k`` is ``top_k``, ``text_input`` is ``prompt``)."""
    api = _openai_error(err)
    api.rufus_code = err.code  # the vocabulary's code, for the request's span (not sent)
    return api


def _openai_error(err: RufusError) -> APIError:
    if isinstance(err, InvalidInput):
        name = _param(err.field) if err.field else None
        if name == "text_input":
            name = "prompt"
        return APIError(err.http_status, err.message, param=name)
    if err.retryable:
        return APIError(err.http_status, f"service unavailable, retry later: {err.message}",
                        type_="server_error", code="service_unavailable", retry_after=1)
    if err.http_status == 504:
        return APIError(504, f"timed out: {err.message}", type_="server_error", code="timeout")
    if err.http_status == 499:
        return APIError(499, "request cancelled", type_="server_error", code="cancelled")
    return APIError(500, f"internal error: {err.message}", type_="server_error",
                    code="internal_error")
