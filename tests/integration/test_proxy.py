"""The proxy layer with real processes: two units (leader tritonserver + follower each,
rufus/launch/rig.py), a unit agent per unit, HAProxy in front (rufus/launch/fleet.py =
`make fleet`).

One fleet for the module (every vLLM start costs 1-3 minutes on 2 cores); tests run in
file order and the failure test comes after the ones that need a whole fleet. Every
process is ended by process group at the end, and the test checks that none is left.

``--proxy-nnodes 1`` runs single-node units (kills the engine core instead of a
follower) when CPU is scarce.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psutil
import pytest

from proxy.haproxy import find_haproxy
from rufus.client import RequestFailed, generate
from rufus.errors import InvalidInput
from rufus.launch.fleet import Fleet
from tests.environment import option
from tests.fakes import FakeLeader

from .conftest import metric_value, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_haproxy() is None,
                       reason="haproxy not installed; `bash scripts/setup.sh proxy` (as root) "
                              "installs it from Debian"),
]
MODEL = "rufus_llm"
NNODES = option("--proxy-nnodes")
ENGINE_ARGS = {"max_num_seqs": 8, "max_model_len": 1024}
SHORT = {"max_tokens": 8, "temperature": 0.0}
TAKEOUT_BUDGET_S = 5.0


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, psutil.Error):
        return None


@pytest.fixture(scope="module")
def fleet(log_dir):
    # stagger: one unit compiles at a time, the other then starts from its compile cache;
    # the wait ends with the fleet's diagnosis before pytest's own 900-s timeout would
    f = Fleet(n_units=2, nnodes=NNODES, engine_args=dict(ENGINE_ARGS), log_dir=log_dir / "fleet",
              extra_env={"VLLM_CPU_KVCACHE_SPACE": "1"}, stagger=True)
    groups: set[int] = set()
    try:
        f.start()
        f.wait_ready(timeout=780)
        yield f
    finally:
        groups = f.pgids()
        f.stop()

        def left() -> list[psutil.Process]:  # zombies: dead, awaiting reaping
            return [p for p in psutil.process_iter(["status"]) if _pgid(p) in groups
                    and p.info["status"] != psutil.STATUS_ZOMBIE]

        wait_for(lambda: not left(), timeout=30)
        assert not left(), f"processes left 30 s after fleet stop: {left()}"


@pytest.mark.parametrize("flavor", ["fleet", "compose"])
def test_real_haproxy_and_agent_take_a_unit_out_and_back_quickly(tmp_path, monkeypatch, flavor):
    """No engine needed: a fake leader behind the real agent and the real HAProxy config
    (both renderings), to pin the take-out and put-back times the fleet relies on."""
    from proxy.agent import AgentConfig, UnitAgent
    from proxy.compose_ingress import UnitAddress, render_compose
    from proxy.haproxy import Backend, HAProxy, render
    from rufus.launch.server import free_port

    leader = FakeLeader()
    cfg = AgentConfig(leader_http=f"http://127.0.0.1:{leader.port}",
                      leader_metrics=f"http://127.0.0.1:{leader.port}/metrics",
                      port=free_port(), check_port=free_port(), bind="127.0.0.1", unit="fake")
    agent = UnitAgent(cfg).start()
    if flavor == "fleet":
        text = render([Backend("unit0", "127.0.0.1", leader.port, cfg.port, cfg.check_port)],
                      port=free_port(), stats_port=None,
                      stats_socket=str(tmp_path / "haproxy.sock"), bind="127.0.0.1")
    else:  # the deployment config, with the contract's env vars pointing at the fakes
        text = render_compose(1, grpc_port=free_port(), http_port=free_port(), stats_port=free_port(),
                              agent_check_port=cfg.check_port, units=[UnitAddress(
                                  f"127.0.0.1:{leader.port}", f"127.0.0.1:{leader.port}",
                                  f"127.0.0.1:{cfg.port}")])
        text = text.replace("global\n", f"global\n    stats socket {tmp_path / 'haproxy.sock'}\n", 1)
        text = text.replace("bind :", "bind 127.0.0.1:")
    hp = HAProxy(text, tmp_path, tmp_path / "haproxy.log").start()
    try:
        status = lambda: hp.servers()["unit0"]["status"]  # noqa: E731
        assert wait_for(lambda: status() == "UP", timeout=10, interval=0.05)
        leader.ready = False
        t0 = time.monotonic()
        assert wait_for(lambda: status() != "UP", timeout=10, interval=0.05)
        out_s = time.monotonic() - t0
        checked = "units_lor" if flavor == "fleet" else "unit_health"
        assert "leader" in hp.servers(checked)["unit0"]["last_agt"]  # the agent's reason
        leader.ready = True
        t0 = time.monotonic()
        assert wait_for(lambda: status() == "UP", timeout=10, interval=0.05)
        back_s = time.monotonic() - t0
        print(f"\n{flavor} config, fake unit: out after {out_s:.2f} s, back after {back_s:.2f} s")
        # the take-out budget the fleet relies on; put-back is bounded by the waits above
        # (figures: docs/benchmarks.md)
        assert out_s <= TAKEOUT_BUDGET_S, f"out after {out_s:.2f} s"
    finally:
        hp.stop()
        agent.stop()
        leader.srv.shutdown()


def ask(url: str, prompt: str, sampling=None, retries: int = 0, **kw) -> str:
    return "".join(c.text for c in generate(url, MODEL, messages=[{"role": "user", "content": prompt}],
                                            sampling=sampling or SHORT, retries=retries, **kw))


def unit_requests(fleet: Fleet, i: int) -> float:
    """Finished requests the unit's leader counted (any outcome), from its own metrics."""
    import urllib.request

    u = fleet.units[i].unit
    with urllib.request.urlopen(f"http://127.0.0.1:{u.metrics_port}/metrics", timeout=5) as r:
        return metric_value(r.read().decode(), "rufus_requests_total", model=MODEL)


def test_traffic_reaches_both_units(fleet):
    before = [unit_requests(fleet, i) for i in range(2)]
    served0 = fleet.served()
    with ThreadPoolExecutor(8) as ex:
        answers = list(ex.map(lambda i: ask(fleet.url, f"Gift idea number {i}?"), range(8)))
    assert all(answers)
    served = fleet.served()
    per_unit = {k: served[k] - served0.get(k, 0) for k in served}
    assert all(n >= 2 for n in per_unit.values()), per_unit
    # the leaders publish metrics from a background thread every 0.5 s
    assert wait_for(lambda: all(unit_requests(fleet, i) > before[i] for i in range(2)),
                    timeout=10), before


def unit_metric(fleet: Fleet, i: int, name: str) -> float:
    import urllib.request

    u = fleet.units[i].unit
    with urllib.request.urlopen(f"http://127.0.0.1:{u.metrics_port}/metrics", timeout=5) as r:
        return metric_value(r.read().decode(), name, model=MODEL)


def test_a_conversation_stays_on_one_unit_and_hits_its_prefix_cache(fleet):
    """Requests carrying the conversation key (gRPC metadata through HAProxy, forwarded by
    tritonserver as a parameter, taken out before rufus_llm reads its parameters) all land
    on one unit, whose vLLM prefix cache then serves the shared history."""
    history = "I am planning a week of hiking in the Alps in September with my family. " * 20
    for key in ("conv-a", "conv-b", "conv-c"):
        before = fleet.served("units_affinity")
        hits0 = [unit_metric(fleet, i, "vllm:prefix_cache_hits_total") for i in range(2)]
        for turn in range(3):
            assert ask(fleet.url, f"{history} Question {turn}: what should I pack?",
                       conversation=key)
            # a customer's next turn comes seconds later; back to back, the stream just
            # ended (clients cancel a decoupled stream after its final response) can still
            # count on the unit, and at near-zero load bounded-load hashing then moves the
            # next request (proxy/README.md, "Conversation affinity")
            time.sleep(1.0)
        after = fleet.served("units_affinity")
        per_unit = sorted(after[k] - before.get(k, 0) for k in after)
        assert per_unit == [0, 3], (key, per_unit)
        unit = next(i for i, k in enumerate(sorted(after)) if after[k] > before.get(k, 0))
        assert wait_for(lambda u=unit, h=hits0[unit]: unit_metric(
            fleet, u, "vllm:prefix_cache_hits_total") > h, timeout=10), key


def test_a_hot_conversation_key_spills_over_instead_of_overloading_one_unit(fleet):
    """12 concurrent requests with one key: bounded-load hashing (factor 150 %) keeps the
    key's unit at most ~75 % of them (+1 for rounding) and sends the rest to the other."""
    before = fleet.served("units_affinity")
    with ThreadPoolExecutor(12) as ex:
        answers = list(ex.map(lambda i: ask(fleet.url, f"Tent number {i}?", {
            "max_tokens": 24, "temperature": 0.0}, conversation="hot-key"), range(12)))
    assert all(answers)
    after = fleet.served("units_affinity")
    per_unit = sorted(after[k] - before.get(k, 0) for k in after)
    assert sum(per_unit) == 12 and per_unit[0] >= 2 and per_unit[1] <= 10, per_unit


def test_a_bad_conversation_key_is_refused_by_name_while_a_good_stream_runs(fleet):
    with ThreadPoolExecutor(1) as ex:
        good = ex.submit(ask, fleet.url, "Which sleeping bag for summer?",
                         {"max_tokens": 24, "temperature": 0.0}, conversation="fine-key")
        with pytest.raises(RequestFailed) as info:
            ask(fleet.url, "hello", conversation="has a space")
        assert good.result(timeout=300)
    assert isinstance(info.value.error, InvalidInput)
    assert "x-rufus-conversation" in str(info.value)
    assert "has a sp" in str(info.value) and "Traceback" not in str(info.value)


def test_agent_reports_health_and_load(fleet):
    import json
    import urllib.request

    fu = fleet.units[0]
    status, body = fu.agent_health()
    assert status == 200 and body["healthy"] and body["failing"] == []
    names = {n["node"] for n in body["nodes"]}
    assert "leader" in names
    assert sum(n.startswith("follower") for n in names) == NNODES - 1
    with urllib.request.urlopen(f"http://127.0.0.1:{fu.ports.agent}/load", timeout=2) as r:
        load = json.loads(r.read())
    assert set(load) >= {"outstanding", "waiting", "running", "kv_cache_usage"}
    assert load["outstanding"] is not None


@pytest.mark.parametrize("case", ["bad_top_p", "unknown_input", "unknown_model"])
def test_bad_input_gets_the_same_clear_error_through_the_proxy(fleet, case):
    kw: dict = {}
    model = MODEL
    if case == "bad_top_p":
        kw = {"sampling": {"top_p": 1.5, "max_tokens": 4}}
    elif case == "unknown_input":
        kw = {"raw": {"no_such_input": [b"x"]}, "sampling": SHORT}
    else:
        model = "no_such_model"

    def error(url: str) -> RequestFailed:
        with pytest.raises(RequestFailed) as e:
            list(generate(url, model, "hello", **kw))
        return e.value

    direct, proxied = error(fleet.units[0].url), error(fleet.url)
    print(f"\n{case}: direct {direct.status or '-'}: {direct}; via HAProxy "
          f"{proxied.status or '-'}: {proxied}")
    assert proxied.status == direct.status
    assert str(proxied) == str(direct)
    if case == "bad_top_p":
        assert proxied.status == "INVALID_ARG" and "top_p" in str(proxied)
    elif case == "unknown_input":  # rejected by Triton itself, which names the input
        assert "no_such_input" in str(proxied)
    else:
        assert proxied.status == "NOT_FOUND" and "no_such_model" in str(proxied)


@dataclass
class Outcome:
    start: float
    end: float = 0.0
    chunks: int = 0
    first: float = 0.0
    error: str = ""
    status: str = ""


@dataclass
class Load:
    """Closed-loop clients through the ingress, each request retried before its first token."""

    url: str
    workers: int
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _one(self) -> None:
        o = Outcome(time.monotonic())
        self.outcomes.append(o)
        try:
            for _ in generate(self.url, MODEL, messages=[{"role": "user", "content": "Tent for two?"}],
                              sampling={"max_tokens": 40, "temperature": 0.0, "ignore_eos": True},
                              retries=4, timeout=120):
                o.chunks += 1
                o.first = o.first or time.monotonic()
        except RequestFailed as exc:
            o.error, o.status = str(exc), exc.status
        o.end = time.monotonic()

    def run(self) -> list[threading.Thread]:
        def loop() -> None:
            while not self.stop.is_set():
                self._one()

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.workers)]
        for t in threads:
            t.start()
        return threads


def _break_unit(fleet: Fleet, i: int) -> str:
    """Kill a follower (multi-node) or the engine core (single-node) of unit i."""
    unit = fleet.units[i].unit
    if unit.nnodes > 1:
        unit.kill_follower(1)
        return "follower rank 1 killed (SIGKILL to its process group)"
    assert unit.leader is not None and unit.leader.proc is not None
    pgid = unit.leader.proc.pid
    for p in psutil.process_iter(["name", "cmdline"]):
        if _pgid(p) == pgid and "EngineCore" in (p.info["name"] or "") + " ".join(p.info["cmdline"] or []):
            p.send_signal(signal.SIGKILL)
            return f"engine core pid {p.pid} killed"
    raise AssertionError("no engine core found in unit 0's process group")


def test_broken_unit_is_taken_out_without_losing_requests_and_comes_back(fleet):
    load = Load(fleet.url, workers=8)
    threads = load.run()
    try:
        assert wait_for(lambda: sum(o.chunks > 0 for o in load.outcomes) >= 8, timeout=120)
        time.sleep(2)
        assert all(s == "UP" for s in fleet.server_status().values())
        what = _break_unit(fleet, 0)
        t_kill = time.monotonic()
        # "UP 1/2" is HAProxy's "failing, still routed" state: out means DOWN (or MAINT)
        assert wait_for(lambda: fleet.server_status()["unit0"].split()[0] in ("DOWN", "MAINT"),
                        timeout=15, interval=0.05), f"unit0 still routed 15 s after {what}"
        takeout = time.monotonic() - t_kill
        agent_status, agent_body = fleet.units[0].agent_health()
        served_out = fleet.served()["unit0"]
        time.sleep(8)  # keep the load on: everything must go to unit1 now
        assert fleet.served()["unit0"] == served_out, "the DOWN unit still received streams"
    finally:
        load.stop.set()
        t_end = time.monotonic()
        for t in threads:
            t.join(150)
    assert not any(t.is_alive() for t in threads), "a client stream hung"
    print(f"\n{what}; out of HAProxy after {takeout:.2f} s; agent said {agent_status} "
          f"{agent_body.get('failing')}")
    assert takeout <= TAKEOUT_BUDGET_S, f"unit0 taken out after {takeout:.2f} s"

    failed = [o for o in load.outcomes if o.error]
    print(f"{len(load.outcomes)} requests, {len(failed)} failed: "
          f"{sorted({o.error[:120] for o in failed})}")
    # requests that had not streamed anything when their unit broke were retried elsewhere:
    # every failure is a stream that had already produced tokens, with a clear error
    for o in failed:
        assert o.chunks > 0, f"request without tokens lost: {o.error}"
        assert o.status and o.error, o
    # t_kill is read after the kill was sent: these requests can only have met the broken unit
    started_after = [o for o in load.outcomes if o.start >= t_kill and o.end < t_end]
    assert started_after and all(not o.error for o in started_after)
    # requests that were mid-stream on the broken unit ended (error or not) soon after
    assert all(o.end - t_kill < 60 for o in load.outcomes if o.start < t_kill)

    # recovery: the supervisor recreates the unit, the agent reports it healthy, HAProxy
    # puts it back, and it receives traffic again
    assert wait_for(lambda: fleet.server_status()["unit0"] == "UP", timeout=900, interval=1), \
        f"unit0 not back: {[e.kind + ' ' + e.detail for e in fleet.units[0].sup.events]}"
    before = fleet.served()["unit0"]
    with ThreadPoolExecutor(6) as ex:
        assert all(ex.map(lambda i: ask(fleet.url, f"Backpack size {i}?", retries=2), range(6)))
    assert fleet.served()["unit0"] > before
