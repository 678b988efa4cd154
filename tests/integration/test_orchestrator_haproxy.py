"""The orchestrator against a real HAProxy: the global ingress config it renders is served,
the weights it sets through the runtime API are what HAProxy routes by, a failed region's
traffic stops at once and comes back gradually.

No engine: each "region" is a tiny gRPC server (Triton's ``ServerLive``, counting calls)
with a fake unit agent beside it; ports are chosen at run time, HAProxy is ended by pid.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from proxy.haproxy import Backend, HAProxy, render
from proxy.orchestrator import Orchestrator, OrchestratorConfig, RuntimeAPI, render_global
from rufus.launch.server import free_port
from tests.fakes import serve_http

HAVE_HAPROXY = shutil.which("haproxy") is not None or Path("/usr/sbin/haproxy").exists()
pytestmark = pytest.mark.skipif(not HAVE_HAPROXY, reason="haproxy not installed (scripts/setup.sh proxy)")


class Region:
    """A gRPC 'region ingress' answering ServerLive, and its one unit's agent."""

    def __init__(self) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        region = self
        self.calls = 0
        self.healthy = True
        self.lock = threading.Lock()

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            def ServerLive(self, request: Any, context: Any) -> Any:  # gRPC naming
                with region.lock:
                    region.calls += 1
                return service_pb2.ServerLiveResponse(live=True)

            def ModelStreamInfer(self, requests: Any, context: Any) -> Any:  # gRPC naming
                for req in requests:
                    with region.lock:
                        region.calls += 1
                    yield service_pb2.ModelStreamInferResponse(
                        infer_response=service_pb2.ModelInferResponse(model_name=req.model_name,
                                                                      id=req.id))

        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self.grpc)
        self.port = self.grpc.add_insecure_port("127.0.0.1:0")
        self.grpc.start()

        self.agent, self.agent_url = serve_http(self._agent)

    def _agent(self, path: str) -> tuple[int, bytes]:
        if path == "/health":
            return (200 if self.healthy else 503), json.dumps({"failing": [] if self.healthy else [
                {"node": "leader", "check": "server ready", "detail": "killed"}]}).encode()
        return 200, json.dumps({"outstanding": 1}).encode()

    def stop(self) -> None:
        self.grpc.stop(0)
        self.agent.shutdown()
        self.agent.server_close()


@pytest.fixture(scope="session")
def rig(tmp_path_factory) -> Iterator[tuple[dict[str, Region], HAProxy, Orchestrator, int]]:
    work = tmp_path_factory.mktemp("orchestrator")
    regions = {"a": Region(), "b": Region()}
    port = free_port()
    sock = work / "haproxy.sock"  # where proxy.haproxy.HAProxy waits for it
    text = render_global([(n, f"127.0.0.1:{r.port}") for n, r in regions.items()],
                         {"a": 50, "b": 50}, port=port, stats_socket=str(sock), bind="127.0.0.1")
    hp = HAProxy(text, work, work / "haproxy.log")
    orch = None
    try:  # stop() ends a process whose start() timed out, too
        hp.start()
        cfg = OrchestratorConfig.from_dict({
            "runtime_api": f"unix:{sock}", "interval_s": 0.2,
            "regions": [{"name": n, "baseline": 50, "agents": [r.agent_url]}
                        for n, r in regions.items()],
            "policy": {"return_after_rounds": 1, "return_step": 10}})
        orch = Orchestrator(cfg, decisions_log=work / "decisions.jsonl")
        yield regions, hp, orch, port
    finally:
        if orch is not None:
            orch.close()
        hp.stop()
        for r in regions.values():
            r.stop()


def live_calls(port: int, n: int) -> None:
    """``n`` ServerLive calls through the global ingress, each its own HTTP/2 stream."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        for _ in range(n):
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live


def split(regions: dict[str, Region], port: int, n: int) -> dict[str, int]:
    before = {k: r.calls for k, r in regions.items()}
    live_calls(port, n)
    return {k: r.calls - before[k] for k, r in regions.items()}


def test_weights_set_by_the_orchestrator_are_what_haproxy_routes_by(rig):
    regions, hp, orch, port = rig
    d = orch.round()
    assert d.shares == {"a": 50, "b": 50}
    assert RuntimeAPI(str(hp.stats_socket)).weights("regions") == {"a": 50, "b": 50}
    got = split(regions, port, 40)
    assert sum(got.values()) == 40 and abs(got["a"] - got["b"]) <= 4, got


def test_a_failed_region_gets_no_traffic_from_the_next_round_and_returns_gradually(rig):
    regions, hp, orch, port = rig
    regions["b"].healthy = False
    d = orch.round()
    assert d.kinds["b"] == "fail_out" and "killed" in d.reasons["b"]
    assert RuntimeAPI(str(hp.stats_socket)).weights("regions") == {"a": 100, "b": 0}
    assert split(regions, port, 20) == {"a": 20, "b": 0}
    regions["b"].healthy = True
    seen = []
    for _ in range(8):
        orch.round()
        seen.append(RuntimeAPI(str(hp.stats_socket)).weights("regions")["b"])
    assert seen[0] == 0  # up one round: not yet
    assert seen[-1] == 50 and all(b - a <= 10 for a, b in itertools.pairwise(seen)), seen
    got = split(regions, port, 40)
    assert abs(got["a"] - got["b"]) <= 4, got


def test_a_region_that_just_lost_its_units_costs_no_request(tmp_path):
    """Before the orchestrator's next round, a region whose only unit is dead still has its
    weight: its own ingress answers 503 (no server), and the global ingress sends the
    stream to another region. Streams as our client opens them: one request, half-closed."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    alive = Region()
    dead_port = free_port()  # nothing listens: the region's one unit is gone
    b_port = free_port()
    hb = HAProxy(render([Backend("unit0", "127.0.0.1", dead_port, free_port(), free_port())],
                        port=b_port, stats_port=None, stats_socket=str(tmp_path / "b" / "haproxy.sock"),
                        bind="127.0.0.1"), tmp_path / "b", tmp_path / "b.log")
    port = free_port()
    hg = HAProxy(render_global([("a", f"127.0.0.1:{alive.port}"), ("b", f"127.0.0.1:{b_port}")],
                               {"a": 50, "b": 50}, port=port,
                               stats_socket=str(tmp_path / "g" / "haproxy.sock"), bind="127.0.0.1"),
                 tmp_path / "g", tmp_path / "g.log")
    try:  # stop() ends a process whose start() timed out, too
        hb.start()
        assert wait_down(hb)
        hg.start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            for i in range(20):
                got = list(stub.ModelStreamInfer(iter([service_pb2.ModelInferRequest(
                    model_name="rufus_llm", id=str(i))]), timeout=10))
                assert got[0].infer_response.id == str(i)
        assert alive.calls == 20
        b_row = hg.servers("regions")["b"]
        assert int(b_row["wretr"] or 0) + int(b_row["wredis"] or 0) >= 1  # b was tried, and retried
    finally:
        hg.stop()
        hb.stop()
        alive.stop()


def wait_down(hp: HAProxy, timeout: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hp.servers()["unit0"]["status"].startswith("DOWN"):
            return True
        time.sleep(0.1)
    return False
