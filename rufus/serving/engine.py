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
:class:`rufus.serving.engine_api.Engine`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rufus.env import env_opt, env_str, environ, set_environ
from rufus.errors import AtCapacity, Unavailable
from rufus.serving.engine_api import Engine, unfinished_requests
from rufus.serving.settings import param, read

log = logging.getLogger("rufus.serving.engine")

# Host states, in the order a healthy life goes through them. WARMING: the engine is up and
# serves only the model's own warm-up requests; READY comes after them (and after every
# in-place restart's), so "ready" means the first client request finds nothing left to
# compile or allocate.
STARTING, WARMING, READY, DEAD, RESTARTING, FAILED, STOPPED = (
    "starting", "warming", "ready", "dead", "restarting", "failed", "stopped")


@dataclass
class RestartPolicy:
    """When a dead engine is replaced in place, and when the host gives up.

    Backoff before the k-th restart in the window: ``backoff_s * 2**(k-1)``, capped at
    ``backoff_max_s``. ``enabled=False`` (a multi-node unit's leader: the unit is restarted
    whole by its supervisor) leaves a dead engine down.
    """

    # config.pbtxt parameters (RUFUS_<KEY> wins), read with the model's other settings
    enabled: bool = param("engine_restart", True,
                          "replace a dead engine in place (false: leave it down)")
    max_failures: int = param("engine_max_failures", 3, "engine deaths within the window "
                              "before the host gives up (state failed)", minimum=1)
    window_s: float = param("engine_failure_window_s", 600.0,
                            "the window of engine_max_failures, seconds", minimum=0)
    backoff_s: float = param("engine_restart_backoff_s", 1.0,
                             "backoff before the first restart, doubled per failure in the "
                             "window, seconds", minimum=0)
    backoff_max_s: float = param("engine_restart_backoff_max_s", 30.0,
                                 "cap of the restart backoff, seconds", minimum=0)

    def delay(self, failures_in_window: int) -> float:
        return min(self.backoff_s * 2 ** max(failures_in_window - 1, 0), self.backoff_max_s)


@contextlib.contextmanager
def engine_process_env(engine_args: dict[str, Any]) -> Iterator[None]:
    """The environment vLLM's processes are started in; make ``"uni"`` mean what it says.

    ``"distributed_executor_backend": "uni"`` runs the model in the EngineCore process (as
    vLLM does on a GPU with one device) instead of a separate worker process that is spawned
    and imports torch and vLLM again, and that the EngineCore drives through shared-memory
    queues: a start spawns one process fewer and a step crosses no process boundary
    (docs/benchmarks.md). The EngineCore stays a process of its own, which the engine-death
    handling watches. On CPU two things are needed for it: vLLM's CPU platform turns "uni"
    into "mp" unless V1 multiprocessing is off (for ``AsyncLLM`` that switch only decides where
    the worker runs), and only the "mp" executor binds the worker's OpenMP threads
    (``VLLM_CPU_OMP_THREADS_BIND``, one core kept for the scheduler). So here, around the
    engine's construction (its processes inherit this environment), the same binding vLLM
    would give the worker is set: same cores, same thread count, on any machine."""
    if engine_args.get("distributed_executor_backend") != "uni":
        yield
        return
    from vllm.platforms import current_platform

    set_environ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not current_platform.is_cpu():
        yield
        return
    from types import SimpleNamespace

    from vllm.utils.ompmultiprocessing import OMPProcessManager

    global _uni_cores
    bind = every_core_binding()
    if bind is not None:
        set_environ(OMP_BIND_VAR, bind)
        log.info("no native bf16 on this CPU: the engine's OpenMP threads take every core "
                 "(%s=%s; set it to override)", OMP_BIND_VAR, bind)
    one_worker = SimpleNamespace(
        parallel_config=SimpleNamespace(local_world_size=1, data_parallel_rank_local=None,
                                        _api_process_count=1),
        kv_transfer_config=None)
    try:
        omp = OMPProcessManager(one_worker)
        with omp.configure_omp_envs(rank=0, local_rank=0):
            _uni_cores = None if omp.skip_setup or not omp.cpu_lists else list(omp.cpu_lists[0])
            now = environ()
            log.info("vLLM worker inside the engine core; OpenMP: %s", {
                k: now[k] for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                    "KMP_AFFINITY", "GOMP_CPU_AFFINITY") if k in now})
            try:
                yield
            finally:
                _uni_cores = None
    finally:
        if bind is not None:
            set_environ(OMP_BIND_VAR, None)


OMP_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def every_core_binding(flags: set[str] | None = None, cpus: list[int] | None = None,
                       env: Mapping[str, str] | None = None) -> str | None:
    """The answer engine's OpenMP binding where it is not vLLM's: every core this process
    may use, on a CPU without native bf16 (the answer model runs in fp32 there: AVX2,
    AVX-512 without bf16). There its prefill is compute-bound and the first answer token
    waits for it, so it takes both cores of a two-core unit; vLLM's own binding keeps one
    core for its scheduler, which in the ``"uni"`` layout runs on the worker's thread
    anyway. Measured with AVX2 emulated (docs/benchmarks-history.md, "Every core for the
    answer engine"). With native bf16 the other core stays the planner's (None: vLLM's
    binding); so does an explicit ``VLLM_CPU_OMP_THREADS_BIND``, or a single core."""
    from rufus.serving import machine

    env = environ() if env is None else env
    if env.get(OMP_BIND_VAR, "auto") != "auto":
        return None
    flags = machine.this_cpu(env) if flags is None else flags
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if machine.native_bf16(flags) or len(cpus) < 2:
        return None
    return ",".join(str(c) for c in cpus)


# The cores engine_process_env gives a "uni" engine's worker (None: vLLM binds nothing), and
# the ones a forked EngineCore must bind itself to (set only while engine_start_method forks).
_uni_cores: list[int] | None = None
_fork_cores: list[int] | None = None


def _bind_forked_engine_core() -> None:
    """In a child forked while the EngineCore starts: its OpenMP binding.

    A spawned EngineCore reads the binding from the environment (OMP_NUM_THREADS,
    OMP_PLACES) when its OpenMP runtime loads; a forked one inherits the runtime this
    process loaded before that environment was set, so it applies the same cores and
    thread count itself. Without this the model ran on every core (docs/benchmarks.md)."""
    cores = _fork_cores
    if cores is None:
        return
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(len(cores))


def _before_engine_core_fork() -> None:
    """In this process, just before it forks (only while build_vllm_engine forks the
    EngineCore): the caller's ``before_fork`` (the stub's heap freeze)."""
    hook = _before_fork
    if hook is not None:
        hook()


# set only while build_vllm_engine forks the EngineCore (its ``before_fork``)
_before_fork: Callable[[], None] | None = None

os.register_at_fork(before=_before_engine_core_fork,
                    after_in_child=_bind_forked_engine_core)


@contextlib.contextmanager
def engine_start_method(engine_args: dict[str, Any]) -> Iterator[str]:
    """How vLLM starts its EngineCore process; yields ``"fork"`` or ``"spawn"``.

    vLLM's CPU platform sets ``spawn`` while it builds the config, so the EngineCore starts
    a new interpreter that imports torch and vLLM again, which this process has just done.
    With the worker inside the EngineCore (``"uni"``: no process of its own to start and
    no OpenMP pool yet in this one), the EngineCore can be forked from here instead, as
    vLLM does on a GPU: it starts with everything imported, and binds itself to the cores
    engine_process_env chose (:func:`_bind_forked_engine_core`). ``RUFUS_ENGINE_START_METHOD``
    (``fork`` / ``spawn``) overrides; multi-node units (``"mp"``) keep vLLM's choice. Used
    between building the config and building the engine (the env var is read then)."""
    method = env_str("RUFUS_ENGINE_START_METHOD", "fork")
    if method not in ("fork", "spawn"):
        raise ValueError(f"RUFUS_ENGINE_START_METHOD must be fork or spawn, not {method[:20]!r}")
    if engine_args.get("distributed_executor_backend") != "uni" or method == "spawn":
        yield env_str("VLLM_WORKER_MULTIPROC_METHOD", "fork")
        return
    global _fork_cores
    before = env_opt("VLLM_WORKER_MULTIPROC_METHOD")
    set_environ("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    _fork_cores = _uni_cores
    try:
        yield "fork"
    finally:
        _fork_cores = None
        set_environ("VLLM_WORKER_MULTIPROC_METHOD", before)


def build_vllm_engine(engine_args: dict[str, Any], stat_loggers: list[Any] | None = None,
                      name: str = "engine",
                      before_fork: Callable[[], None] | None = None) -> Any:
    """vLLM's ``AsyncLLM`` in the served process layout (:func:`engine_process_env`,
    :func:`engine_start_method`); the benchmarks' in-process engine is built the same way.
    ``before_fork`` runs in this process right before it forks the EngineCore (not when
    it is spawned): the place for :func:`gc.freeze`, as Python's documentation advises,
    so that the child inherits the heap frozen (vLLM's EngineCore collects and freezes its
    heap at the end of its start: over the inherited objects too, unless they are frozen)
    and neither process's collections write to the pages they share."""
    global _before_fork
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    with engine_process_env(engine_args):
        args = AsyncEngineArgs(**engine_args)
        config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        with engine_start_method(engine_args) as method:
            log.info("%s: starting vLLM's EngineCore by %s", name, method)
            _before_fork = before_fork if method == "fork" else None
            try:
                return AsyncLLM.from_vllm_config(
                    config, stat_loggers=stat_loggers,
                    enable_log_requests=args.enable_log_requests,
                    disable_log_stats=args.disable_log_stats)
            finally:
                _before_fork = None


class EngineHost:
    """One engine (vLLM's ``AsyncLLM`` by default) plus the loop thread it lives on."""

    DEAD_REPORT_GRACE_S = 5.0

    def __init__(
        self,
        engine_args: dict[str, Any],
        *,
        max_outstanding: int = 0,
        stat_loggers: list[Any] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
        on_poll: Callable[[EngineHost], None] | None = None,
        on_state: Callable[[EngineHost, str], None] | None = None,
        on_restarted: Callable[[], None] | None = None,
        name: str = "engine",
        engine_factory: Callable[[dict[str, Any]], Engine] | None = None,
        restart: RestartPolicy | None = None,
        warmup: Callable[[], Awaitable[None]] | None = None,
        before_fork: Callable[[], None] | None = None,
    ) -> None:
        self.engine_args = dict(engine_args)
        # None: vLLM's AsyncLLM. Otherwise a callable building an Engine, e.g. the query
        # planner's torch Medusa engine (rufus/qp/decoder/torch_engine.py).
        self.engine_factory = engine_factory
        self.max_outstanding = max_outstanding
        self.stat_loggers = stat_loggers or []
        self.on_dead = on_dead
        self.on_poll = on_poll
        self.on_state = on_state
        self.on_restarted = on_restarted
        self.name = name
        self.restart = restart or RestartPolicy()
        # Awaited on the loop after every engine build, before READY (the model's warm-up).
        self.warmup = warmup
        # run right before a forked EngineCore is started (build_vllm_engine), every build
        self.before_fork = before_fork
        self.warmup_seconds = 0.0
        self.engine: Any = None
        self.tokenizer: Any = None
        self.max_model_len = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outstanding = 0
        self.state = STARTING
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
        if self.engine_factory is not None:
            return self.engine_factory(self.engine_args)
        return build_vllm_engine(self.engine_args, self.stat_loggers or None, self.name,
                                 before_fork=self.before_fork)

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

    def _set_state(self, state: str) -> None:
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
