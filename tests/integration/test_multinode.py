"""The two-node unit with real processes: leader tritonserver (rank 0) + `python -m follower`
(rank 1), pipeline_parallel_size=2, the real default model, loopback mode (rufus/launch/rig.py).

The unit is started once for the module under a Supervisor (the `make rig` code) and ended
by process group at the end. Order matters: the failure tests come last, and the follower
kill test relies on the supervisor's whole-unit restart for the leader-death test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from rufus.client import generate
from rufus.launch.rig import LocalUnit, Supervisor
from rufus.launch.server import TritonServer, free_port

from .conftest import wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_llm"
PROMPTS = [
    "The best way to keep running shoes clean is",
    "A good tent for two people should",
    "My favourite kind of running shoe is",
    "The difference between OLED and QLED TVs is",
]
# ignore_eos: every prompt yields exactly max_tokens tokens (an empty answer proves nothing).
GREEDY = {"temperature": 0.0, "max_tokens": 32, "ignore_eos": True}
# Engine shrunk as in the single-node `llm_server` fixture; float32 for the comparison.
# In bf16, torch.compile/inductor fuses (and rounds) differently when the 30 layers are one
# graph than when they are two pipeline stages, and greedy decoding flips at near-ties
# (seen here: one of these prompts diverged after 12 identical tokens). float32 keeps the
# rounding differences ~1e-7, so identical output checks the lockstep execution itself.
# (enforce_eager would avoid the fusion difference, but vLLM 0.32's CPU runner fails with
# pipeline parallelism in eager mode: `assert self.intermediate_tensors is not None`.)
# The source weights too ("quantization": null, not the int8 copy a VNNI CPU serves): the
# comparison checks lockstep execution, and float32 throughout keeps it exact.
SINGLE_ARGS = {"max_num_seqs": 16, "max_model_len": 1024, "dtype": "float32", "quantization": None}
UNIT_ARGS = {**SINGLE_ARGS, "pipeline_parallel_size": 2}


def complete(url: str, prompt: str, stream: bool = False) -> tuple[str, int]:
    chunks = list(generate(url, MODEL, prompt, stream=stream, sampling=GREEDY,
                           flags={"exclude_input_in_output": True}))
    return "".join(c.text for c in chunks), len(chunks)


@pytest.fixture(scope="module")
def unit_started(log_dir) -> Iterator[Supervisor]:
    """The two-node unit under its supervisor, started but not waited for: it starts beside
    the single-node reference server (the two starts overlap; each waits on one core part of
    the time). At the end, every process of the unit is gone."""
    unit = LocalUnit(engine_args=UNIT_ARGS, log_dir=log_dir / "multinode")
    s = Supervisor(unit, start_timeout=900, drain_s=10).start()
    try:
        yield s
    finally:
        groups = {f.pid for f in unit.followers.values()}
        if unit.leader is not None and unit.leader.proc is not None:
            groups.add(unit.leader.proc.pid)
        s.stop()
        left = _alive_in(groups)
        assert not left, f"processes left after stop: {left}"


@pytest.fixture(scope="module")
def single_node_reference(log_dir, unit_started) -> list[str]:
    """Greedy completions from a single-node tritonserver with the same engine args."""
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log_dir / "multinode-single.log",
                       extra_env={"RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(SINGLE_ARGS),
                                  "VLLM_CPU_KVCACHE_SPACE": "1"})
    srv.start()
    try:
        srv.wait_ready(timeout=900)
        return [complete(f"127.0.0.1:{srv.grpc_port}", p)[0] for p in PROMPTS]
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def sup(unit_started, single_node_reference) -> Supervisor:
    if not unit_started.wait_ready(960):
        raise RuntimeError(f"unit not ready: {unit_started.events} "
                           f"(logs in {unit_started.unit.log_dir})")
    return unit_started


def test_follower_health_reports_running(sup):
    status, body = sup.unit.follower_health(1)
    assert status == 200
    assert body["rank"] == 1 and body["nnodes"] == 2 and body["state"] == "running"
    assert body["leader"] == f"127.0.0.1:{sup.unit.leader_port}"


def test_greedy_outputs_identical_to_single_node(sup, single_node_reference):
    got = [complete(sup.unit.url, p)[0] for p in PROMPTS]
    assert all(single_node_reference), "reference completions must not be empty"
    assert got == single_node_reference


def test_streaming_through_triton(sup, single_node_reference):
    text, n = complete(sup.unit.url, PROMPTS[0], stream=True)
    assert n > 1, "streaming must deliver more than one response"
    assert text == single_node_reference[0]


def test_follower_started_before_leader_exits_nonzero(log_dir):
    unit = LocalUnit(engine_args=UNIT_ARGS, log_dir=log_dir / "multinode-noleader")
    t0 = time.monotonic()
    proc = unit.start_follower(1, {"RUFUS_JOIN_WAIT_S": "3"})
    try:
        rc = proc.wait(20)
    finally:
        unit.stop()
    log = (unit.log_dir / "rig-follower1.log").read_text()
    assert rc == 3, log
    assert time.monotonic() - t0 < 15
    assert "not reachable after" in log and "waiting for leader" in log


def test_mismatched_follower_is_rejected_and_unit_keeps_serving(sup, single_node_reference):
    unit = sup.unit
    bad = {**UNIT_ARGS, "max_model_len": 512}
    proc = unit.start_follower(1, {"RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(bad),
                                   "RUFUS_HEALTH_PORT": str(free_port()),
                                   "RUFUS_JOIN_WAIT_S": "10"},
                               log_name="rig-follower-mismatch.log")
    try:
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (unit.log_dir / "rig-follower-mismatch.log").read_text()
    assert rc == 2, log
    assert "engine config mismatch" in log
    # only the key is named by the leader; the follower adds its own value (issue 12)
    assert "mismatch in: max_model_len" in log and "max_model_len=512" in log
    assert unit.leader_ready() and complete(unit.url, PROMPTS[1])[0] == single_node_reference[1]


def test_follower_death_mid_stream_then_unit_recovers(sup, single_node_reference):
    """Kill the follower node (its process group, SIGKILL) during a stream."""
    unit = sup.unit
    restarts = sup.restarts
    killed_at, err = unit.kill_follower_mid_stream(MODEL, timeout=60)
    failed_after = time.monotonic() - killed_at
    assert killed_at, "the stream must have started before the kill"
    assert err is not None and err.status == "UNAVAILABLE", err
    assert failed_after < 10, f"in-flight stream ended after {failed_after:.1f} s"
    # The leader itself reports not ready (the supervisor waits for that before restarting).
    assert wait_for(lambda: sup.last("leader_not_ready") is not None
                    or sup.last("drain_timeout") is not None, timeout=15)
    nr = sup.last("leader_not_ready")
    assert nr is not None, f"leader never reported not ready: {sup.events}"
    assert nr.t - killed_at < 10
    # A new request during the outage is refused at once (not ready / server restarting).
    t1 = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - RequestFailed or connection refused
        list(generate(unit.url, MODEL, PROMPTS[0], stream=False, sampling=GREEDY, timeout=15))
    assert time.monotonic() - t1 < 15
    # Whole-unit restart by the supervisor, then correct service again.
    assert wait_for(lambda: sup.restarts > restarts and sup.ready.is_set(), timeout=960,
                    interval=1.0), f"unit did not recover: {sup.events}"
    recovered_after = time.monotonic() - killed_at
    assert complete(unit.url, PROMPTS[0])[0] == single_node_reference[0]
    print(f"\n[multinode] stream failed {failed_after:.2f} s after the kill; leader not ready "
          f"after {nr.t - killed_at:.2f} s; unit serving again after {recovered_after:.1f} s")


def test_leader_death_makes_followers_exit_nonzero(sup):
    unit = sup.unit
    sup.detach()  # no restart: watch what the follower does on its own
    follower = unit.followers[1]
    leader_pgid = unit.leader.proc.pid
    t0 = time.monotonic()
    unit.kill_leader()
    try:
        rc = follower.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("follower still running 10 s after the leader died")
    took = time.monotonic() - t0
    assert rc == 4, f"follower exit code {rc} (4 = leader lost)"
    unit.leader.proc.wait(10)  # reap our own child (the dead tritonserver)
    # no orphans: nothing left running in either node's process group (zombies are dead
    # processes whose exit status nobody collected yet; they hold no resources)
    assert wait_for(lambda: not _alive_in({leader_pgid, follower.pid}), timeout=10), \
        _alive_in({leader_pgid, follower.pid})
    print(f"\n[multinode] follower exited {rc} {took:.2f} s after the leader was killed")


def _pgid(p: psutil.Process) -> int:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return -1


def _alive_in(groups: set[int]) -> list[str]:
    out = []
    for p in psutil.process_iter(["name", "status"]):
        if _pgid(p) in groups and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(f"{p.pid} {p.info['name']}")
    return out
