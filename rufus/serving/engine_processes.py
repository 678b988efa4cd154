"""vLLM's process layout for a served engine: where its worker runs, how its EngineCore
process starts (fork or spawn), which cores the forked EngineCore binds itself to, and the
environment vLLM's processes are started in (set around the engine's construction, restored
after it).

:class:`EngineProcessLayout` owns that state. Fork hooks are process-wide (``os.fork`` runs
every registered hook), so this process has one layout, :data:`ENGINE_PROCESSES`, whose hooks
are registered when it builds its first engine, not at import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rufus.env import env_opt, env_str, environ, lab_on, set_environ

log = logging.getLogger("rufus.serving.engine")  # the host's logger, as before the move

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
    from rufus.machine import cpu as machine

    env = environ() if env is None else env
    if env.get(OMP_BIND_VAR, "auto") != "auto":
        return None
    flags = machine.this_cpu(env) if flags is None else flags
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if machine.native_bf16(flags) or len(cpus) < 2:
        return None
    return ",".join(str(c) for c in cpus)


def _uni(engine_args: Mapping[str, Any]) -> bool:
    return engine_args.get("distributed_executor_backend") == "uni"


class EngineProcessLayout:
    """The process layout of the engines this process builds (:meth:`build`).

    State, set only while an engine is built: ``uni_cores``, the cores :meth:`environment`
    gives a ``"uni"`` engine's worker (None: vLLM binds nothing); ``fork_cores`` and
    ``before_fork``, the cores a forked EngineCore binds itself to and the hook run in this
    process right before that fork (both set only while :meth:`start_method` forks)."""

    def __init__(self) -> None:
        self.uni_cores: list[int] | None = None
        self.fork_cores: list[int] | None = None
        self.before_fork: Callable[[], None] | None = None
        self._hooked = False
        self._lock = threading.Lock()

    def hook_forks(self) -> None:
        """Register this layout's fork hooks with ``os.register_at_fork``, once."""
        with self._lock:
            if self._hooked:
                return
            os.register_at_fork(before=self._before_fork, after_in_child=self._bind_in_child)
            self._hooked = True

    def _before_fork(self) -> None:
        """In this process, just before it forks (only while :meth:`start_method` forks the
        EngineCore): the caller's ``before_fork`` (the stub's heap freeze)."""
        hook = self.before_fork
        if hook is not None:
            hook()

    def _bind_in_child(self) -> None:
        """In a child forked while the EngineCore starts: its OpenMP binding.

        A spawned EngineCore reads the binding from the environment (OMP_NUM_THREADS,
        OMP_PLACES) when its OpenMP runtime loads; a forked one inherits the runtime this
        process loaded before that environment was set, so it applies the same cores and
        thread count itself. Without this the model ran on every core (docs/benchmarks.md)."""
        cores = self.fork_cores
        if cores is None:
            return
        os.sched_setaffinity(0, cores)
        import torch

        torch.set_num_threads(len(cores))

    @contextlib.contextmanager
    def forking(self, cores: list[int] | None,
                before_fork: Callable[[], None] | None) -> Iterator[None]:
        """While this process forks the EngineCore: the cores the child binds itself to and
        the hook run right before the fork (fork hooks registered: :meth:`hook_forks`)."""
        self.fork_cores, self.before_fork = cores, before_fork
        try:
            yield
        finally:
            self.fork_cores = self.before_fork = None

    @contextlib.contextmanager
    def environment(self, engine_args: Mapping[str, Any]) -> Iterator[None]:
        """The environment vLLM's processes are started in; make ``"uni"`` mean what it says.

        ``"distributed_executor_backend": "uni"`` runs the model in the EngineCore process (as
        vLLM does on a GPU with one device) instead of a separate worker process that is
        spawned and imports torch and vLLM again, and that the EngineCore drives through
        shared-memory queues: a start spawns one process fewer and a step crosses no process
        boundary (docs/benchmarks.md). The EngineCore stays a process of its own, which the
        engine-death handling watches. On CPU two things are needed for it: vLLM's CPU
        platform turns "uni" into "mp" unless V1 multiprocessing is off (for ``AsyncLLM`` that
        switch only decides where the worker runs; it stays off in this process), and only
        the "mp" executor binds the worker's OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``,
        one core kept for the scheduler). So here, around the engine's construction (its
        processes inherit this environment), the same binding vLLM would give the worker is
        set: same cores, same thread count, on any machine; the OpenMP variables are
        restored on exit."""
        if not _uni(engine_args):
            yield
            return
        from vllm.platforms import current_platform

        set_environ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not current_platform.is_cpu():
            yield
            return
        bind = every_core_binding()
        if bind is not None:
            set_environ(OMP_BIND_VAR, bind)
            log.info("no native bf16 on this CPU: the engine's OpenMP threads take every core "
                     "(%s=%s; set it to override)", OMP_BIND_VAR, bind)
        try:
            with self._one_worker_omp():
                yield
        finally:
            if bind is not None:
                set_environ(OMP_BIND_VAR, None)

    @contextlib.contextmanager
    def _one_worker_omp(self) -> Iterator[None]:
        """vLLM's OpenMP environment for one local worker, and its cores as ``uni_cores``."""
        from types import SimpleNamespace

        from vllm.utils.ompmultiprocessing import OMPProcessManager

        one_worker = SimpleNamespace(
            parallel_config=SimpleNamespace(local_world_size=1, data_parallel_rank_local=None,
                                            _api_process_count=1),
            kv_transfer_config=None)
        omp = OMPProcessManager(one_worker)
        with omp.configure_omp_envs(rank=0, local_rank=0):
            self.uni_cores = (None if omp.skip_setup or not omp.cpu_lists
                              else list(omp.cpu_lists[0]))
            now = environ()
            log.info("vLLM worker inside the engine core; OpenMP: %s", {
                k: now[k] for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                    "KMP_AFFINITY", "GOMP_CPU_AFFINITY") if k in now})
            try:
                yield
            finally:
                self.uni_cores = None

    @contextlib.contextmanager
    def start_method(self, engine_args: Mapping[str, Any],
                     before_fork: Callable[[], None] | None = None) -> Iterator[str]:
        """How vLLM starts its EngineCore process; yields ``"fork"`` or ``"spawn"``.

        vLLM's CPU platform sets ``spawn`` while it builds the config, so the EngineCore
        starts a new interpreter that imports torch and vLLM again, which this process has
        just done. With the worker inside the EngineCore (``"uni"``: no process of its own to
        start and no OpenMP pool yet in this one), the EngineCore can be forked from here
        instead, as vLLM does on a GPU: it starts with everything imported, and binds itself
        to the cores :meth:`environment` chose (:meth:`_bind_in_child`); ``before_fork`` runs
        right before that fork. ``RUFUS_LAB_OFF=fork`` keeps vLLM's spawn (the
        benchmark's baseline); multi-node units (``"mp"``) keep vLLM's choice. Used between building the
        config and building the engine (the env var is read then) and restored after."""
        method = "fork" if lab_on("fork") else "spawn"
        if not _uni(engine_args) or method == "spawn":
            yield env_str("VLLM_WORKER_MULTIPROC_METHOD", "fork")
            return
        before = env_opt("VLLM_WORKER_MULTIPROC_METHOD")
        set_environ("VLLM_WORKER_MULTIPROC_METHOD", "fork")
        try:
            with self.forking(self.uni_cores, before_fork):
                yield "fork"
        finally:
            set_environ("VLLM_WORKER_MULTIPROC_METHOD", before)

    def build(self, engine_args: Mapping[str, Any], stat_loggers: list[Any] | None = None,
              name: str = "engine", before_fork: Callable[[], None] | None = None) -> Any:
        """vLLM's ``AsyncLLM`` in this layout (:meth:`environment`, :meth:`start_method`).
        ``before_fork`` runs in this process right before it forks the EngineCore (not when
        it is spawned): the place for :func:`gc.freeze`, as Python's documentation advises,
        so that the child inherits the heap frozen (vLLM's EngineCore collects and freezes
        its heap at the end of its start: over the inherited objects too, unless they are
        frozen) and neither process's collections write to the pages they share."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self.hook_forks()
        with self.environment(engine_args):
            args = AsyncEngineArgs(**engine_args)
            config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
            with self.start_method(engine_args, before_fork) as method:
                log.info("%s: starting vLLM's EngineCore by %s", name, method)
                return AsyncLLM.from_vllm_config(
                    config, stat_loggers=stat_loggers,
                    enable_log_requests=args.enable_log_requests,
                    disable_log_stats=args.disable_log_stats)


# This process's layout: the one whose fork hooks run when it forks an EngineCore.
ENGINE_PROCESSES = EngineProcessLayout()


def build_vllm_engine(engine_args: Mapping[str, Any], stat_loggers: list[Any] | None = None,
                      name: str = "engine",
                      before_fork: Callable[[], None] | None = None) -> Any:
    """vLLM's ``AsyncLLM`` in the served process layout (:meth:`EngineProcessLayout.build`);
    the benchmarks' in-process engine is built the same way."""
    return ENGINE_PROCESSES.build(engine_args, stat_loggers, name, before_fork)
