"""Capacity-weighted routing with the real agent and the real HAProxy, no engine.

Two units whose leaders (fakes: readiness + Prometheus text with the ``rufus_engine_*``
capacity gauges rufus_llm exports) report different batch limits; each has a real unit
agent (proxy/agent.py) and a gRPC port that holds every stream open (tests/fakes.py). The
test reads HAProxy's own view (``show stat`` weights, streams in flight) and checks that
weights follow the reported capacity, are capped where HAProxy caps them, and that
leastconn then shares concurrent streams by capacity.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.agent import MAX_WEIGHT_PERCENT, AgentConfig, UnitAgent
from proxy.haproxy import Backend, HAProxy, find_haproxy, render
from rufus.launch.server import free_port
from tests.fakes import FakeLeader, HeldStreams

pytestmark = pytest.mark.skipif(find_haproxy() is None,
                                reason="haproxy not installed (scripts/setup.sh proxy)")
REFERENCE = 8
MODEL = "rufus_llm"


def capacity_metrics(max_num_seqs: int, kv_tokens: int = 1_000_000, nodes: int = 1) -> str:
    lab = f'{{model="{MODEL}",version="1"}}'
    return "\n".join([
        f"rufus_requests_outstanding{lab} 0", f"rufus_requests_waiting{lab} 0",
        f"rufus_requests_running{lab} 0", f"rufus_kv_cache_usage_ratio{lab} 0",
        f"rufus_engine_ready{lab} 1",
        f"rufus_engine_capacity_sequences{lab} {max_num_seqs}",
        f"rufus_engine_kv_cache_tokens{lab} {kv_tokens}",
        f"rufus_engine_max_model_len{lab} 1024", f"rufus_engine_nodes{lab} {nodes}",
        f"rufus_engine_tensor_parallel_size{lab} 1",
        f"rufus_engine_pipeline_parallel_size{lab} {nodes}", ""])


class Rig:
    def __init__(self, tmp: Path, seqs: list[int]) -> None:
        self.leaders = [FakeLeader(capacity_metrics(n)) for n in seqs]
        self.grpc = [HeldStreams() for _ in seqs]
        self.agents = [UnitAgent(AgentConfig(
            leader_http=ld.url, leader_metrics=f"{ld.url}/metrics", port=free_port(),
            check_port=free_port(), bind="127.0.0.1", unit=f"fake{i}", poll_s=0.1,
            capacity_reference=REFERENCE)).start() for i, ld in enumerate(self.leaders)]
        backends = [Backend(f"unit{i}", "127.0.0.1", g.port, a.cfg.port, a.cfg.check_port)
                    for i, (g, a) in enumerate(zip(self.grpc, self.agents, strict=True))]
        self.port = free_port()
        kw = {}
        self.equal_port: int | None = None
        if "equal_port" in inspect.signature(render).parameters:  # the equal-weights baseline
            self.equal_port = kw["equal_port"] = free_port()
        text = render(backends, port=self.port, stats_port=None, bind="127.0.0.1",
                      stats_socket=str(tmp / "haproxy.sock"), check_inter_ms=200, **kw)
        self.hp = HAProxy(text, tmp, tmp / "haproxy.log")

    def weights(self, backend: str = "units_lor") -> dict[str, int]:
        return {k: int(r["weight"]) for k, r in self.hp.servers(backend).items()
                if r["status"] == "UP"}

    def stop(self) -> None:
        self.hp.stop()
        for x in (*self.agents, *self.leaders, *self.grpc):
            x.stop()


@pytest.fixture
def rig(tmp_path) -> Iterator[Rig]:
    r = Rig(tmp_path, [8, 2])
    try:
        r.hp.start()
        yield r
    finally:
        r.stop()


def wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def hold_streams(rig: Rig, port: int, n: int) -> list[int]:
    """``n`` concurrent streams through the ingress on ``port``; how many each unit holds
    once all have arrived (then they are released)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    for g in rig.grpc:
        g.reset()
    errors: list[BaseException] = []

    def one(ch: grpc.Channel) -> None:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        try:
            list(stub.ModelStreamInfer(iter([service_pb2.ModelInferRequest(model_name=MODEL)]),
                                       timeout=30))
        except grpc.RpcError as exc:
            errors.append(exc)

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        threads = [threading.Thread(target=one, args=(ch,)) for _ in range(n)]
        for t in threads:
            t.start()
            time.sleep(0.01)  # arrivals one by one, as leastconn sees real traffic
        try:
            assert wait_for(lambda: sum(g.arrived for g in rig.grpc) == n), \
                [g.arrived for g in rig.grpc]
            held = [g.arrived for g in rig.grpc]
        finally:
            for g in rig.grpc:
                g.release()
            for t in threads:
                t.join(30)
    assert not errors, errors[0]
    return held


def test_weights_follow_reported_capacity_and_share_streams(rig):
    # max_num_seqs 8 and 2 against a reference of 8: 100 % and 25 % of weight 100
    assert wait_for(lambda: rig.weights() == {"unit0": 100, "unit1": 25}), rig.weights()
    held = hold_streams(rig, rig.port, 20)
    print(f"\ncapacity-weighted (8 vs 2 sequences): streams held {held}")
    # leastconn divides streams in flight by weight: 4 to 1, i.e. 16 and 4
    assert 14 <= held[0] <= 18 and held[0] + held[1] == 20, held
    if rig.equal_port is not None:  # same units, static equal weights: an even split
        held = hold_streams(rig, rig.equal_port, 20)
        print(f"equal weights: streams held {held}")
        assert abs(held[0] - held[1]) <= 2, held


def test_weights_change_with_capacity_and_stop_at_haproxys_cap(rig):
    assert wait_for(lambda: rig.weights() == {"unit0": 100, "unit1": 25}), rig.weights()
    rig.leaders[1].metrics = capacity_metrics(16)  # an engine restarted with a larger batch
    assert wait_for(lambda: rig.weights() == {"unit0": 100, "unit1": 200}), rig.weights()
    rig.leaders[1].metrics = capacity_metrics(64)  # 8x the reference: HAProxy's max is 256
    assert wait_for(lambda: rig.weights()["unit1"] == MAX_WEIGHT_PERCENT), rig.weights()
    assert rig.agents[1].load()["weight_percent"] == MAX_WEIGHT_PERCENT
    # the KV cache bounds capacity: 64 sequences allowed, room for 4 of 1024 tokens
    rig.leaders[1].metrics = capacity_metrics(64, kv_tokens=4 * 1024)
    assert wait_for(lambda: rig.weights()["unit1"] == 50), rig.weights()


def test_haproxy_caps_agent_weights_at_256(tmp_path):
    """What the agent's clamp rests on: HAProxy 2.6 applies ``up ready N%`` as initial weight
    x N / 100 and silently clamps at 256 (a percentage above 256 on weight 100 is 256)."""
    import socketserver

    reply = {"line": "up ready 100%\n"}

    class Check(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(reply["line"].encode())

    class TCP(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    leader = FakeLeader()
    check = TCP(("127.0.0.1", 0), Check)
    threading.Thread(target=check.serve_forever, daemon=True).start()
    text = render([Backend("unit0", "127.0.0.1", free_port(), leader.port,
                           check.server_address[1])],
                  port=free_port(), stats_port=None, bind="127.0.0.1",
                  stats_socket=str(tmp_path / "haproxy.sock"), check_inter_ms=200)
    hp = HAProxy(text, tmp_path, tmp_path / "haproxy.log").start()
    try:
        seen = {}
        for pct in (150, 256, 257, 1000):
            reply["line"] = f"up ready {pct}%\n"
            want = min(pct, 256)
            ok = wait_for(lambda w=want: int(hp.servers()["unit0"]["weight"]) == w, timeout=5)
            seen[pct] = int(hp.servers()["unit0"]["weight"])
            assert ok, seen
        print(f"\nagent percentage -> HAProxy weight (initial 100): {seen}")
    finally:
        hp.stop()
        check.shutdown()
        check.server_close()
        leader.stop()
