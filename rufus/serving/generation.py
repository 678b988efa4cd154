"""One generation request through the engine: prompt -> tokens -> streamed responses.

Independent of Triton: responses go to a :class:`ResponseSink` (the Triton adapter wraps a
``response_sender``; tests use a list). Errors are :class:`ServiceError` with a status code
that the adapter maps onto Triton's error codes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from rufus.serving.engine import AtCapacity, EngineHost, EngineUnavailable
from rufus.serving.metrics import Metrics
from rufus.serving.requests import (
    GenerateRequest,
    InvalidInput,
    check_min_tokens,
    check_prompt_length,
)
from rufus.serving.responses import Outputs, build_outputs

log = logging.getLogger("rufus.serving.generation")

INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL"


@dataclass
class ServiceError(Exception):
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


class ResponseSink(Protocol):
    def send(self, outputs: Outputs | None, error: ServiceError | None, final: bool) -> None: ...
    def is_cancelled(self) -> bool: ...


_ids = itertools.count()


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns() % 1_000_000}"


_SENTINEL = "\ue000rufus-content-{}-{}\ue001"  # private-use characters: never client data


def special_token_texts(tokenizer: Any) -> list[str]:
    """The text of every special/added control token (``<|im_start|>``, ...)."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            texts.add(str(tok.content if hasattr(tok, "content") else tok))
    return sorted(t for t in texts if t)


class _Codec:
    """Private copies of a fast tokenizer's Rust core: ``plain`` (control-token text is a
    control token) and ``split`` (control-token text is plain text).

    Rendering runs in worker threads; the shared tokenizer is also used by the engine on its
    loop (detokenizing, grammars). Transformers implements ``split_special_tokens`` by
    flipping a flag on the shared tokenizer, which would race with those users, so we
    encode with our own copies, one thread at a time.
    """

    def __init__(self, backend: Any) -> None:
        from tokenizers import Tokenizer

        self.plain = Tokenizer.from_str(backend.to_str())
        self.split = Tokenizer.from_str(backend.to_str())
        self.split.encode_special_tokens = True
        self.lock = threading.Lock()

    def encode(self, text: str, *, split: bool, add_special_tokens: bool = False) -> list[int]:
        with self.lock:
            tok = self.split if split else self.plain
            return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)


_codecs: dict[int, tuple[Any, _Codec | None]] = {}
_codecs_lock = threading.Lock()


def codec_for(tokenizer: Any) -> _Codec | None:
    """The tokenizer's private codec (None for a tokenizer without a Rust core)."""
    key = id(tokenizer)
    with _codecs_lock:
        hit = _codecs.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        backend = getattr(tokenizer, "backend_tokenizer", None)
        codec = _Codec(backend) if backend is not None and hasattr(backend, "to_str") else None
        _codecs[key] = (tokenizer, codec)
        return codec


def render_chat(tokenizer: Any, messages: list[dict[str, str]], field_name: str = "messages"
                ) -> tuple[str, list[int]]:
    """Chat template -> (text, token ids) where the clients' content can never become a
    control token: the template is rendered with a placeholder per message, its own text is
    tokenized with special tokens recognised, and each content with special-token text
    split into plain text. So ``<|im_start|>system`` typed into a message is ordinary text,
    not a forged turn."""
    codec = codec_for(tokenizer)
    if codec is None:
        return _render_chat_strict(tokenizer, messages, field_name)
    nonce = time.monotonic_ns()
    marks = [_SENTINEL.format(nonce, i) for i in range(len(messages))]
    masked = [{**m, "content": marks[i]} for i, m in enumerate(messages)]
    try:
        rendered = tokenizer.apply_chat_template(masked, add_generation_prompt=True,
                                                 tokenize=False)
    except Exception as exc:
        raise InvalidInput(field_name, f"chat template rejected them: {exc}") from exc
    pieces: list[tuple[str, bool]] = []
    rest = rendered
    for i, mark in enumerate(marks):
        head, found, tail = rest.partition(mark)
        if not found or mark in tail:
            return _render_chat_strict(tokenizer, messages, field_name)
        pieces += [(head, False), (messages[i]["content"], True)]
        rest = tail
    pieces.append((rest, False))
    ids: list[int] = []
    for piece, is_content in pieces:
        if piece:
            ids += codec.encode(piece, split=is_content)
    return "".join(p for p, _ in pieces), ids


def _render_chat_strict(tokenizer: Any, messages: list[dict[str, str]], field_name: str
                        ) -> tuple[str, list[int]]:
    """A template that drops or repeats content: render it as is, refusing any content
    that holds control-token text (it could not be kept plain)."""
    specials = special_token_texts(tokenizer)
    for i, m in enumerate(messages):
        hit = next((s for s in specials if s in m["content"]), None)
        if hit is not None:
            raise InvalidInput(f"{field_name}[{i}].content",
                               f"contains the control token text {hit!r}")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text, tokenizer.encode(text, add_special_tokens=False)


def render_prompt(tokenizer: Any, req: GenerateRequest) -> tuple[str, list[int], str]:
    """Returns (prompt text, token ids, field name to blame if it is too long).

    CPU-bound (about 1 MB/s on 2 cores): :func:`run_generate` calls it in a worker thread so
    a large prompt does not stall the engine's event loop (the tokenizer releases the GIL).
    """
    if req.messages is not None:
        text, ids = render_chat(tokenizer, req.messages, req.prompt_field)
        return text, ids, req.prompt_field
    assert req.prompt is not None
    codec = codec_for(tokenizer)
    ids = (codec.encode(req.prompt, split=False, add_special_tokens=True) if codec is not None
           else tokenizer.encode(req.prompt))
    return req.prompt, ids, req.prompt_field


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class CancelWatcher:
    """Polls ``is_cancelled`` for every live request a few times a second.

    Polling one place keeps the per-token path free of IPC to the Triton server, and still
    aborts requests that are queued and produce no tokens. It polls on the engine loop:
    polling from its own thread measured far worse at 16 streams (docs/benchmarks.md, "A
    change that measured worse"), the GIL convoy effect also seen with a sender thread: each
    IPC releases the GIL and the thread then waits for the busy loop to hand it back, and
    the loop for it.
    """

    def __init__(self, host: EngineHost, interval: float = 0.25) -> None:
        self.host = host
        self.interval = interval
        self.live: dict[str, tuple[ResponseSink, asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, request_id: str, sink: ResponseSink) -> asyncio.Event:
        ev = asyncio.Event()
        self.live[request_id] = (sink, ev)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        return ev

    def forget(self, request_id: str) -> None:
        self.live.pop(request_id, None)

    async def _poll(self) -> None:
        while self.live:
            await asyncio.sleep(self.interval)
            for rid, (sink, ev) in list(self.live.items()):
                if ev.is_set():
                    continue
                try:
                    cancelled = sink.is_cancelled()
                except Exception:  # noqa: BLE001 - a broken sender counts as gone
                    cancelled = True
                if cancelled:
                    ev.set()
                    log.info("request %s cancelled by client; aborting in engine", rid)
                    await self.host.abort(rid)


def make_sampling_params(req: GenerateRequest, max_tokens: int, output_kind: Any) -> Any:
    """vLLM ``SamplingParams`` from the validated dict; a rejection vLLM still finds is the
    client's (INVALID_ARG naming sampling_parameters), never INTERNAL."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    kw = {**req.sampling, "max_tokens": max_tokens}
    so = kw.get("structured_outputs")
    try:
        if isinstance(so, dict):
            kw["structured_outputs"] = StructuredOutputsParams(**so)
        return SamplingParams(**kw, output_kind=output_kind)
    except Exception as exc:
        from vllm.exceptions import VLLMClientError

        if not isinstance(exc, ValueError | TypeError | VLLMClientError):
            raise
        name = getattr(exc, "parameter", None)
        raise InvalidInput("sampling_parameters" + (f".{name}" if name else ""),
                           short(str(exc))) from exc


def host_lora_request(host: EngineHost, lora_name: str | None) -> Any:
    """vLLM ``LoRARequest`` for an adapter named in the model's multi_lora.json."""
    if lora_name is None:
        return None
    loras: dict[str, str] = getattr(host, "loras", None) or {}
    if lora_name not in loras:
        raise InvalidInput("sampling_parameters.lora_name",
                           f"LoRA {lora_name!r} is not supported, we currently support "
                           f"{list(loras)}")
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name, list(loras).index(lora_name) + 1, loras[lora_name])


async def _engine_checked(gen: Any, req: GenerateRequest) -> Any:
    """vLLM's input processor rejects some values only inside ``generate`` (an invalid
    regex or JSON schema for structured outputs): before the first output, a ValueError is
    the client's input, reported as INVALID_ARG naming the field."""
    first = True
    try:
        async for out in gen:
            first = False
            yield out
    except Exception as exc:
        from vllm.exceptions import VLLMClientError

        if not first or not isinstance(exc, ValueError | VLLMClientError) \
                or type(exc).__name__ == "EngineDeadError":
            raise
        name = getattr(exc, "parameter", None)
        if name is None and "structured_outputs" in req.sampling:
            name = "structured_outputs"
        raise InvalidInput("sampling_parameters" + (f".{name}" if name else ""),
                           short(str(exc))) from exc


async def run_generate(
    host: EngineHost,
    watcher: CancelWatcher,
    req: GenerateRequest,
    sink: ResponseSink,
    metrics: Metrics,
    arrival: float,
    request_id: str,
) -> None:
    """Serve one request to completion; always ends the response stream exactly once."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    admitted = False
    outcome = "error"
    try:
        host.admit()
        admitted = True
        metrics.set_outstanding(host.outstanding)
        text, ids, field_name = await asyncio.get_running_loop().run_in_executor(
            None, render_prompt, host.tokenizer, req)
        check_prompt_length(len(ids), req.sampling["max_tokens"], host.max_model_len, field_name)
        max_tokens = min(req.sampling["max_tokens"], host.max_model_len - len(ids))
        if max_tokens < req.sampling["max_tokens"]:
            check_min_tokens(req.sampling.get("min_tokens", 0), max_tokens,
                             " after clamping to the context the prompt leaves")
        params = make_sampling_params(req, max_tokens, RequestOutputKind.DELTA if req.stream
                                      else RequestOutputKind.FINAL_ONLY)
        lora = host_lora_request(host, req.lora_name)
        cancelled = watcher.watch(request_id, sink)
        first: float | None = None
        last = arrival
        n_gen = 0
        final_out: Any = None
        gen = (host.generate(TokensPrompt(prompt_token_ids=ids), params, request_id)
               if lora is None else
               host.generate(TokensPrompt(prompt_token_ids=ids), params, request_id,
                             lora_request=lora))
        async for out in _engine_checked(gen, req):
            if cancelled.is_set():
                break
            now = time.monotonic()
            new_tokens = sum(len(c.token_ids) for c in out.outputs)
            if new_tokens:
                if first is None:
                    first = now
                    metrics.observe_ttft(now - arrival)
                    if new_tokens > 1:
                        metrics.observe_itl(now - last, new_tokens - 1)
                else:
                    metrics.observe_itl(now - last, new_tokens)
                last = now
            if req.stream:
                n_gen += new_tokens
                if new_tokens or out.finished:
                    sink.send(build_outputs(req, out.outputs, num_input_tokens=len(ids)),
                              None, out.finished)
            final_out = out
        if cancelled.is_set() or final_out is None or not final_out.finished:
            outcome = "cancelled"
            raise ServiceError(CANCELLED, "request was cancelled")
        if not req.stream:
            n_gen = sum(len(c.token_ids) for c in final_out.outputs)
            prefix = "" if req.exclude_input_in_output else text
            sink.send(build_outputs(req, final_out.outputs, num_input_tokens=len(ids),
                                    prefix=prefix), None, True)
        metrics.add_tokens(len(ids), n_gen)
        metrics.observe_latency(time.monotonic() - arrival)
        outcome = str(final_out.outputs[0].finish_reason or "finished")
    except InvalidInput as exc:
        outcome = "invalid"
        sink.send(None, ServiceError(INVALID_ARG, str(exc)), True)
    except AtCapacity as exc:
        outcome = "rejected"
        sink.send(None, ServiceError(UNAVAILABLE, str(exc)), True)
    except EngineUnavailable as exc:
        outcome = "unavailable"
        sink.send(None, ServiceError(UNAVAILABLE, str(exc)), True)
    except ServiceError as exc:
        sink.send(None, exc, True)
    except asyncio.CancelledError:
        await host.abort(request_id)
        sink.send(None, ServiceError(UNAVAILABLE, "server is shutting down"), True)
        raise
    except Exception as exc:
        log.exception("request %s failed", request_id)
        if not host.healthy:
            sink.send(None, ServiceError(UNAVAILABLE, f"engine unavailable: {host.dead_reason}"), True)
        else:
            sink.send(None, ServiceError(INTERNAL, short(f"{type(exc).__name__}: {exc}")), True)
    finally:
        watcher.forget(request_id)
        if admitted:
            host.release()
            metrics.set_outstanding(host.outstanding)
        metrics.count_request(outcome)
