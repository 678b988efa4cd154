"""The hot path: one generation request through the engine, prompt -> streamed responses.

Independent of Triton: responses go to a :class:`ResponseSink` (the Triton adapter's
:class:`~rufus.serving.triton_backend.TritonSink`; tests use a list). Every failure ends the
stream with one error of the vocabulary (:mod:`rufus.errors`), mapped in one place
(:func:`rufus.errors.client_error`).

Hot-path rules: nothing here blocks the engine's event loop (prompt rendering runs in a
worker thread; metric updates only append to a buffer; sends go straight to Triton, no
sender thread); each response carries only what the client asked for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Protocol

from rufus.errors import Cancelled, InvalidInput, RufusError, Unavailable, client_error
from rufus.serving.cancel import CancelWatcher
from rufus.serving.chat import render_prompt
from rufus.serving.engine import EngineHost
from rufus.serving.metrics import Metrics
from rufus.serving.request import GenerateRequest
from rufus.serving.responses import Outputs, build_outputs
from rufus.serving.sampling import check_min_tokens
from rufus.telemetry import tracing

log = logging.getLogger("rufus.serving.generation")


class ResponseSink(Protocol):
    def send(self, outputs: Outputs | None, error: RufusError | None, final: bool) -> None: ...
    def is_cancelled(self) -> bool: ...


_ids = itertools.count()


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns() % 1_000_000}"


def check_prompt_length(n_prompt: int, max_tokens: int, max_model_len: int, field_name: str) -> None:
    """Reject prompts the engine could never finish, before they take a slot."""
    if n_prompt == 0:
        raise InvalidInput(field_name, "prompt is empty after tokenization")
    if n_prompt >= max_model_len:
        raise InvalidInput(
            field_name,
            f"prompt has {n_prompt} tokens; the model's context is {max_model_len} tokens",
        )


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
                           str(exc)) from exc


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
                           str(exc)) from exc


def _request_error(exc: Exception, host: EngineHost, request_id: str) -> RufusError:
    """An unexpected failure while the engine is down is the engine's death (UNAVAILABLE:
    retry elsewhere), not an internal error of this request."""
    if not isinstance(exc, RufusError) and not host.healthy:
        log.warning("request %s failed while the engine is down: %s", request_id,
                    type(exc).__name__)
        return Unavailable(f"engine unavailable: {host.dead_reason}")
    return client_error(exc, log, f"request {request_id}")


def _tokenize_span(span: Any, t_render: float) -> None:
    """The prompt's rendering as a child span, measured before the span could exist (the
    render runs in a worker thread); nothing when tracing is off."""
    if span is not None:
        tracing.child_span(span, "tokenize", tracing.mono_to_ns(t_render),
                           tracing.mono_to_ns(time.monotonic()))


def _engine_params(host: EngineHost, req: GenerateRequest, n_prompt: int,
                   field_name: str) -> tuple[Any, Any]:
    """vLLM sampling params and LoRA for a rendered prompt, once per request; the length
    checks and the clamp to the context the prompt leaves reject what the engine could
    never finish before it sees the request."""
    from vllm.sampling_params import RequestOutputKind

    check_prompt_length(n_prompt, req.sampling["max_tokens"], host.max_model_len, field_name)
    max_tokens = min(req.sampling["max_tokens"], host.max_model_len - n_prompt)
    if max_tokens < req.sampling["max_tokens"]:
        check_min_tokens(req.sampling.get("min_tokens", 0), max_tokens,
                         " after clamping to the context the prompt leaves")
    params = make_sampling_params(req, max_tokens, RequestOutputKind.DELTA if req.stream
                                  else RequestOutputKind.FINAL_ONLY)
    return params, host_lora_request(host, req.lora_name)


def _engine_stream(host: EngineHost, ids: list[int], params: Any, request_id: str,
                   lora: Any) -> Any:
    """The engine's output generator for the prompt tokens; ``lora_request`` is passed only
    for an adapter, so hosts (and fakes) without LoRA keep their plain signature."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=ids)
    if lora is None:
        return host.generate(prompt, params, request_id)
    return host.generate(prompt, params, request_id, lora_request=lora)


def _complete(req: GenerateRequest, sink: ResponseSink, metrics: Metrics, final_out: Any,
              text: str, n_prompt: int, n_gen: int, arrival: float) -> str:
    """A request that finished: the one response of a non-streaming request (streams sent
    theirs token by token), usage and latency metrics; returns the outcome label."""
    if not req.stream:
        prefix = "" if req.exclude_input_in_output else text
        sink.send(build_outputs(req, final_out.outputs, num_input_tokens=n_prompt,
                                prefix=prefix), None, True)
    metrics.add_tokens(n_prompt, n_gen)
    metrics.observe_latency(time.monotonic() - arrival)
    return str(final_out.outputs[0].finish_reason or "finished")


def _release(host: EngineHost, watcher: CancelWatcher, metrics: Metrics, request_id: str,
             admitted: bool, outcome: str) -> None:
    """Every request's teardown, on every path: stop watching for its cancellation, give
    back its admission slot (if it got one) and count it under its outcome."""
    watcher.forget(request_id)
    if admitted:
        host.release()
        metrics.set_outstanding(host.outstanding)
    metrics.count_request(outcome)


async def run_generate(
    host: EngineHost, watcher: CancelWatcher, req: GenerateRequest, sink: ResponseSink,
    metrics: Metrics, arrival: float, request_id: str, internal: bool = False,
) -> None:
    """Serve one request to completion; always ends the response stream exactly once.
    ``internal``: the model's own warm-up request (admitted while the engine warms up, not
    counted in the client-facing metrics)."""
    if internal:
        metrics = Metrics()

    admitted = False
    outcome = "error"  # the metric label; set on every path below
    # tracing off: span is None and every tracing call below is a no-op
    span = None if internal else _request_span(host, req, request_id, arrival)
    token = tracing.attach(span)  # this request's log lines carry its trace id
    error: RufusError | None = None
    ids: list[int] = []
    n_gen = 0
    first: float | None = None
    final_out: Any = None
    try:
        host.admit(internal)
        admitted = True
        metrics.set_outstanding(host.outstanding)
        t_render = time.monotonic()
        text, ids, field_name = await asyncio.get_running_loop().run_in_executor(
            None, render_prompt, host.tokenizer, req)
        _tokenize_span(span, t_render)
        params, lora = _engine_params(host, req, len(ids), field_name)
        cancelled = watcher.watch(request_id, sink, lambda: host.abort(request_id))
        last = arrival
        gen = _engine_stream(host, ids, params, request_id, lora)
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
            raise Cancelled("request was cancelled")
        if not req.stream:
            n_gen = sum(len(c.token_ids) for c in final_out.outputs)
        outcome = _complete(req, sink, metrics, final_out, text, len(ids), n_gen, arrival)
    except asyncio.CancelledError:
        await host.abort(request_id)
        outcome = "unavailable"
        error = Unavailable("server is shutting down")
        sink.send(None, error, True)
        raise
    except Exception as exc:  # noqa: BLE001 - the one place a failure becomes a client error
        error = _request_error(exc, host, request_id)
        outcome = error.outcome
        sink.send(None, error, True)
    finally:
        _release(host, watcher, metrics, request_id, admitted, outcome)
        if span is not None:
            tracing.detach(token)
            _end_request_span(span, error, outcome, len(ids), n_gen, first, final_out)


def _request_span(host: EngineHost, req: GenerateRequest, request_id: str,
                  arrival: float) -> Any:
    """The request's span (None when tracing is off), from its arrival at the model."""
    if not tracing.enabled():
        return None
    s = req.sampling
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat" if req.messages is not None else "text_completion",
        "gen_ai.request.model": host.name,
        "gen_ai.response.id": request_id,
        "gen_ai.request.max_tokens": s.get("max_tokens"),
        "gen_ai.request.temperature": s.get("temperature"),
        "gen_ai.request.top_p": s.get("top_p"),
        "rufus.stream": req.stream,
        **(req.trace_attributes or {}),
    }
    if tracing.capture_content():  # the operator turned content capture on
        import json

        attrs["gen_ai.input.messages"] = (json.dumps(req.messages) if req.messages is not None
                                          else str(req.prompt))[:4096]
    return tracing.start_span(f"{host.name} generate", req.trace, "server", attrs,
                              start_ns=tracing.mono_to_ns(arrival))


def _end_request_span(span: Any, error: RufusError | None, outcome: str, n_prompt: int,
                      n_gen: int, first: float | None, final_out: Any) -> None:
    """Queue, prefill and decode as child spans, from vLLM's own request timestamps
    (monotonic, engine core); usage and the finish reason or error on the request's span."""
    stats = getattr(final_out, "metrics", None)
    q, sch, ft, lt = (getattr(stats, k, 0.0) or 0.0 for k in
                      ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"))
    if q and sch:
        tracing.child_span(span, "queue", tracing.mono_to_ns(q), tracing.mono_to_ns(sch))
    if sch and ft:
        tracing.child_span(span, "prefill", tracing.mono_to_ns(sch), tracing.mono_to_ns(ft),
                           **{"gen_ai.usage.input_tokens": n_prompt,
                              "rufus.cached_tokens": getattr(final_out, "num_cached_tokens",
                                                             None)})
    if ft and lt and lt >= ft:
        tracing.child_span(span, "decode", tracing.mono_to_ns(ft), tracing.mono_to_ns(lt),
                           **{"gen_ai.usage.output_tokens": n_gen})
    if first is not None:
        span.add_event("first_token", timestamp=tracing.mono_to_ns(first))
    tracing.end(span, error, **{
        "gen_ai.usage.input_tokens": n_prompt or None,
        "gen_ai.usage.output_tokens": n_gen,
        "gen_ai.response.finish_reasons": [outcome] if error is None else None,
        "rufus.cancelled": True if outcome == "cancelled" else None,
    })
