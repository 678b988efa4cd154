"""Hosts vLLM's async engine on a private event loop thread.

Triton calls ``execute`` on its own thread; vLLM's ``AsyncLLM`` wants one asyncio loop.
``EngineHost`` owns that loop, starts and stops the engine, tracks outstanding requests
(admission control) and notices when the engine dies so callers fail fast with
UNAVAILABLE instead of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

log = logging.getLogger("rufus.serving.engine")


class EngineUnavailable(RuntimeError):
    """The engine is dead, shutting down or not started: the client should retry elsewhere."""


class AtCapacity(RuntimeError):
    """Admission bound reached: the request is refused at once instead of queueing."""


class EngineHost:
    """One vLLM ``AsyncLLM`` plus the loop thread it lives on."""

    def __init__(
        self,
        engine_args: dict[str, Any],
        *,
        max_outstanding: int = 0,
        stat_loggers: list[Any] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
        on_poll: Callable[[EngineHost], None] | None = None,
        name: str = "engine",
        engine_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.engine_args = dict(engine_args)
        # None: vLLM's AsyncLLM. Otherwise a callable building an object with the same small
        # surface (generate/abort/tokenizer/model_config/errored/shutdown), e.g. the query
        # planner's torch Medusa engine (rufus/qp/decoder/torch_engine.py).
        self.engine_factory = engine_factory
        self.max_outstanding = max_outstanding
        self.stat_loggers = stat_loggers or []
        self.on_dead = on_dead
        self.on_poll = on_poll
        self.name = name
        self.engine: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outstanding = 0
        self.dead_reason: str | None = None
        self.start_seconds = 0.0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the engine and block until it is ready; re-raise a start failure."""
        t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        self.start_seconds = time.monotonic() - t0
        log.info("%s: engine ready in %.1f s", self.name, self.start_seconds)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._stop = asyncio.Event()
        try:
            if self.engine_factory is not None:
                self.engine = self.engine_factory(self.engine_args)
            else:
                args = AsyncEngineArgs(**self.engine_args)
                self.engine = AsyncLLM.from_engine_args(args,
                                                        stat_loggers=self.stat_loggers or None)
            self.tokenizer = self.engine.tokenizer
            self.max_model_len = int(self.engine.model_config.max_model_len)
        except BaseException as exc:  # noqa: BLE001 - handed back to start()
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        watch = asyncio.create_task(self._watch())
        await self._stop.wait()
        watch.cancel()
        self.engine.shutdown()

    async def _watch(self) -> None:
        """Poll the engine's health: a dead engine core must flip readiness quickly."""
        while True:
            await asyncio.sleep(0.5 if self.dead_reason is None else 0.1)
            if self.dead_reason is None and getattr(self.engine, "errored", False):
                err = getattr(self.engine, "dead_error", None) or RuntimeError("engine errored")
                self.mark_dead(err)
            self._maybe_report_dead()
            if self.on_poll is not None:
                try:
                    self.on_poll(self)
                except Exception:
                    log.exception("%s: poll callback failed", self.name)

    def mark_dead(self, err: BaseException) -> None:
        """Refuse new requests now; report (unload) once in-flight ones have their errors.

        Safe from any thread. ``on_dead`` runs on the watch loop when no request is
        outstanding (or after ``DEAD_REPORT_GRACE_S``): unloading the Triton model while a
        request is still in flight left that request unreleased and the unload stuck in
        UNLOADING (seen with Triton 2.51), so the model could never be loaded again.
        """
        if self.dead_reason is not None:
            return
        self.dead_reason = f"{type(err).__name__}: {err}"
        # Keep the message, not ``err``: its traceback would keep the frames of whichever
        # request saw the death, and everything they reference (a Triton response sender
        # among them), alive for as long as this instance lives.
        self._dead_error: BaseException = EngineUnavailable(self.dead_reason)
        self._dead_since = time.monotonic()
        log.error("%s: engine is dead (%s); model will report not ready", self.name, self.dead_reason)

    DEAD_REPORT_GRACE_S = 5.0

    def _maybe_report_dead(self) -> None:
        if self.dead_reason is None or getattr(self, "_dead_reported", False):
            return
        waited = time.monotonic() - self._dead_since
        if self.outstanding > 0 and waited < self.DEAD_REPORT_GRACE_S:
            return
        self._dead_reported = True
        if self.on_dead is not None:
            try:
                self.on_dead(self._dead_error)
            except Exception:
                log.exception("%s: on_dead callback failed", self.name)

    def shutdown(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ requests
    @property
    def healthy(self) -> bool:
        return self.engine is not None and self.dead_reason is None

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        assert self.loop is not None, "engine not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def admit(self) -> None:
        """Count one request in, or refuse it: unbounded queues only hide overload."""
        if not self.healthy:
            raise EngineUnavailable(f"engine unavailable: {self.dead_reason or 'not started'}")
        with self._lock:
            if self.max_outstanding and self.outstanding >= self.max_outstanding:
                raise AtCapacity(
                    f"server at capacity: {self.outstanding} outstanding requests "
                    f"(limit {self.max_outstanding}); retry later or on another replica"
                )
            self.outstanding += 1

    def release(self) -> None:
        with self._lock:
            self.outstanding -= 1

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str
    ) -> AsyncIterator[Any]:
        """vLLM's generate, with engine death turned into :class:`EngineUnavailable`."""
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            async for out in self.engine.generate(prompt, sampling_params, request_id):
                yield out
        except EngineDeadError as exc:
            self.mark_dead(exc)
            raise EngineUnavailable(f"engine died: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        if self.healthy:
            await self.engine.abort(request_id)

    def num_running(self) -> int:
        """Requests vLLM itself holds (running + waiting), for tests and load reports."""
        procs = getattr(self.engine, "output_processor", None)
        return procs.get_num_unfinished_requests() if procs is not None else 0
