"""The OpenAI-compatible HTTP app: FastAPI routes over rufus_llm's gRPC stream.

Request path: body -> pydantic schema -> :class:`ParsedRequest` (validated with rufus_llm's own rules)
-> one gRPC stream per Triton call (rufus.client.agenerate on a shared channel) -> OpenAI
JSON or server-sent events. A streamed response starts only once the first Triton response
(or error) is in, so errors before the first token keep their HTTP status. A client that goes
away cancels the handler task; that cancels the gRPC stream, and rufus_llm aborts the request
in vLLM (its cancel watcher polls every 0.25 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from rufus.client import CONVERSATION_HEADER, RequestFailed
from rufus.frontend import render, targets
from rufus.frontend.http_edge import (
    BearerAuth,
    end_span,
    end_span_after,
    prime,
    race_disconnect,
    request_span,
)
from rufus.frontend.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ParsedRequest,
    bad_request,
    openai_error,
    parse_body,
    parse_chat,
    parse_completion,
)
from rufus.frontend.render import ChunkWriter, Delta
from rufus.frontend.targets import ChatHook, TritonModelClient
from rufus.telemetry import tracing

log = logging.getLogger("rufus.frontend")

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far above any prompt the context can hold


def load_builtin_hooks() -> None:
    """Register rufus-assistant when rufus/assistant/ is present (another package)."""
    try:
        from rufus.frontend import assistant_hook
    except ImportError as exc:  # package not there: the model id is simply not offered
        log.info("rufus-assistant not available: %s", exc)
        return
    assistant_hook.register_default()


@dataclass
class Settings:
    triton_url: str = "localhost:8001"
    models: list[str] = field(default_factory=lambda: ["rufus_llm"])
    retries: int = 2
    timeout: float = 600.0
    hooks: bool = True  # offer registered pipelines (rufus-assistant) when importable
    api_key: str | None = field(default=None, repr=False)  # never logged


class FrontendMetrics:
    """Prometheus series as seen at the frontend (the client's view, HTTP included)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rufus_openai_requests", "OpenAI API requests by outcome",
                                ["endpoint", "model", "status"], registry=r)
        self.in_flight = Gauge("rufus_openai_requests_in_flight", "requests being served",
                               ["endpoint"], registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.latency = Histogram("rufus_openai_request_latency_seconds",
                                 "arrival to last byte", ["endpoint", "model"],
                                 buckets=buckets, registry=r)
        self.ttft = Histogram("rufus_openai_time_to_first_token_seconds",
                              "arrival to the first generated text sent", ["endpoint", "model"],
                              buckets=buckets, registry=r)
        self.tokens = Counter("rufus_openai_generation_tokens", "completion tokens returned",
                              ["model"], registry=r)


def error_response(exc: APIError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


class Frontend:
    """State of one app: settings, the shared gRPC client, the Triton models it serves, metrics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = FrontendMetrics()
        self.client: Any = None
        self.triton_models: dict[str, TritonModelClient] = {}
        self.hooks: dict[str, ChatHook] = {}
        self._starts: list[asyncio.Task[None]] = []
        self.created = int(time.time())
        self._health: tuple[float, int, dict[str, Any]] = (0.0, 503, {})

    async def start(self) -> None:
        import tritonclient.grpc.aio as aioclient

        s = self.settings
        # keepalive: notice a dead Triton/ingress connection between requests
        self.client = aioclient.InferenceServerClient(s.triton_url, channel_args=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.http2.max_pings_without_data", 0),
        ])
        self.triton_models = {m: TritonModelClient(s.triton_url, m, self.client, s.retries, s.timeout)
                         for m in s.models}
        if s.hooks:
            load_builtin_hooks()
            for model_id, factory in targets.HOOKS.items():
                try:
                    self.hooks[model_id] = factory(self.settings)
                except Exception as exc:  # noqa: BLE001 - a broken hook must not stop serving
                    log.warning("model %s not offered: %s", model_id, exc)
        log.info("serving %s from Triton at %s", sorted([*self.triton_models, *self.hooks]),
                 s.triton_url)
        self._starts = targets.start_hooks(self.hooks)

    def registries(self) -> list[CollectorRegistry]:
        """The frontend's series, then each hook's own (the assistant's admission)."""
        return [self.metrics.registry, *targets.hook_registries(self.hooks)]

    async def stop(self) -> None:
        for t in self._starts:
            t.cancel()
        if self.client is not None:
            await self.client.close()

    # ----------------------------------------------------------------- models, health
    def model_ids(self) -> list[str]:
        return [*self.triton_models, *self.hooks]

    def model_card(self, model_id: str) -> dict[str, Any]:
        owner = self.hooks[model_id].owned_by if model_id in self.hooks else "rufus"
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": owner}

    def check_model(self, model_id: str, chat: bool) -> None:
        if model_id in self.triton_models or (chat and model_id in self.hooks):
            return
        if model_id in self.hooks:
            raise APIError(400, f"model `{model_id[:64]}` serves chat completions only",
                           param="model")
        raise APIError(404, f"The model `{model_id[:64]}` does not exist. Available: "
                       f"{self.model_ids()}", param="model", code="model_not_found")

    def build_chat(self, body: bytes, conversation: str | None) -> tuple[ParsedRequest, bool]:
        """A chat completions body -> (the request, True: chat)."""
        req = parse_body(ChatCompletionRequest, body)
        self.check_model(req.model, chat=True)
        return parse_chat(req, conversation), True

    def build_completion(self, body: bytes, conversation: str | None
                         ) -> tuple[ParsedRequest, bool]:
        """A completions body -> (the request, False: not chat)."""
        req = parse_body(CompletionRequest, body)
        self.check_model(req.model, chat=False)
        return parse_completion(req, conversation), False

    async def health(self) -> tuple[int, dict[str, Any]]:
        """Triton ready and every served Triton model ready (cached for 1 s)."""
        t, status, body = self._health
        if time.monotonic() - t < 1.0:
            return status, body
        body = {"triton": self.settings.triton_url, "models": {}}
        try:
            ok = await asyncio.wait_for(self.client.is_server_ready(), 3)
            for m in self.triton_models:
                ready = await asyncio.wait_for(self.client.is_model_ready(m), 3)
                body["models"][m] = "ready" if ready else "not ready"
                ok = ok and ready
        except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
            ok = False
            body["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        status = 200 if ok else 503
        body["status"] = "ok" if ok else "unavailable"
        self._health = (time.monotonic(), status, body)
        return status, body

    # ----------------------------------------------------------------- generation
    async def _call_deltas(self, parsed: ParsedRequest, index: int) -> AsyncIterator[tuple[int, Delta]]:
        target = self.triton_models[parsed.model]
        try:
            async for d in target.generate(parsed, parsed.calls[index]):
                yield index, d
        except RequestFailed as exc:
            raise openai_error(exc.error) from None

    async def deltas(self, parsed: ParsedRequest) -> AsyncIterator[tuple[int, Delta]]:
        """(call index, delta) of every call, merged as they arrive."""
        if len(parsed.calls) == 1:
            async for item in self._call_deltas(parsed, 0):
                yield item
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def pump(i: int) -> None:
            try:
                async for item in self._call_deltas(parsed, i):
                    await queue.put(item)
                await queue.put(done)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                await queue.put(exc)

        tasks = [asyncio.create_task(pump(i)) for i in range(len(parsed.calls))]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()

    async def complete(self, parsed: ParsedRequest, endpoint: str, arrival: float) -> dict[str, Any]:
        """A whole (non-streaming) response."""
        n_calls = len(parsed.calls)
        texts = [[""] * parsed.n for _ in range(n_calls)]
        finish: list[list[str | None]] = [[None] * parsed.n for _ in range(n_calls)]
        lps: list[list[list[Any]]] = [[[] for _ in range(parsed.n)] for _ in range(n_calls)]
        n_in = [0] * n_calls
        n_out = 0
        first = True
        async for i, d in self.deltas(parsed):
            if first:
                first = False
                self.metrics.ttft.labels(endpoint, parsed.model).observe(time.monotonic() - arrival)
            n_in[i] = d.n_in if d.n_in is not None else n_in[i]
            n_out += sum(d.n_out)
            for j, text in enumerate(d.texts[:parsed.n]):
                texts[i][j] += text
                finish[i][j] = d.finish[j] or finish[i][j]
                entries = d.logprobs[j] if j < len(d.logprobs) else None
                if entries:
                    lps[i][j].extend(entries)
        top = parsed.calls[0].sampling.get("logprobs", 0)
        choices = []
        for i in range(n_calls):
            for j in range(parsed.n):
                index = i * parsed.n + j
                if parsed.kind == "chat":
                    lp = render.chat_logprobs(lps[i][j], top) if parsed.logprobs else None
                    choices.append(render.chat_choice(index, texts[i][j], finish[i][j], lp))
                else:
                    prefix = parsed.calls[i].prompt if parsed.echo else ""
                    lp = render.completion_logprobs(lps[i][j], top, 0) if parsed.logprobs else None
                    choices.append(render.text_choice(index, (prefix or "") + texts[i][j],
                                                      finish[i][j], lp))
        self.metrics.tokens.labels(parsed.model).inc(n_out)
        use = render.usage(sum(n_in), n_out)
        build = render.chat_completion if parsed.kind == "chat" else render.text_completion
        return build(render.new_id("chatcmpl" if parsed.kind == "chat" else "cmpl"), parsed.model,
                     choices, use)

    async def stream(self, parsed: ParsedRequest, endpoint: str, arrival: float) -> AsyncIterator[bytes]:
        """Server-sent events; the first item is produced only after Triton's first response."""
        w = ChunkWriter(parsed.kind, parsed.model, parsed.include_usage)
        top = parsed.calls[0].sampling.get("logprobs", 0)
        n_in = [0] * len(parsed.calls)
        n_out = 0
        started: set[int] = set()
        offsets = [0] * len(parsed.calls)
        first = True
        try:
            async for i, d in self.deltas(parsed):
                if first:
                    first = False
                    self.metrics.ttft.labels(endpoint, parsed.model).observe(
                        time.monotonic() - arrival)
                if d.n_in is not None:
                    n_in[i] = d.n_in
                n_out += sum(d.n_out)
                text, fin = d.texts[0], d.finish[0]
                entries = d.logprobs[0] if d.logprobs else None
                if parsed.kind == "chat":
                    if i not in started:
                        started.add(i)
                        yield w.role(i)
                    lp = render.chat_logprobs(entries, top) if parsed.logprobs else None
                else:
                    if i not in started:
                        started.add(i)
                        prompt = parsed.calls[i].prompt
                        if parsed.echo and prompt:
                            yield w.delta(i, prompt, None)
                            offsets[i] = len(prompt)
                    lp = render.completion_logprobs(entries, top, offsets[i]) \
                        if parsed.logprobs else None
                    offsets[i] += len(text)
                if text or fin or lp:
                    yield w.delta(i, text, fin, lp)
        except APIError as exc:
            if first:  # nothing sent yet: the handler answers with the error's status
                raise
            # after the first chunk the status line is already sent: an error event
            yield w.error(exc.body())
            yield w.done()
            return
        self.metrics.tokens.labels(parsed.model).inc(n_out)
        if parsed.include_usage:
            yield w.usage(sum(n_in), n_out)
        yield w.done()

    async def stream_hook(self, parsed: ParsedRequest, hook: ChatHook) -> AsyncIterator[bytes]:
        w = ChunkWriter("chat", parsed.model, parsed.include_usage)
        first = True
        usage = (0, 0)
        async for ev in hook.chat(parsed.messages or [], parsed):
            if first:
                first = False
                yield w.role(0, ev.extra)
            if ev.text or ev.finish:
                yield w.delta(0, ev.text, ev.finish)
            usage = ev.usage or usage
        if parsed.include_usage:
            yield w.usage(*usage)
        yield w.done()

    async def complete_hook(self, parsed: ParsedRequest, hook: ChatHook) -> dict[str, Any]:
        text, extra = "", {}
        usage = (0, 0)
        async for ev in hook.chat(parsed.messages or [], parsed):
            text += ev.text
            extra.update(ev.extra or {})
            usage = ev.usage or usage
        body = render.chat_completion(render.new_id("chatcmpl"), parsed.model,
                                      [render.chat_choice(0, text, "stop", None)],
                                      render.usage(*usage))
        body.update(extra)
        return body


def create_app(settings: Settings) -> FastAPI:
    """The app: the OpenAI routes, health and metrics over one :class:`Frontend`, which
    starts and stops with it."""
    fe = Frontend(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await fe.start()
        try:
            yield
        finally:
            await fe.stop()

    app = FastAPI(title="rufus OpenAI-compatible API", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.frontend = fe
    if settings.api_key:
        app.add_middleware(BearerAuth, key=settings.api_key)
    _add_error_handlers(app)
    _add_routes(app, fe)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves as OpenAI's error body, FastAPI's own (404, 405) included."""

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(APIError(exc.status_code, str(exc.detail)))


def _add_routes(app: FastAPI, fe: Frontend) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _handle(fe, request, "chat", fe.build_chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _handle(fe, request, "completions", fe.build_completion)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [fe.model_card(m) for m in fe.model_ids()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in fe.model_ids():
            raise APIError(404, f"The model `{model_id[:64]}` does not exist.", param="model",
                           code="model_not_found")
        return fe.model_card(model_id)

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = await fe.health()
        return JSONResponse(body, status_code=status,
                            headers=None if status == 200 else {"Retry-After": "1"})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = b"".join(generate_latest(r) for r in fe.registries())
        return Response(body, media_type=CONTENT_TYPE_LATEST)


async def _handle(fe: Frontend, request: Request, endpoint: str,
                  build: Callable[[bytes, str | None], tuple[ParsedRequest, bool]]) -> Response:
    """One OpenAI request, with its metrics: counted here, or by :func:`_finish` once a
    streamed body ends."""
    arrival = time.monotonic()
    model = "-"
    status = 500
    fe.metrics.in_flight.labels(endpoint).inc()
    streaming = False
    # tracing off: None, and nothing below makes a span
    span = request_span(request, endpoint, arrival) if tracing.enabled() else None
    token = tracing.attach(span)  # this handler's log lines carry the trace id
    error: APIError | None = None
    try:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
        parsed, chat = build(body, request.headers.get(CONVERSATION_HEADER))
        model = parsed.model
        if span is not None:
            parsed.span, parsed.trace = span, tracing.headers(span)
            span.set_attribute("gen_ai.request.model", model)
            span.set_attribute("gen_ai.operation.name",
                               "chat" if parsed.kind == "chat" else "text_completion")
        response = await _respond(fe, request, endpoint, parsed, chat, arrival)
        streaming = isinstance(response, StreamingResponse)
        if streaming:
            response.body_iterator = end_span_after(response.body_iterator, span)
        status = 200
        return response
    except APIError as exc:
        status, error = exc.status, exc
        if exc.status >= 500 and exc.status != 503:
            log.warning("%s %s failed: %s", endpoint, model, exc.message)
        return error_response(exc)
    except StopAsyncIteration:
        status = 500
        error = APIError(500, "empty response from the model", type_="server_error")
        return error_response(error)
    finally:
        tracing.detach(token)
        if not streaming:
            fe.metrics.in_flight.labels(endpoint).dec()
            fe.metrics.requests.labels(endpoint, model, str(status)).inc()
            fe.metrics.latency.labels(endpoint, model).observe(time.monotonic() - arrival)
            end_span(span, status, error)


async def _respond(fe: Frontend, request: Request, endpoint: str, parsed: ParsedRequest,
                   chat: bool, arrival: float) -> Response:
    """The answer of a parsed request: a registered chat model (the assistant) or Triton's,
    whole or streamed (a stream starts only once its first item is in)."""
    hook = fe.hooks.get(parsed.model) if chat else None
    if hook is not None:
        if parsed.n > 1:
            raise bad_request("n", f"model {parsed.model} answers once (n must be 1)")
        if not parsed.stream:
            return JSONResponse(await race_disconnect(request, fe.complete_hook(parsed, hook)))
        agen = await prime(fe.stream_hook(parsed, hook))
    elif parsed.stream:
        agen = await prime(fe.stream(parsed, endpoint, arrival))
    else:
        return JSONResponse(await race_disconnect(request,
                                                  fe.complete(parsed, endpoint, arrival)))
    return StreamingResponse(_finish(agen, fe, endpoint, parsed.model, arrival),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _finish(agen: AsyncIterator[bytes], fe: Frontend, endpoint: str, model: str,
                  arrival: float) -> AsyncIterator[bytes]:
    """The streamed body, with the request's metrics once it ends (or the client left)."""
    status = "200"
    try:
        async for item in agen:
            yield item
    except asyncio.CancelledError:
        status = "499"
        raise
    finally:
        fe.metrics.in_flight.labels(endpoint).dec()
        fe.metrics.requests.labels(endpoint, model, status).inc()
        fe.metrics.latency.labels(endpoint, model).observe(time.monotonic() - arrival)
