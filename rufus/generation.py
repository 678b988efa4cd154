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

from rufus.engine import AtCapacity, EngineHost, EngineUnavailable
from rufus.metrics import Metrics
from rufus.requests import GenerateRequest, InvalidInput, check_prompt_length
from rufus.responses import Outputs, build_outputs

log = logging.getLogger("rufus.generation")

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


def render_prompt(tokenizer: Any, req: GenerateRequest) -> tuple[str, list[int], str]:
    """Returns (prompt text, token ids, field name to blame if it is too long)."""
    if req.messages is not None:
        try:
            text = tokenizer.apply_chat_template(
                req.messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:
            raise InvalidInput("messages", f"chat template rejected them: {exc}") from exc
        return text, tokenizer.encode(text, add_special_tokens=False), "messages"
    assert req.prompt is not None
    return req.prompt, tokenizer.encode(req.prompt), "text_input"


class CancelWatcher:
    """Polls ``is_cancelled`` for every live request a few times a second, on its own thread.

    Polling one place keeps the per-token path free of IPC to the Triton server, and still
    aborts requests that are queued and produce no tokens. The polling (one IPC round trip
    per live request) runs off the engine loop, so at 16 streams it no longer stalls token
    delivery; a cancellation is handed to the loop, which aborts the request in the engine.
    """

    def __init__(self, host: EngineHost, interval: float = 0.25) -> None:
        self.host = host
        self.interval = interval
        self.live: dict[str, tuple[ResponseSink, asyncio.Event, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._aborts: set[asyncio.Future[None]] = set()

    def watch(self, request_id: str, sink: ResponseSink) -> asyncio.Event:
        """Call on the engine loop; the returned event is set there when the client cancels."""
        ev = asyncio.Event()
        with self._lock:
            self.live[request_id] = (sink, ev, asyncio.get_running_loop())
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="cancel-watch",
                                                daemon=True)
                self._thread.start()
        return ev

    def forget(self, request_id: str) -> None:
        with self._lock:
            self.live.pop(request_id, None)

    def _poll(self) -> None:
        while True:
            time.sleep(self.interval)
            with self._lock:
                if not self.live:
                    self._thread = None
                    return
                items = list(self.live.items())
            for rid, (sink, ev, loop) in items:
                if ev.is_set():
                    continue
                try:
                    cancelled = sink.is_cancelled()
                except Exception:  # noqa: BLE001 - a broken sender counts as gone
                    cancelled = True
                if cancelled:
                    log.info("request %s cancelled by client; aborting in engine", rid)
                    try:
                        loop.call_soon_threadsafe(self._cancel, rid, ev)
                    except RuntimeError:  # loop already closed: nothing left to abort
                        pass

    def _cancel(self, request_id: str, ev: asyncio.Event) -> None:
        if not ev.is_set():
            ev.set()
            task = asyncio.ensure_future(self.host.abort(request_id))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)


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
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    admitted = False
    outcome = "error"
    try:
        host.admit()
        admitted = True
        metrics.set_outstanding(host.outstanding)
        text, ids, field_name = render_prompt(host.tokenizer, req)
        check_prompt_length(len(ids), req.sampling["max_tokens"], host.max_model_len, field_name)
        max_tokens = min(req.sampling["max_tokens"], host.max_model_len - len(ids))
        params = SamplingParams(
            **{**req.sampling, "max_tokens": max_tokens},
            output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
        )
        cancelled = watcher.watch(request_id, sink)
        first: float | None = None
        last = arrival
        n_gen = 0
        final_out: Any = None
        async for out in host.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
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
            sink.send(None, ServiceError(INTERNAL, f"{type(exc).__name__}: {exc}"), True)
    finally:
        watcher.forget(request_id)
        if admitted:
            host.release()
            metrics.set_outstanding(host.outstanding)
        metrics.count_request(outcome)
