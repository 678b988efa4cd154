"""Cancellation: a client that went away stops its work, for every model.

Triton's Python backend has no cancellation callback; a model asks each request's response
sender ``is_cancelled()``. :class:`CancelWatcher` polls every live request a few times a
second and calls the request's ``on_cancel`` (rufus_llm and the planner abort the engine
request; the assistant cancels its task, which cancels its planner and answer streams).

Polling one place keeps the per-token path free of IPC to the Triton server, and still
aborts requests that are queued and produce no tokens. It polls on the event loop that
serves the requests: polling from its own thread measured far worse at 16 streams
(docs/benchmarks-history.md, "A change that measured worse"), the GIL convoy effect also seen with a
sender thread: each IPC releases the GIL and the thread then waits for the busy loop to hand
it back, and the loop for it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol

log = logging.getLogger("rufus.serving.cancel")

POLL_S = 0.25


class Cancellable(Protocol):
    def is_cancelled(self) -> bool: ...


class CancelWatcher:
    """Polls ``is_cancelled`` of every watched request on the loop that serves them."""

    def __init__(self, interval: float = POLL_S) -> None:
        self.interval = interval
        self.live: dict[Hashable, tuple[Cancellable, asyncio.Event,
                                        Callable[[], Awaitable[Any] | Any]]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, key: Hashable, sink: Cancellable,
              on_cancel: Callable[[], Awaitable[Any] | Any]) -> asyncio.Event:
        """Watch one request (call on the serving loop); the event is set once it is cancelled."""
        ev = asyncio.Event()
        self.live[key] = (sink, ev, on_cancel)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        return ev

    def forget(self, key: Hashable) -> None:
        self.live.pop(key, None)

    async def _poll(self) -> None:
        while self.live:
            await asyncio.sleep(self.interval)
            for key, (sink, ev, on_cancel) in list(self.live.items()):
                if ev.is_set():
                    continue
                try:
                    cancelled = sink.is_cancelled()
                except Exception:  # noqa: BLE001 - a broken sender counts as gone
                    cancelled = True
                if not cancelled:
                    continue
                ev.set()
                log.info("request %s cancelled by the client; stopping it", key)
                try:
                    result = on_cancel()
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("stopping cancelled request %s failed", key)
