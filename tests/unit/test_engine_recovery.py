"""EngineHost heals a dead engine in place: fake engines behind the Engine protocol.

The real engine (vLLM's engine core killed mid-stream) is covered by
tests/integration/test_recovery.py; here every branch of the policy is checked quickly:
replace after a death, exponential backoff, give up after too many failures in the window,
a failed restart counts as a failure, a straggler of the old engine cannot kill the new one.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from rufus.serving.engine import (
    DEAD,
    FAILED,
    READY,
    RESTARTING,
    EngineHost,
    EngineSpec,
    RestartPolicy,
    Unavailable,
    restart_policy_from_env,
)
from rufus.serving.engine_api import Completion, Engine, Output


class FakeEngine:
    """Satisfies rufus.serving.engine_api.Engine; ``die()`` simulates a dead engine core."""

    built = 0

    def __init__(self) -> None:
        FakeEngine.built += 1
        self.serial = FakeEngine.built
        self.tokenizer = SimpleNamespace(name="tok")
        self.model_config = SimpleNamespace(max_model_len=64)
        self.output_processor = SimpleNamespace(get_num_unfinished_requests=lambda: 0)
        self.errored = False
        self.shut = False
        self._dead = asyncio.Event()

    def die(self) -> None:
        self.errored = True

    async def generate(self, prompt: Any, params: Any, request_id: str):
        for i in range(3):
            if self.errored:
                raise RuntimeError("EngineCore died")
            yield Output([Completion(f"t{i}", [i])], i == 2, request_id)
            await asyncio.sleep(0.01)

    async def abort(self, request_id: str) -> None:
        pass

    def shutdown(self) -> None:
        self.shut = True


def make_host(policy: RestartPolicy, factory=None) -> tuple[EngineHost, list[str]]:
    states: list[str] = []
    host = EngineHost(EngineSpec({}, factory=factory or (lambda args: FakeEngine())),
                      name="t", restart=policy, on_state=lambda h, s: states.append(s))
    host.start()
    return host, states


def wait(pred, timeout: float = 10.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.02)
    return False


def collect(host: EngineHost) -> list[Any]:
    async def run() -> list[Any]:
        return [o async for o in host.generate({"prompt_token_ids": [1]}, None, "r")]
    return host.submit(run()).result(5)


def test_fake_engine_satisfies_the_protocol():
    assert isinstance(FakeEngine(), Engine)


def test_dead_engine_is_replaced_and_serves_again():
    host, states = make_host(RestartPolicy(backoff_s=0.05))
    try:
        first = host.engine
        assert len(collect(host)) == 3
        first.die()
        assert wait(lambda: host.state != READY, 2), "death not noticed"
        assert not host.healthy
        with pytest.raises(Unavailable):
            host.admit()
        assert wait(lambda: host.state == READY and host.engine is not first)
        assert first.shut, "the dead engine was not shut down"
        assert host.healthy and host.restarts == 1 and host.failure_count == 1
        assert len(collect(host)) == 3
        assert states[:4] == [READY, DEAD, RESTARTING, READY]
    finally:
        host.shutdown(5)


def test_backoff_doubles_and_host_gives_up_after_max_failures_in_window():
    policy = RestartPolicy(max_failures=2, window_s=60, backoff_s=0.05, backoff_max_s=0.1)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.05, 0.1, 0.1, 0.1]
    host, _ = make_host(policy)
    try:
        for n in (1, 2):
            host.engine.die()
            assert wait(lambda n=n: host.restarts == n and host.state == READY), n
        host.engine.die()
        assert wait(lambda: host.state == FAILED)
        assert "3 engine failures within 60 s (limit 2)" in host.unavailable_reason()
        with pytest.raises(Unavailable, match="stays down"):
            host.admit()
        time.sleep(0.3)
        assert host.state == FAILED and host.restarts == 2, "restarted after giving up"
    finally:
        host.shutdown(5)


def test_failed_restart_counts_as_a_failure_and_is_retried():
    calls = {"n": 0}

    def factory(args):
        calls["n"] += 1
        if calls["n"] == 2:  # the first replacement fails to start
            raise OSError("no memory for the KV cache")
        return FakeEngine()

    host, _ = make_host(RestartPolicy(max_failures=3, backoff_s=0.05), factory)
    try:
        host.engine.die()
        assert wait(lambda: host.state == READY and calls["n"] == 3)
        assert host.failure_count == 2 and host.restarts == 1
    finally:
        host.shutdown(5)


def test_restart_disabled_stays_down():
    host, _ = make_host(RestartPolicy(enabled=False))
    try:
        host.engine.die()
        assert wait(lambda: host.state == FAILED)
        assert "restarted whole by its supervisor" in host.unavailable_reason()
    finally:
        host.shutdown(5)


def test_straggler_of_a_replaced_engine_does_not_kill_the_new_one():
    host, _ = make_host(RestartPolicy(backoff_s=0.05))
    try:
        new, stale = host.engine, FakeEngine()

        async def straggle() -> None:
            host.engine = stale  # a request that began on an engine since replaced
            gen = host.generate({"prompt_token_ids": [1]}, None, "old")
            await gen.__anext__()
            host.engine = new
            stale.die()
            with pytest.raises(Unavailable):
                async for _ in gen:
                    pass

        host.submit(straggle()).result(5)
        time.sleep(0.6)
        assert host.healthy, "the new engine was marked dead by the old engine's request"
    finally:
        host.shutdown(5)


def test_policy_from_environment():
    p = restart_policy_from_env({"RUFUS_ENGINE_MAX_FAILURES": "5",
                                 "RUFUS_ENGINE_RESTART": "false",
                                 "RUFUS_ENGINE_RESTART_BACKOFF_S": "2"})
    assert (p.max_failures, p.enabled, p.backoff_s) == (5, False, 2.0)


METRICS = """# HELP rufus_engine_ready 1 while the engine serves
rufus_engine_ready{model="rufus_llm",version="1"} 0
rufus_engine_ready{model="rufus_qp_medusa",version="1"} 1
"""


def test_health_checks_read_the_engine_gauge():
    from proxy.agent import judge_engines
    from rufus.launch.server import engine_ready_from_metrics

    assert engine_ready_from_metrics(METRICS, "rufus_llm") is False
    assert engine_ready_from_metrics(METRICS, "rufus_qp_medusa") is True
    assert engine_ready_from_metrics(METRICS, "other") is None
    checks = {c.check: c.ok for c in judge_engines(METRICS, ["rufus_llm", "rufus_qp_medusa"])}
    assert checks == {"engine rufus_llm": False, "engine rufus_qp_medusa": True}


def test_torch_planner_engine_reports_a_decoder_crash_as_death():
    """TorchPlannerEngine.errored turns true when decoding itself fails (the default planner
    backend used to never report death), and later requests are refused."""
    import concurrent.futures

    pytest.importorskip("vllm")
    from vllm import SamplingParams

    from rufus.qp.decoder import torch_engine

    class CrashingDecoder:
        def best_slot(self, prompt, free):
            return free[0]

        def start(self, *args, **kwargs):
            return object()

        def step(self, runs):
            raise RuntimeError("decoder state corrupted")

    eng = object.__new__(torch_engine.TorchPlannerEngine)
    eng.errored, eng.dead_error, eng._pending, eng.on_stats = False, None, {}, None
    eng._max_batch, eng._cores, eng._copy_fields = 1, None, ()
    eng._init_queue()
    eng.decoder = CrashingDecoder()
    eng._pool = concurrent.futures.ThreadPoolExecutor(1)

    async def one(rid: str) -> None:
        async for _ in eng.generate({"prompt_token_ids": [1, 2]},
                                    SamplingParams(max_tokens=4, temperature=0), rid):
            pass

    with pytest.raises(RuntimeError, match="decoder state corrupted"):
        asyncio.run(one("a"))
    assert eng.errored and "decoder state corrupted" in str(eng.dead_error)
    with pytest.raises(torch_engine.DecoderCrashed, match="is dead"):
        asyncio.run(one("b"))
    eng.shutdown()


def test_ready_only_after_the_warm_up_at_start_and_after_a_restart():
    """WARMING admits only the model's own (internal) requests; READY comes after them."""
    from rufus.serving.engine import WARMING

    seen: list[tuple[str, bool]] = []
    holder: dict[str, EngineHost] = {}

    async def warm() -> None:
        host = holder["host"]
        with pytest.raises(Unavailable):
            host.admit()  # a client request while warming: refused
        host.admit(internal=True)
        host.release()
        seen.append((host.state, host.healthy))
        assert len([o async for o in host.generate({"prompt_token_ids": [1]}, None, "w")]) == 3

    states: list[str] = []
    host = EngineHost(EngineSpec({}, factory=lambda args: FakeEngine()), name="t",
                      restart=RestartPolicy(backoff_s=0.05),
                      on_state=lambda h, s: states.append(s), warmup=warm)
    holder["host"] = host
    host.start()
    try:
        assert seen == [(WARMING, False)] and host.state == READY and host.warmup_seconds > 0
        first = host.engine
        first.die()
        assert wait(lambda: host.state == READY and host.engine is not first)
        assert seen == [(WARMING, False)] * 2, "the new engine did not warm up before READY"
        assert states == [WARMING, READY, DEAD, RESTARTING, WARMING, READY]
    finally:
        host.shutdown(5)


def test_a_failed_warm_up_fails_the_start():
    async def broken() -> None:
        raise RuntimeError("warm-up request failed")

    host = EngineHost(EngineSpec({}, factory=lambda args: FakeEngine()), name="t",
                      warmup=broken)
    with pytest.raises(RuntimeError, match="warm-up"):
        host.start()
    host.shutdown(5)


def test_uni_backend_keeps_the_worker_in_the_engine_core_bound_like_vllms_worker(
        monkeypatch):
    """"uni" turns V1 multiprocessing off (else vLLM's CPU platform makes it "mp") and, while
    the engine is built, sets the OpenMP binding vLLM's "mp" executor gives its worker
    (explicit cores here); afterwards the stub's own environment is as it was. Any other
    backend, or none, changes nothing."""
    import os

    from rufus.serving.engine_processes import EngineProcessLayout

    engine_process_env = EngineProcessLayout().environment

    for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "OMP_PLACES"):
        # set, then delete: monkeypatch then restores the variable's original state at
        # teardown, also when the code under test set it (engine_process_env leaves
        # VLLM_ENABLE_V1_MULTIPROCESSING set in the process on purpose)
        monkeypatch.setenv(k, "unset-by-test")
        monkeypatch.delenv(k)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    for args in ({"distributed_executor_backend": "mp"}, {}):
        with engine_process_env(args):
            assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
            assert "OMP_NUM_THREADS" not in os.environ
    with engine_process_env({"distributed_executor_backend": "uni"}):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["OMP_PLACES"] == "{0}"
    assert "OMP_NUM_THREADS" not in os.environ and "OMP_PLACES" not in os.environ


def test_engine_core_is_forked_for_uni_unless_told_otherwise(monkeypatch):
    """With the worker inside the EngineCore the core is forked (it starts with torch and
    vLLM imported) over vLLM's CPU "spawn"; RUFUS_LAB_OFF=fork keeps vLLM's
    choice, "mp" (multi-node) always does; the variable is restored afterwards."""
    import os

    from rufus.serving.engine_processes import EngineProcessLayout

    engine_start_method = EngineProcessLayout().start_method

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # as vLLM's CPU config sets
    monkeypatch.delenv("RUFUS_LAB_OFF", raising=False)
    uni = {"distributed_executor_backend": "uni"}
    with engine_start_method(uni) as method:
        assert method == "fork" and os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    with engine_start_method({"distributed_executor_backend": "mp"}) as method:
        assert method == "spawn" == os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
    monkeypatch.setenv("RUFUS_LAB_OFF", "fork")
    with engine_start_method(uni) as method:
        assert method == "spawn" == os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
    monkeypatch.setenv("RUFUS_LAB_OFF", "forkserver")
    with pytest.raises(ValueError, match="RUFUS_LAB_OFF"):
        with engine_start_method(uni):
            pass


def test_before_fork_runs_only_while_the_builder_forks_the_engine_core():
    """build_vllm_engine's ``before_fork`` (the stub's heap freeze) runs in this process
    right before the fork, and only while the builder has set it: no other fork of the
    process runs it."""
    import os

    from rufus.serving.engine_processes import EngineProcessLayout

    layout = EngineProcessLayout()
    layout.hook_forks()  # as its first build does

    def fork_and_reap() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    calls: list[int] = []
    fork_and_reap()
    assert calls == []
    with layout.forking(None, lambda: calls.append(os.getpid())):
        fork_and_reap()
    assert calls == [os.getpid()]


def test_engine_host_hands_before_fork_to_the_builder(monkeypatch):
    seen: dict[str, Any] = {}

    def fake_build(args: Any, loggers: Any, name: str, before_fork: Any = None) -> FakeEngine:
        seen["before_fork"] = before_fork
        return FakeEngine()

    import rufus.serving.engine as eng

    monkeypatch.setattr(eng, "build_vllm_engine", fake_build)
    hook = lambda: None  # noqa: E731
    host = EngineHost(EngineSpec({}, before_fork=hook), name="t")
    try:
        host.start()
        assert seen["before_fork"] is hook
    finally:
        host.shutdown(5)
