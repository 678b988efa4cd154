"""A refused request is retried on another unit by the real HAProxy, before its first byte.

Two units behind the ingress's Triton HTTP frontend (proxy/haproxy.py ``render(...,
http_port=...)``, the same retry lines as the deployment's haproxy.cfg): each unit has a real
unit agent (proxy/agent.py) over a fake leader, and an HTTP generate endpoint that either
answers or refuses with 503 + ``Retry-After``, as a unit's SLO admission or full engine does.
Clients must only ever see the answers while another unit can serve them, and the refusal
itself (503, retryable) once every unit refuses.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from proxy.agent import AgentConfig, UnitAgent
from proxy.haproxy import HTTP_RETRY, Backend, HAProxy, find_haproxy, render
from rufus.launch.server import free_port
from tests.fakes import FakeLeader

pytestmark = pytest.mark.skipif(find_haproxy() is None,
                                reason="haproxy not installed (scripts/setup.sh proxy)")
MODEL = "rufus_assistant"
REFUSAL = {"error": "[UNAVAILABLE] overloaded: first answer text estimated in 1.40 s; "
                    "retry on another unit"}


class GenerateUnit:
    """A unit's Triton HTTP port: POST /v2/models/<m>/generate answers 200, or 503 with
    ``Retry-After`` while ``refusing``; every request is counted."""

    def __init__(self, refusing: bool) -> None:
        self.refusing = refusing
        self.hits = 0
        unit = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                unit.hits += 1
                if unit.refusing:
                    body, code = json.dumps(REFUSAL).encode(), 503
                else:
                    body, code = json.dumps({"model_name": MODEL, "text_output": "ok"}).encode(), 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if code == 503:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


class Rig:
    def __init__(self, tmp: Path, refusing: list[bool]) -> None:
        metrics = 'rufus_requests_outstanding{model="rufus_llm"} 0\n'
        self.leaders = [FakeLeader(metrics) for _ in refusing]
        self.units = [GenerateUnit(r) for r in refusing]
        self.agents = [UnitAgent(AgentConfig(
            leader_http=ld.url, leader_metrics=f"{ld.url}/metrics", port=free_port(),
            check_port=free_port(), bind="127.0.0.1", unit=f"fake{i}", poll_s=0.1)).start()
            for i, ld in enumerate(self.leaders)]
        backends = [Backend(f"unit{i}", "127.0.0.1", free_port(), a.cfg.port, a.cfg.check_port,
                            http_port=u.port)
                    for i, (u, a) in enumerate(zip(self.units, self.agents, strict=True))]
        self.http_port = free_port()
        text = render(backends, port=free_port(), http_port=self.http_port, stats_port=None,
                      bind="127.0.0.1", stats_socket=str(tmp / "haproxy.sock"),
                      check_inter_ms=200)
        assert all(line in text for line in HTTP_RETRY)
        self.hp = HAProxy(text, tmp, tmp / "haproxy.log")

    def up(self) -> bool:
        return all(r["status"] == "UP" for r in self.hp.servers("units_lor").values())

    def post(self) -> tuple[int, dict[str, str], str]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v2/models/{MODEL}/generate",
            data=json.dumps({"question": "wireless earbuds under $50"}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, \
                    resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()

    def stop(self) -> None:
        self.hp.stop()
        for x in (*self.agents, *self.leaders, *self.units):
            x.stop()


@pytest.fixture
def rig(tmp_path) -> Iterator[Rig]:
    r = Rig(tmp_path, [True, False])
    try:
        r.hp.start()
        deadline = time.monotonic() + 15
        while not r.up() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.up(), r.hp.servers("units_lor")
        yield r
    finally:
        r.stop()


def test_a_refusal_is_retried_on_the_other_unit_and_the_client_never_sees_it(rig):
    answers = [rig.post() for _ in range(20)]
    assert [a[0] for a in answers] == [200] * 20, answers[:3]
    assert all(json.loads(a[2])["text_output"] == "ok" for a in answers)
    # the refusing unit was tried (leastconn over idle units alternates) and each of its
    # refusals was retried on the other one
    assert rig.units[0].hits >= 5 and rig.units[1].hits == 20, \
        (rig.units[0].hits, rig.units[1].hits)


def test_when_every_unit_refuses_the_client_gets_the_retryable_refusal(rig):
    rig.units[1].refusing = True
    status, headers, body = rig.post()
    assert status == 503 and headers.get("retry-after") == "1", (status, headers)
    assert json.loads(body) == REFUSAL
    assert rig.units[0].hits + rig.units[1].hits >= 2  # tried more than one unit first
