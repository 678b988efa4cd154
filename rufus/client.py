"""Streaming gRPC client for rufus_llm (and any model with the Triton vLLM interface).

Each request opens its own bidirectional gRPC stream: an HTTP/2 load balancer routes per
stream, so this keeps routing per request (see docs/architecture.md).

    python scripts/client.py "What should I pack for a beach trip?"
    python scripts/client.py --chat "I need running shoes" --max-tokens 64
    python scripts/client.py --raw "The best running shoes for flat feet are"
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_URL = f"localhost:{os.environ.get('GRPC_PORT', '8001')}"


class RequestFailed(RuntimeError):
    """The server answered with an error; ``status`` is Triton's status name when known."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status


def build_inputs(
    grpcclient: Any,
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
    *,
    stream: bool = True,
    sampling: dict[str, Any] | None = None,
    flags: dict[str, bool] | None = None,
    raw: dict[str, Any] | None = None,
) -> list[Any]:
    """tritonclient InferInput objects; ``raw`` sends arbitrary tensors (tests of bad input)."""
    tensors: dict[str, np.ndarray] = {}
    if prompt is not None:
        tensors["text_input"] = np.array([prompt.encode("utf-8")], dtype=np.object_)
    if messages is not None:
        tensors["messages"] = np.array([json.dumps(messages).encode()], dtype=np.object_)
    tensors["stream"] = np.array([stream], dtype=bool)
    if sampling is not None:
        tensors["sampling_parameters"] = np.array([json.dumps(sampling).encode()], dtype=np.object_)
    for k, v in (flags or {}).items():
        tensors[k] = np.array([v], dtype=bool)
    for k, v in (raw or {}).items():
        tensors[k] = np.asarray(v)
    inputs = []
    for name, arr in tensors.items():
        dtype = "BYTES" if arr.dtype == np.object_ else ("BOOL" if arr.dtype == bool else None)
        if dtype is None:
            from tritonclient.utils import np_to_triton_dtype

            dtype = np_to_triton_dtype(arr.dtype)
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def _status(err: Any) -> str:
    """Triton's status, or the ``[CODE]`` our models put in front of streamed errors."""
    status = getattr(err, "status", None)
    s = status() if callable(status) else status
    if s:
        return str(s)
    msg = getattr(err, "message", None)
    text = (msg() if callable(msg) else msg) or str(err)
    if "[" in text and "]" in text:
        code = text[text.index("[") + 1:text.index("]")]
        if code.isupper():
            return code
    if "Request for unknown model" in text:
        # Triton's own message for a model that is not loaded (typo, or unloaded after its
        # engine died); unary gRPC calls carry NOT_FOUND for it, the stream drops the code
        return "NOT_FOUND"
    return ""


@dataclass
class Chunk:
    text: str
    outputs: dict[str, Any]
    t: float


@dataclass
class Result:
    chunks: list[Chunk] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def ttft(self) -> float:
        return self.chunks[0].t - self.start if self.chunks else float("nan")


def _outputs(result: Any) -> dict[str, Any]:
    out = {}
    for o in result.get_response().outputs:
        arr = result.as_numpy(o.name)
        out[o.name] = arr
    return out


def _text(outputs: dict[str, Any]) -> str:
    arr = outputs.get("text_output")
    if arr is None or arr.size == 0:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def generate(
    url: str,
    model: str,
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
    *,
    stream: bool = True,
    sampling: dict[str, Any] | None = None,
    flags: dict[str, bool] | None = None,
    raw: dict[str, Any] | None = None,
    timeout: float = 300.0,
    retries: int = 0,
) -> Iterator[Chunk]:
    """Yield response chunks as they arrive; raise :class:`RequestFailed` on a server error.

    ``retries``: how many times to resend a request that failed *before its first chunk*
    with a status that another unit may not have (:func:`retryable`: unit down, engine dead,
    at capacity, no healthy backend behind the load balancer). Each attempt is a new gRPC
    stream, so the balancer routes it afresh, normally to another unit. Once a chunk has
    been yielded, a failure is raised, never retried: the caller already holds part of the
    answer (backoff: :func:`retry_delay`).
    """
    for attempt in range(retries + 1):
        started = False
        try:
            for chunk in _generate_once(url, model, prompt, messages, stream=stream,
                                        sampling=sampling, flags=flags, raw=raw, timeout=timeout):
                started = True
                yield chunk
            return
        except RequestFailed as exc:
            if started or attempt == retries or not retryable(exc):
                raise
            time.sleep(retry_delay(attempt))


def retryable(exc: RequestFailed) -> bool:
    """Statuses that say "this server cannot take it, another might": UNAVAILABLE (unit down,
    engine dead, at capacity, no healthy backend) and NOT_FOUND (behind a load balancer every
    unit serves the same models, so a unit without the model has just unloaded it; a
    misspelt model name costs ``retries`` quick round trips before the same error)."""
    return "UNAVAILABLE" in exc.status or "NOT_FOUND" in exc.status


def retry_delay(attempt: int) -> float:
    """0.25, 0.5, 1, 2 s...: four retries span ~3.75 s, longer than the load balancer takes
    to drop a broken unit (<= ~2.5 s), so a retry is not sent back into the same failure."""
    return min(0.25 * 2**attempt, 2.0)


def _generate_once(
    url: str,
    model: str,
    prompt: str | None,
    messages: list[dict[str, str]] | None,
    *,
    stream: bool,
    sampling: dict[str, Any] | None,
    flags: dict[str, bool] | None,
    raw: dict[str, Any] | None,
    timeout: float,
) -> Iterator[Chunk]:
    import tritonclient.grpc as grpcclient

    q: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error)),
                            stream_timeout=timeout)
        client.async_stream_infer(
            model, build_inputs(grpcclient, prompt, messages, stream=stream, sampling=sampling,
                                flags=flags, raw=raw),
            enable_empty_final_response=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            result, error = q.get(timeout=max(deadline - time.monotonic(), 0.1))
            if error is not None:
                raise RequestFailed(str(error), _status(error))
            resp = result.get_response()
            final = resp.parameters.get("triton_final_response")
            if resp.outputs:
                outs = _outputs(result)
                yield Chunk(_text(outs), outs, time.monotonic())
            if final is not None and final.bool_param:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


async def agenerate(
    url: str,
    model: str,
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
    *,
    stream: bool = True,
    sampling: dict[str, Any] | None = None,
    flags: dict[str, bool] | None = None,
    timeout: float = 600.0,
    retries: int = 0,
) -> AsyncIterator[Chunk]:
    """asyncio version (one gRPC stream per request), used by the load generator.

    ``retries`` as in :func:`generate`: only :func:`retryable` errors, only before the
    first chunk."""
    import asyncio

    for attempt in range(retries + 1):
        started = False
        try:
            async for chunk in _agenerate_once(url, model, prompt, messages, stream=stream,
                                               sampling=sampling, flags=flags, timeout=timeout):
                started = True
                yield chunk
            return
        except RequestFailed as exc:
            if started or attempt == retries or not retryable(exc):
                raise
            await asyncio.sleep(retry_delay(attempt))


async def _agenerate_once(
    url: str,
    model: str,
    prompt: str | None,
    messages: list[dict[str, str]] | None,
    *,
    stream: bool,
    sampling: dict[str, Any] | None,
    flags: dict[str, bool] | None,
    timeout: float,
) -> AsyncIterator[Chunk]:
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aioclient

    inputs = build_inputs(grpcclient, prompt, messages, stream=stream, sampling=sampling,
                          flags=flags)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}

    import grpc

    async with aioclient.InferenceServerClient(url) as client:
        try:
            async for result, error in client.stream_infer(requests(), stream_timeout=timeout):
                if error is not None:
                    raise RequestFailed(str(error), _status(error))
                resp = result.get_response()
                if resp.outputs:
                    outs = _outputs(result)
                    yield Chunk(_text(outs), outs, time.monotonic())
                final = resp.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.RpcError as exc:
            # The aio stream raises transport failures (connection refused, stream reset by
            # a dying server or the load balancer) as raw gRPC errors: give them the same
            # shape as the sync client's, so callers see one error type with a status.
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            name = code.name if code is not None else "UNKNOWN"
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            raise RequestFailed(f"[{name}] {details}", name) from exc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stream an answer from rufus_llm over gRPC")
    ap.add_argument("prompt", help="the question or prompt")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--model", default="rufus_llm")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="send `messages` rendered with the model's chat template (default)")
    mode.add_argument("--raw", action="store_true",
                      help="send `text_input` as a raw completion prompt (an instruct model "
                           "often answers a bare question with end-of-text)")
    ap.add_argument("--system", default=None, help="system message for --chat")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-stream", action="store_true", help="one response at the end")
    a = ap.parse_args(argv)
    sampling = {"max_tokens": a.max_tokens, "temperature": a.temperature}
    messages = None
    prompt: str | None = a.prompt
    if not a.raw:
        messages = ([{"role": "system", "content": a.system}] if a.system else []) + [
            {"role": "user", "content": a.prompt}]
        prompt = None
    t0 = time.monotonic()
    first = None
    n = 0
    try:
        for chunk in generate(a.url, a.model, prompt, messages, stream=not a.no_stream,
                              sampling=sampling, flags={"exclude_input_in_output": True}):
            first = first or time.monotonic()
            n += 1
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    except RequestFailed as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    dt = time.monotonic() - t0
    ttft = (first - t0) if first else float("nan")
    print(f"\n[{n} responses, first after {ttft * 1000:.0f} ms, total {dt:.2f} s]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
