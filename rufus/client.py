"""Streaming gRPC client for rufus_llm (and any model with the Triton vLLM interface).

Each request opens its own bidirectional gRPC stream: an HTTP/2 load balancer routes per
stream, so this keeps routing per request (see docs/architecture.md).

    python -m rufus.client "What should I pack for a beach trip?"   (or scripts/client.py)
    python -m rufus.client --chat "I need running shoes" --max-tokens 64
    python -m rufus.client --raw "The best running shoes for flat feet are"

The stream core (:func:`stream_outputs`, :func:`astream_outputs`) serves every model here;
:func:`generate` / :func:`agenerate` add rufus_llm's inputs and the retry rule, and
``rufus.qp.client`` adds the planner's.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np

from rufus.env import env_port, exits_on_env_error, help_text
from rufus.errors import RufusError, from_wire
from rufus.wire import CONVERSATION_HEADER  # the conversation key (rufus/wire/__init__.py)


def conversation_headers(conversation: str | None,
                         trace: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """gRPC metadata carrying the conversation key and the W3C trace headers (a span's
    ``traceparent``: rufus/telemetry/tracing.py ``headers``), or None without either."""
    out = dict(trace) if trace else {}
    if conversation:
        out[CONVERSATION_HEADER] = conversation
    return out or None


class RequestFailed(RuntimeError):
    """The server answered with an error, or the stream broke.

    ``error`` is the typed error of the vocabulary (:mod:`rufus.errors`), parsed once from
    the wire form; ``status`` is its code's name (``INVALID_ARG``, ``UNAVAILABLE``, ...).
    """

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.error: RufusError = from_wire(message, status)
        self.status = str(self.error.code)


def infer_inputs(grpcclient: Any, tensors: dict[str, np.ndarray]) -> list[Any]:
    """tritonclient ``InferInput`` objects for named numpy arrays (object arrays -> BYTES)."""
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


def bytes_tensor(value: str | Any) -> np.ndarray:
    """One BYTES element: a string as UTF-8, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value)
    return np.array([text.encode("utf-8")], dtype=np.object_)


def value_tensors(values: dict[str, Any]) -> dict[str, np.ndarray]:
    """Python values as one-element tensors: bool -> BOOL, an array as it is, anything else
    -> BYTES (a string as UTF-8, a dict or list as JSON)."""
    out: dict[str, np.ndarray] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            out[name] = np.array([value], dtype=bool)
        elif isinstance(value, np.ndarray):
            out[name] = value
        else:
            out[name] = bytes_tensor(value)
    return out


class LLMInputs(TypedDict, total=False):
    """rufus_llm's inputs besides the prompt: the keywords of :func:`build_inputs`, which
    :func:`generate` and :func:`agenerate` pass on as they are."""

    stream: bool
    sampling: dict[str, Any] | None
    flags: dict[str, bool] | None
    raw: dict[str, Any] | None


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
    """rufus_llm's inputs (the official vLLM backend's names); ``raw`` sends arbitrary
    tensors (tests of bad input)."""
    tensors: dict[str, np.ndarray] = {}
    if prompt is not None:
        tensors["text_input"] = bytes_tensor(prompt)
    if messages is not None:
        tensors["messages"] = bytes_tensor(messages)
    tensors["stream"] = np.array([stream], dtype=bool)
    if sampling is not None:
        tensors["sampling_parameters"] = bytes_tensor(sampling)
    for k, v in (flags or {}).items():
        tensors[k] = np.array([v], dtype=bool)
    for k, v in (raw or {}).items():
        tensors[k] = np.asarray(v)
    return infer_inputs(grpcclient, tensors)


def _reset_by_peer(status: str, details: str) -> bool:
    """A stream reset by the transport (the unit's process died and the load balancer reset
    the stream: RST_STREAM), not by this client (it never reads on after cancelling)."""
    return status.endswith("CANCELLED") and ("RST_STREAM" in details or "Stream removed" in details)


def _lost(prefix: str, details: str) -> RequestFailed:
    return RequestFailed(f"{prefix}[UNAVAILABLE] the connection to the unit was lost mid-stream "
                         f"({details.strip()[:200]})", "UNAVAILABLE")


def _failed(err: Any, prefix: str = "") -> RequestFailed:
    """A tritonclient error as :class:`RequestFailed`."""
    status = getattr(err, "status", None)
    s = str((status() if callable(status) else status) or "")
    if _reset_by_peer(s, str(err)):
        return _lost(prefix, str(err))
    return RequestFailed(f"{prefix}{err}", s)


@dataclass
class Chunk:
    text: str
    outputs: dict[str, Any]
    t: float


def output_str(outputs: dict[str, Any], name: str = "text_output") -> str:
    """The first element of a BYTES output as text ("" when absent)."""
    arr = outputs.get(name)
    if arr is None or arr.size == 0:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def _response(result: Any, error: Any, prefix: str = "") -> tuple[dict[str, Any] | None, bool]:
    """One streamed response -> (its outputs or None, is it the final one); raises on error."""
    if error is not None:
        raise _failed(error, prefix)
    resp = result.get_response()
    outputs = {o.name: result.as_numpy(o.name) for o in resp.outputs} if resp.outputs else None
    final = resp.parameters.get("triton_final_response")
    return outputs, bool(final is not None and final.bool_param)


def _rpc_failed(exc: Any, prefix: str = "") -> RequestFailed:
    """A transport failure of the aio stream (connection refused, stream reset by a dying
    server or the load balancer) in the same shape as a server error: one error type with a
    status for every caller."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    name = code.name if code is not None else "UNKNOWN"
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    if _reset_by_peer(name, details or ""):
        return _lost(prefix, details or "")
    return RequestFailed(f"{prefix}[{name}] {details}", name)


def stream_outputs(url: str, model: str, inputs: list[Any], *, timeout: float = 300.0,
                   client: Any = None, conversation: str | None = None,
                   parameters: dict[str, Any] | None = None,
                   trace: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """The stream core: send one request on its own gRPC stream (any model of this project,
    they are all decoupled) and yield each response's outputs until the final response.

    ``client``: a ``tritonclient.grpc`` client to reuse (kept open); otherwise one is
    opened and closed here. ``conversation``: the conversation key (:data:`CONVERSATION_HEADER`)
    sent as metadata; ``parameters``: Triton request parameters. Raises
    :class:`RequestFailed` on a server error."""
    import tritonclient.grpc as grpcclient

    q: queue.Queue[Any] = queue.Queue()
    own = client is None
    client = client or grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error)),
                            stream_timeout=timeout,
                            headers=conversation_headers(conversation, trace))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True,
                                  parameters=parameters)
        deadline = time.monotonic() + timeout
        while True:
            outputs, final = _response(*q.get(timeout=max(deadline - time.monotonic(), 0.1)))
            if outputs is not None:
                yield outputs
            if final:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        if own:
            client.close()


async def astream_outputs(url: str, model: str, inputs: list[Any], *, timeout: float = 600.0,
                          client: Any = None, prefix: str = "", conversation: str | None = None,
                          parameters: dict[str, Any] | None = None,
                          trace: Mapping[str, str] | None = None
                          ) -> AsyncGenerator[dict[str, Any], None]:
    """asyncio version of :func:`stream_outputs` (``client``: a ``tritonclient.grpc.aio``
    client, one HTTP/2 connection for many streams). ``prefix`` goes in front of error
    messages (a pipeline names the model that failed); ``parameters``: Triton request
    parameters. A caller that stops early cancels the gRPC stream, which Triton reports to
    the model as a cancelled request."""
    import contextlib

    import grpc
    import tritonclient.grpc.aio as aioclient

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True,
               "parameters": parameters}

    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(aioclient.InferenceServerClient(url))
        responses = None
        try:
            responses = client.stream_infer(requests(), stream_timeout=timeout,
                                            headers=conversation_headers(conversation, trace))
            async for result, error in responses:
                outputs, final = _response(result, error, prefix)
                if outputs is not None:
                    yield outputs
                if final:
                    return
        except grpc.RpcError as exc:
            raise _rpc_failed(exc, prefix) from exc
        finally:
            if responses is not None:
                responses.cancel()  # no-op once the stream ended; RST_STREAM otherwise


class AsyncStreams:
    """Streams to any model of this project on one long-lived ``tritonclient.grpc.aio``
    client (one HTTP/2 connection); each call is its own bidirectional stream, so a load
    balancer still routes per call. Create it inside the event loop that uses it (an aio
    channel belongs to its loop). Used by the assistant pipeline, its tests and scripts.
    """

    def __init__(self, url: str) -> None:
        import tritonclient.grpc.aio as aioclient

        self.url = url
        self.client = aioclient.InferenceServerClient(url)

    async def close(self) -> None:
        await self.client.close()

    def stream(self, model: str, values: dict[str, Any], timeout: float = 600.0,
               conversation: str | None = None, parameters: dict[str, Any] | None = None,
               trace: Mapping[str, str] | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """Each response's outputs (:func:`astream_outputs`); ``values`` are Python values
        (:func:`value_tensors`). Errors name the model; ``trace``: W3C trace headers."""
        import tritonclient.grpc as grpcclient

        return astream_outputs(self.url, model, infer_inputs(grpcclient, value_tensors(values)),
                               timeout=timeout, client=self.client, prefix=f"{model}: ",
                               conversation=conversation, parameters=parameters, trace=trace)


def retryable(exc: RequestFailed) -> bool:
    """Errors that say "this server cannot take it, another might" (``error.retryable``):
    UNAVAILABLE (unit down, engine dead, at capacity, no healthy backend) and NOT_FOUND
    (behind a load balancer every unit serves the same models, so a unit without the model
    has just unloaded it; a misspelt model name costs ``retries`` quick round trips before
    the same error)."""
    return exc.error.retryable


def retry_delay(attempt: int) -> float:
    """0.25, 0.5, 1, 2 s...: four retries span ~3.75 s, longer than the load balancer takes
    to drop a broken unit (<= ~2.5 s), so a retry is not sent back into the same failure."""
    return min(0.25 * 2**attempt, 2.0)


def _retry_after(exc: RequestFailed, started: bool, attempt: int, retries: int) -> float:
    """The one retry rule of :func:`generate` and :func:`agenerate`: the delay before the
    next attempt, or re-raise ``exc`` (a chunk was already yielded, attempts are used up, or
    another unit would answer the same)."""
    if started or attempt >= retries or not retryable(exc):
        raise exc
    return retry_delay(attempt)


def generate(url: str, model: str, prompt: str | None = None,
             messages: list[dict[str, str]] | None = None, *, timeout: float = 300.0,
             retries: int = 0, conversation: str | None = None,
             **inputs: Unpack[LLMInputs]) -> Iterator[Chunk]:
    """Yield response chunks as they arrive; raise :class:`RequestFailed` on a server error.

    ``retries``: how many times to resend a request that failed *before its first chunk*
    with a status that another unit may not have (:func:`retryable`: unit down, engine dead,
    at capacity, no healthy backend behind the load balancer). Each attempt is a new gRPC
    stream, so the balancer routes it afresh, normally to another unit. Once a chunk has
    been yielded, a failure is raised, never retried: the caller already holds part of the
    answer (backoff: :func:`retry_delay`). ``conversation``: the conversation key, which
    keeps a conversation's requests on one unit behind the ingress (:data:`CONVERSATION_HEADER`).
    ``inputs``: ``stream`` (default true), ``sampling``, ``flags``, ``raw``, as
    :func:`build_inputs` takes them.
    """
    import tritonclient.grpc as grpcclient

    built = build_inputs(grpcclient, prompt, messages, **inputs)
    for attempt in range(retries + 1):
        started = False
        try:
            for chunk in _generate_once(url, model, built, timeout, conversation):
                started = True
                yield chunk
            return
        except RequestFailed as exc:
            time.sleep(_retry_after(exc, started, attempt, retries))


def _generate_once(url: str, model: str, inputs: list[Any], timeout: float,
                   conversation: str | None = None) -> Iterator[Chunk]:
    """One attempt: a new gRPC stream (so a load balancer routes it afresh)."""
    for outs in stream_outputs(url, model, inputs, timeout=timeout, conversation=conversation):
        yield Chunk(output_str(outs), outs, time.monotonic())


async def agenerate(url: str, model: str, prompt: str | None = None,
                    messages: list[dict[str, str]] | None = None, *, timeout: float = 600.0,
                    retries: int = 0, client: Any = None, conversation: str | None = None,
                    trace: Mapping[str, str] | None = None,
                    **inputs: Unpack[LLMInputs]) -> AsyncIterator[Chunk]:
    """asyncio version (one gRPC stream per request), used by the load generator.

    ``retries`` as in :func:`generate`: only :func:`retryable` errors, only before the
    first chunk. ``client``: a long-lived ``tritonclient.grpc.aio`` client to open the
    stream on (one HTTP/2 connection for many requests, as the OpenAI frontend does);
    without it each request opens and closes its own connection."""
    import asyncio

    import tritonclient.grpc as grpcclient

    built = build_inputs(grpcclient, prompt, messages, **inputs)
    for attempt in range(retries + 1):
        started = False
        try:
            async for chunk in _agenerate_once(url, model, built, timeout, client, conversation,
                                               trace):
                started = True
                yield chunk
            return
        except RequestFailed as exc:
            await asyncio.sleep(_retry_after(exc, started, attempt, retries))


async def _agenerate_once(url: str, model: str, inputs: list[Any], timeout: float,
                          client: Any, conversation: str | None = None,
                          trace: Mapping[str, str] | None = None) -> AsyncIterator[Chunk]:
    """One attempt, as :func:`_generate_once`."""
    async for outs in astream_outputs(url, model, inputs, timeout=timeout, client=client,
                                      conversation=conversation, trace=trace):
        yield Chunk(output_str(outs), outs, time.monotonic())


def default_url() -> str:
    """``localhost:$GRPC_PORT`` (8001); a bad ``GRPC_PORT`` raises an error naming it."""
    return f"localhost:{env_port('GRPC_PORT', 8001)}"


def cli_parser(description: str) -> argparse.ArgumentParser:
    """The options and environment every client CLI here shares (``--url``)."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text({"GRPC_PORT": "port of the default --url (8001)"}))
    ap.add_argument("--url", default=None, help="host:port (default localhost:$GRPC_PORT)")
    return ap


@exits_on_env_error
def main(argv: list[str] | None = None) -> int:
    ap = cli_parser("Stream an answer from rufus_llm over gRPC")
    ap.add_argument("prompt", help="the question or prompt")
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
    ap.add_argument("--conversation", default=None,
                    help=f"conversation key ({CONVERSATION_HEADER} metadata): behind the "
                         "ingress, requests with the same key stay on one unit")
    a = ap.parse_args(argv)
    a.url = a.url or default_url()
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
                              sampling=sampling, flags={"exclude_input_in_output": True},
                              conversation=a.conversation):
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
