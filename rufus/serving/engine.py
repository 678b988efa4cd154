"""Hosts the inference engine on a private event loop thread, and heals it in place.

Triton calls ``execute`` on its own thread; vLLM's ``AsyncLLM`` wants one asyncio loop.
``EngineHost`` owns that loop, starts and stops the engine, tracks outstanding requests
(admission control) and notices when the engine dies, so callers fail fast with
UNAVAILABLE (:class:`rufus.errors.Unavailable`) instead of hanging.

A dead engine is replaced inside the same Triton model instance (never by unloading the
model: Triton 2.51 sometimes never finalized an unloaded instance, so it could not be
loaded again in that process). Repeated deaths back off exponentially; more than
``max_failures`` inside ``window_s`` and the host gives up and stays down (state
``failed``) until the server is restarted. The engine is anything that satisfies
:class:`rufus.serving.engine_api.Engine`; what the host builds is the model's
:class:`EngineSpec`, given at construction. vLLM's process layout (fork, core binding, the
EngineCore's environment) is :mod:`rufus.serving.engine_processes`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rufus.errors import AtCapacity, Unavailable
from rufus.serving.engine_api import Engine, unfinished_requests
from rufus.serving.engine_processes import build_vllm_engine
from rufus.serving.settings import param, read

log = logging.getLogger("rufus.serving.engine")


class EngineState(enum.StrEnum):
    """Host states, in the order a healthy life goes through them; each equals the string
    metrics, logs and clients see (``EngineState.READY == "ready"``). WARMING: the engine is
    up and serves only the model's own warm-up requests; READY comes after them (and after
    every in-place restart's), so "ready" means the first client request finds nothing left
    to compile or allocate."""

    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DEAD = "dead"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


STARTING = EngineState.STARTING
WARMING = EngineState.WARMING
READY = EngineState.READY
DEAD = EngineState.DEAD
RESTARTING = EngineState.RESTARTING
FAILED = EngineState.FAILED
STOPPED = EngineState.STOPPED


@dataclass
class RestartPolicy:
    """When a dead engine is replaced in place, and when the host gives up.

    Backoff before the k-th restart in the window: ``backoff_s * 2**(k-1)``, capped at
    ``backoff_max_s``. ``enabled=False`` (a multi-node unit's leader: the unit is restarted
    whole by its supervisor) leaves a dead engine down.
    """

    # config.pbtxt parameters (RUFUS_<KEY> wins where env=True), read with the model's other settings
    enabled: bool = param("engine_restart", True,
                          "replace a dead engine in place (false: leave it down)", env=True)
    max_failures: int = param("engine_max_failures", 3, "engine deaths within the window "
                              "before the host gives up (state failed)", minimum=1, env=True)
    window_s: float = param("engine_failure_window_s", 600.0,
                            "the window of engine_max_failures, seconds", minimum=0)
    backoff_s: float = param("engine_restart_backoff_s", 1.0,
                             "backoff before the first restart, doubled per failure in the "
                             "window, seconds", minimum=0, env=True)
    backoff_max_s: float = param("engine_restart_backoff_max_s", 30.0,
                                 "cap of the restart backoff, seconds", minimum=0, env=True)

    def delay(self, failures_in_window: int) -> float:
        return min(self.backoff_s * 2 ** max(failures_in_window - 1, 0), self.backoff_max_s)


@dataclass(frozen=True)
class EngineSpec:
    """What engine a host builds, at start and at every in-place restart: each model makes
    its own and hands it to :class:`EngineHost`.

    ``engine_args``: vLLM's engine arguments (a read-only copy; each build gets a fresh dict).
    ``factory``: None for vLLM's ``AsyncLLM`` (built in the served process layout,
    :mod:`rufus.serving.engine_processes`), else a callable building an :class:`Engine` from
    the args, e.g. the query planner's torch Medusa engine (rufus/qp/decoder/torch_engine.py).
    ``loras``: LoRA adapter name -> local path (rufus_llm's multi_lora.json), None when off.
    ``stat_loggers``: vLLM stat loggers. ``before_fork``: run in this process right before a
    forked EngineCore is started, every build (the stub's heap freeze)."""

    engine_args: Mapping[str, Any]
    factory: Callable[[dict[str, Any]], Engine] | None = None
    loras: dict[str, str] | None = None
    stat_loggers: tuple[Any, ...] = ()
    before_fork: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine_args", MappingProxyType(dict(self.engine_args)))
        object.__setattr__(self, "stat_loggers", tuple(self.stat_loggers))


class EngineHost:
    """One engine (vLLM's ``AsyncLLM`` by default) plus the loop thread it lives on; what it
    builds is its :class:`EngineSpec`, fixed at construction."""

    DEAD_REPORT_GRACE_S = 5.0

    def __init__(
        self,
        spec: EngineSpec,
        *,
        max_outstanding: int = 0,
        on_dead: Callable[[BaseException], None] | None = None,
        on_poll: Callable[[EngineHost], None] | None = None,
        on_state: Callable[[EngineHost, EngineState], None] | None = None,
        on_restarted: Callable[[], None] | None = None,
        name: str = "engine",
        restart: RestartPolicy | None = None,
        warmup: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.spec = spec
        self.max_outstanding = max_outstanding
        self.on_dead = on_dead
        self.on_poll = on_poll
        self.on_state = on_state
        self.on_restarted = on_restarted
        self.name = name
        self.restart = restart or RestartPolicy()
        # Awaited on the loop after every engine build, before READY (the model's warm-up).
        self.warmup = warmup
        self.warmup_seconds = 0.0
        self.engine: Any = None
        self.tokenizer: Any = None
        self.max_model_len = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outstanding = 0
        self.state: EngineState = STARTING
        self.dead_reason: str | None = None
        self.start_seconds = 0.0
        self.failures: list[float] = []  # monotonic times of engine deaths, in the window
        self.restarts = 0
        self.failure_count = 0  # every death and failed restart, ever (for the counter)
        self.next_restart_in = 0.0
        self._dead_error: BaseException | None = None
        self._dead_since = 0.0
        self._dead_handled = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    @property
    def engine_args(self) -> dict[str, Any]:
        """A copy of the spec's engine arguments."""
        return dict(self.spec.engine_args)

    @property
    def loras(self) -> dict[str, str] | None:
        """The spec's LoRA adapters (name -> local path), None when LoRA is off."""
        return self.spec.loras

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
        # report on the loop thread, like every later transition: the caller is Triton's
        # initialize thread, which should not wait on metric IPC
        self.state = READY
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._set_state, READY)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    def _build(self) -> Engine:
        spec = self.spec
        if spec.factory is not None:
            return spec.factory(dict(spec.engine_args))
        return build_vllm_engine(dict(spec.engine_args), list(spec.stat_loggers) or None,
                                 self.name, before_fork=spec.before_fork)

    def _adopt(self, engine: Engine) -> None:
        self.tokenizer = engine.tokenizer
        self.max_model_len = int(engine.model_config.max_model_len)
        self.engine = engine

    async def _warm(self) -> None:
        """The model's warm-up requests, admitted as internal while WARMING."""
        if self.warmup is None:
            return
        t0 = time.monotonic()
        self._set_state(WARMING)
        await self.warmup()
        self.warmup_seconds = time.monotonic() - t0
        log.info("%s: warm-up done in %.1f s", self.name, self.warmup_seconds)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            # on the loop thread: vLLM starts its output handler on the running loop
            self._adopt(self._build())
            await self._warm()
        except BaseException as exc:  # noqa: BLE001 - handed back to start()
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        watch = asyncio.create_task(self._watch())
        await self._stop.wait()
        watch.cancel()
        self._set_state(STOPPED)
        if self.engine is not None:
            self._shutdown_engine(self.engine)

    def _shutdown_engine(self, engine: Any) -> None:
        try:
            engine.shutdown()
        except Exception:  # a dead engine may fail to shut down cleanly
            log.exception("%s: engine shutdown raised", self.name)

    async def _watch(self) -> None:
        """Poll the engine's health: a dead engine must flip readiness within a second."""
        while True:
            await asyncio.sleep(0.5 if self.dead_reason is None else 0.1)
            if self.dead_reason is None and getattr(self.engine, "errored", False):
                err = getattr(self.engine, "dead_error", None) or RuntimeError("engine errored")
                self.mark_dead(err)
            if self._death_due():
                await self._handle_death()
            if self.on_poll is not None:
                try:
                    self.on_poll(self)
                except Exception:
                    log.exception("%s: poll callback failed", self.name)

    @property
    def starting(self) -> bool:
        """start() has been called and has not returned or failed yet."""
        return self._thread is not None and not self._ready.is_set()

    def mark_dead(self, err: BaseException) -> None:
        """Refuse new requests now; the watch loop reports and replaces the engine once
        in-flight requests have their errors. Safe from any thread; idempotent."""
        with self._lock:
            if self.dead_reason is not None or self.state in (STOPPED, FAILED):
                return
            self.dead_reason = f"{type(err).__name__}: {err}"
            # Keep the message, not ``err``: its traceback would keep the frames of whichever
            # request saw the death (a Triton response sender among them) alive.
            self._dead_error = Unavailable(self.dead_reason)
            self._dead_since = time.monotonic()
            self._dead_handled = False
            self.failure_count += 1
        log.error("%s: engine is dead (%s); refusing requests until it is replaced",
                  self.name, self.dead_reason)
        self._set_state(DEAD)

    def _death_due(self) -> bool:
        if self.dead_reason is None or self._dead_handled or self.state != DEAD:
            return False
        waited = time.monotonic() - self._dead_since
        return self.outstanding == 0 or waited >= self.DEAD_REPORT_GRACE_S

    async def _handle_death(self) -> None:
        """Count the failure, then replace the engine after a backoff, or give up."""
        self._dead_handled = True
        assert self._dead_error is not None
        if self.on_dead is not None:
            try:
                self.on_dead(self._dead_error)
            except Exception:
                log.exception("%s: on_dead callback failed", self.name)
        while True:
            now = time.monotonic()
            self.failures = [t for t in self.failures if now - t < self.restart.window_s]
            self.failures.append(now)
            n = len(self.failures)
            if not self.restart.enabled:
                self._give_up("in-place restart disabled (a multi-node unit is restarted "
                              "whole by its supervisor)")
                return
            if n > self.restart.max_failures:
                self._give_up(f"{n} engine failures within {self.restart.window_s:.0f} s "
                              f"(limit {self.restart.max_failures}); restart the server")
                return
            self.next_restart_in = self.restart.delay(n)
            log.warning("%s: replacing the engine in %.1f s (failure %d of %d allowed in "
                        "%.0f s; backoff doubles per failure, max %.0f s)", self.name,
                        self.next_restart_in, n, self.restart.max_failures,
                        self.restart.window_s, self.restart.backoff_max_s)
            self._set_state(RESTARTING)
            await asyncio.sleep(self.next_restart_in)
            if self._stop is not None and self._stop.is_set():
                return
            if await self._replace():
                return
            # the new engine failed to start: that is one more failure in the window

    async def _replace(self) -> bool:
        """Shut the dead engine down and build a new one, both on this loop thread, as at
        start: vLLM's AsyncLLM starts its output handler on the running loop (built
        elsewhere, it would miss an engine-core failure before the first request), and its
        shutdown cancels tasks of this loop. Blocking the loop meanwhile is harmless: no
        request is admitted while the host is not READY."""
        old, t0 = self.engine, time.monotonic()
        if old is not None:
            self._shutdown_engine(old)
        try:
            new = self._build()
        except Exception as exc:  # noqa: BLE001 - counted as a failure, retried with backoff
            log.error("%s: new engine failed to start: %s: %s", self.name,
                      type(exc).__name__, exc)
            self.dead_reason = f"engine restart failed: {type(exc).__name__}: {exc}"
            self.failure_count += 1
            return False
        self._adopt(new)
        with self._lock:
            self.dead_reason = None
        try:
            await self._warm()
        except Exception as exc:  # noqa: BLE001 - a new engine that cannot serve: a failure
            log.error("%s: new engine failed its warm-up: %s: %s", self.name,
                      type(exc).__name__, exc)
            self.dead_reason = f"engine restart failed warm-up: {type(exc).__name__}: {exc}"
            self.failure_count += 1
            self._set_state(RESTARTING)
            return False
        if self.on_restarted is not None:
            try:
                self.on_restarted()
            except Exception:
                log.exception("%s: restart hook failed", self.name)
        self.restarts += 1
        self.next_restart_in = 0.0
        with self._lock:
            self.dead_reason = None
            self._dead_error = None
        log.warning("%s: engine replaced in %.1f s (restart #%d); ready again", self.name,
                    time.monotonic() - t0, self.restarts)
        self._set_state(READY)
        return True

    def _give_up(self, why: str) -> None:
        log.error("%s: engine stays down: %s. Last failure: %s", self.name, why,
                  self.dead_reason)
        self.dead_reason = f"engine stays down ({why}); last failure: {self.dead_reason}"
        self._set_state(FAILED)

    def _set_state(self, state: EngineState) -> None:
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(self, state)
            except Exception:
                log.exception("%s: state callback failed", self.name)

    def shutdown(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._stop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # loop closed in between
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ requests
    @property
    def healthy(self) -> bool:
        return self.engine is not None and self.dead_reason is None and self.state == READY

    def unavailable_reason(self) -> str:
        if self.state == RESTARTING:
            return (f"engine restarting after a failure ({self.dead_reason}); "
                    f"retry shortly or on another replica")
        return self.dead_reason or f"engine {self.state}"

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        assert self.loop is not None, "engine not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def admit(self, internal: bool = False) -> None:
        """Count one request in, or refuse it: unbounded queues only hide overload.
        ``internal``: the model's own warm-up, admitted while the host is WARMING."""
        warming = internal and self.state == WARMING and self.engine is not None
        if not (self.healthy or warming):
            raise Unavailable(f"engine unavailable: {self.unavailable_reason()}")
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
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """The engine's generate (``kwargs``: e.g. vLLM's ``lora_request``), with engine death
        turned into :class:`Unavailable`."""
        engine = self.engine
        try:
            async for out in engine.generate(prompt, sampling_params, request_id, **kwargs):
                yield out
        except Exception as exc:
            if not _is_engine_death(exc, engine):
                raise
            if engine is self.engine:  # not a straggler of an engine already replaced
                self.mark_dead(exc)
            raise Unavailable(f"engine died: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        if self.healthy:
            await self.engine.abort(request_id)

    def num_running(self) -> int:
        """Requests the engine itself holds (running + waiting), for tests and load reports."""
        return unfinished_requests(self.engine) if self.healthy else 0


def _is_engine_death(exc: BaseException, engine: Any) -> bool:
    """vLLM's EngineDeadError, or any error from an engine that now reports ``errored``."""
    if type(exc).__name__ == "EngineDeadError":
        return True
    return bool(getattr(engine, "errored", False))


def restart_policy_from_env(env: dict[str, str] | None = None) -> RestartPolicy:
    """The policy from ``RUFUS_ENGINE_*`` alone (no config.pbtxt)."""
    return read(RestartPolicy, env=env)
