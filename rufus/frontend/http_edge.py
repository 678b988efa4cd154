"""The HTTP edge of one OpenAI request, apart from its routes (rufus/frontend/app.py): the
bearer-key check, the request's span, a client that goes away, and a streamed body that
starts only once its first item is in (so errors before it keep their HTTP status).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from rufus.frontend.protocol import APIError
from rufus.telemetry import tracing


class BearerAuth:
    """Pure ASGI check of ``Authorization: Bearer <key>`` on /v1 (health and metrics stay
    open for probes); not BaseHTTPMiddleware, which buffers and detaches streamed bodies."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            got = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                body = APIError(401, "Incorrect API key provided",
                                code="invalid_api_key").body()
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _until_disconnect(request: Request) -> None:
    """Returns once the client has gone away (ASGI's ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work``; cancel it (and so its gRPC stream) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await task
            raise APIError(499, "client disconnected", type_="server_error", code="cancelled")
    return task.result()


async def prime(agen: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Start a stream: its first item now (errors keep their status), the rest lazily."""
    first = await agen.__anext__()

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for item in agen:
                yield item
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    return rest()


def request_span(request: Request, endpoint: str, arrival: float) -> Any:
    """The request's span: it joins the client's W3C ``traceparent`` (a malformed one is
    ignored, as the specification says: the trace starts here)."""
    parent = tracing.extract(request.headers.get(tracing.TRACEPARENT),
                             request.headers.get(tracing.TRACESTATE))
    route = request.scope.get("path", endpoint)  # a fixed route: /v1/chat/completions
    return tracing.start_span(f"POST {route}", parent, "server",
                              {"http.request.method": "POST", "http.route": route},
                              start_ns=tracing.mono_to_ns(arrival))


@dataclass
class _SpanError:
    """An OpenAI error as the span reports it: the vocabulary's code where it has one."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def end_span(span: Any, status: int | str, error: APIError | None) -> None:
    """The request's span ends with its HTTP status and an error's code (no span: nothing)."""
    if span is None:
        return
    err = None
    if error is not None:
        err = _SpanError(error.rufus_code or error.code or error.type, error.message[:200])
    tracing.end(span, err, **{"http.response.status_code": int(status)})


async def end_span_after(body: AsyncIterator[Any], span: Any) -> AsyncIterator[Any]:
    """A streamed body; the request's span ends with it (499: the client left)."""
    status = 200
    try:
        async for item in body:
            yield item
    except asyncio.CancelledError:
        status = 499
        raise
    finally:
        end_span(span, status, None if status == 200 else APIError(
            499, "the client went away", type_="server_error", code="cancelled"))
