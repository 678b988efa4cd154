"""Unit agent logic with fake nodes: health judgement, load parsing, weight, agent-check.

Fakes stand at the unit boundary (the HTTP probe function, or tiny in-thread HTTP servers
playing leader and follower); everything inside the agent is the real code.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from proxy.agent import (
    AgentConfig,
    Load,
    Snapshot,
    UnitAgent,
    agent_reply,
    http_fetch,
    judge_follower,
    parse_load,
    timed_out,
    weight_percent,
)
from rufus.launch.server import free_port

LEADER = "http://leader:8000"
METRICS_TEXT = """# HELP rufus_requests_outstanding x
# TYPE rufus_requests_outstanding gauge
rufus_requests_outstanding{model="rufus_llm",version="1"} 5
rufus_requests_outstanding{model="rufus_qp_medusa",version="1"} 2
rufus_requests_waiting{model="rufus_llm",version="1"} 1
rufus_requests_running{model="rufus_llm",version="1"} 4
rufus_kv_cache_usage_ratio{model="rufus_llm",version="1"} 0.25
rufus_kv_cache_usage_ratio{model="rufus_qp_medusa",version="1"} 0.5
nv_inference_count{model="rufus_llm",version="1"} 99
"""


class FakeNodes:
    """The probe function: URL -> (status, body); flip entries to break nodes."""

    def __init__(self, followers: int = 1) -> None:
        self.answers: dict[str, tuple[int | None, str]] = {
            f"{LEADER}/v2/health/ready": (200, ""),
            f"{LEADER}/v2/models/rufus_llm/ready": (200, ""),
            f"{LEADER}/metrics": (200, METRICS_TEXT),
        }
        self.followers = [f"http://f{r}:8081/health" for r in range(1, followers + 1)]
        for r, url in enumerate(self.followers, 1):
            self.answers[url] = (200, json.dumps({"rank": r, "nnodes": followers + 1,
                                                  "state": "running"}))

    def __call__(self, url: str, timeout: float) -> tuple[int | None, str]:
        return self.answers.get(url, (None, "ConnectionRefusedError: refused"))


def make_agent(nodes: FakeNodes, **kw) -> UnitAgent:
    cfg = AgentConfig(leader_http=LEADER, leader_metrics=f"{LEADER}/metrics",
                      follower_health_urls=tuple(nodes.followers), unit="u0", **kw)
    return UnitAgent(cfg, fetch=nodes)


def test_healthy_unit():
    agent = make_agent(FakeNodes(followers=2))
    snap = agent.poll_once()
    assert snap.healthy
    code, body = agent.health()
    assert code == 200 and body["healthy"] and body["failing"] == []
    assert {n["node"] for n in body["nodes"]} >= {"leader", "follower rank 1 (f1:8081)",
                                                   "follower rank 2 (f2:8081)"}
    assert agent_reply(*agent.current()) == "up ready 80%\n"  # 1 waiting of 5 -> 4/5


@pytest.mark.parametrize("url,answer,node,words", [
    ("http://f1:8081/health", (None, "ConnectionRefusedError: refused"), "follower f1:8081",
     "unreachable"),
    ("http://f1:8081/health", (503, '{"rank": 1, "state": "failed", "detail": "leader lost"}'),
     "follower rank 1 (f1:8081)", "state failed: leader lost"),
    (f"{LEADER}/v2/models/rufus_llm/ready", (400, "model not ready"), "leader", "HTTP 400"),
    (f"{LEADER}/v2/health/ready", (None, "timed out"), "leader", "unreachable (timed out)"),
])
def test_any_failing_node_makes_the_unit_unhealthy_and_is_named(url, answer, node, words):
    nodes = FakeNodes()
    nodes.answers[url] = answer
    agent = make_agent(nodes)
    agent.poll_once()
    code, body = agent.health()
    assert code == 503 and not body["healthy"]
    assert [f["node"] for f in body["failing"]] == [node]
    assert words in body["failing"][0]["detail"]
    reply = agent_reply(*agent.current())
    assert reply.startswith("down #") and node in reply and reply.endswith("\n")
    assert reply.count("\n") == 1


def test_a_slow_node_that_was_ready_gets_two_polls_of_grace_then_counts_as_failing():
    """On a busy host (a cell next door loading its models) one probe past the timeout
    must not take the unit out: with the other cell out for its update that would be every
    request failing. A node that keeps timing out is failing at the third poll."""
    nodes = FakeNodes()
    agent = make_agent(nodes)
    assert agent.poll_once().healthy
    nodes.answers[f"{LEADER}/v2/health/ready"] = (None, "timed out after 0.8 s")
    for _ in range(agent.cfg.slow_polls - 1):
        snap = agent.poll_once()
        assert snap.healthy
        assert "slow" in next(c.detail for c in snap.checks if c.check == "server ready")
    assert agent_reply(*agent.current()).startswith("up ")
    snap = agent.poll_once()
    assert not snap.healthy and "timed out" in snap.failing[0].detail
    # an answer resets the count: the next slow probe gets its grace again
    nodes.answers[f"{LEADER}/v2/health/ready"] = (200, "")
    assert agent.poll_once().healthy
    nodes.answers[f"{LEADER}/v2/health/ready"] = (None, "timed out after 0.8 s")
    assert agent.poll_once().healthy


def test_a_refusing_node_counts_at_once_and_a_never_ready_one_gets_no_grace():
    nodes = FakeNodes()
    agent = make_agent(nodes)
    assert agent.poll_once().healthy
    nodes.answers["http://f1:8081/health"] = (None, "ConnectionRefusedError: refused")
    assert not agent.poll_once().healthy
    # failing, then slow: still failing (grace is for nodes whose last answer was good)
    nodes.answers["http://f1:8081/health"] = (None, "timed out after 0.8 s")
    assert not agent.poll_once().healthy
    fresh = FakeNodes()
    fresh.answers[f"{LEADER}/v2/health/ready"] = (None, "timed out after 0.8 s")
    assert not make_agent(fresh).poll_once().healthy


def test_http_fetch_names_a_timeout_apart_from_a_refusal():
    silent = socket.socket()  # accepts (the kernel's backlog) but never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
    try:
        status, body = http_fetch(f"http://127.0.0.1:{silent.getsockname()[1]}/", 0.3)
        assert timed_out(status, body), body
        status, body = http_fetch(f"http://127.0.0.1:{closed.getsockname()[1]}/", 0.3)
        assert status is None and not timed_out(status, body), body
    finally:
        silent.close()
        closed.close()


def test_drain_reports_down_on_both_checks_and_never_stale():
    """A stopping agent says ``down`` first (HAProxy's agent health must fall to zero, or
    the recreated unit is shown UP before its first check; proxy.agent.UnitAgent.drain)."""
    agent = make_agent(FakeNodes())
    agent.poll_once()
    agent.drain()
    code, body = agent.health()
    assert code == 503 and body["failing"][0]["node"] == "agent"
    assert "draining" in body["failing"][0]["detail"] or "drained" in body["failing"][0]["detail"]
    agent.snapshot.at -= 60  # the poller may stop meanwhile: still "down #...drain", fresh
    reply = agent_reply(*agent.current())
    assert reply.startswith("down #agent: ") and "stale" not in reply


def test_missing_metrics_is_not_unhealthy_but_load_is_unknown():
    nodes = FakeNodes()
    nodes.answers[f"{LEADER}/metrics"] = (None, "refused")
    agent = make_agent(nodes)
    agent.poll_once()
    assert agent.health()[0] == 200
    load = agent.load()
    assert load["outstanding"] is None and "refused" in load["error"]
    assert load["weight_percent"] == 100


def test_stale_snapshot_reports_down():
    agent = make_agent(FakeNodes())
    agent.poll_once()
    agent.snapshot.at -= 60  # the poller has been stuck for a minute
    code, body = agent.health()
    assert code == 503 and body["failing"][-1]["node"] == "agent"
    assert agent_reply(*agent.current()) == "down #agent poll stale\n"


def test_parse_load_sums_unit_models_and_takes_max_kv():
    load = parse_load(METRICS_TEXT, ["rufus_llm", "rufus_qp_medusa"])
    assert load == Load(outstanding=7, waiting=1, running=4, kv_cache_usage=0.5)
    assert parse_load(METRICS_TEXT, ["rufus_llm"]).outstanding == 5
    with pytest.raises(ValueError, match="no rufus_"):
        parse_load("nv_inference_count 1\n", ["rufus_llm"])


@pytest.mark.parametrize("load,expected", [
    (None, 100),
    (Load(outstanding=3, running=3), 100),
    (Load(outstanding=8, running=6, waiting=2), 75),
    (Load(outstanding=2, running=0, waiting=2), 10),
    (Load(running=2, kv_cache_usage=0.9), 55),
    (Load(running=2, kv_cache_usage=1.0), 10),
    (Load(running=1, waiting=1000), 1),
    # the assistant's admission estimate against its SLO: full weight within half the SLO,
    # then down to 1 % at the SLO; admission off (SLO 0) or no estimate: load alone
    (Load(running=2, first_token_estimate_s=0.4, first_token_slo_s=1.0), 100),
    (Load(running=2, first_token_estimate_s=0.75, first_token_slo_s=1.0), 50),
    (Load(running=2, first_token_estimate_s=1.3, first_token_slo_s=1.0), 1),
    (Load(running=2, first_token_estimate_s=1.3, first_token_slo_s=0.0), 100),
    (Load(running=2, first_token_estimate_s=None, first_token_slo_s=1.0), 100),
])
def test_weight(load, expected):
    assert weight_percent(load) == expected


def test_the_agent_reads_and_exports_the_assistants_slo_estimate():
    text = METRICS_TEXT + (
        'rufus_assistant_first_token_estimate_seconds{model="rufus_assistant",version="1"} 0.8\n'
        'rufus_assistant_first_token_slo_seconds{model="rufus_assistant",version="1"} 1\n')
    load = parse_load(text, ["rufus_llm", "rufus_qp_medusa"])
    assert (load.first_token_estimate_s, load.first_token_slo_s) == (0.8, 1.0)
    assert weight_percent(load) == 40
    assert parse_load(METRICS_TEXT, ["rufus_llm"]).first_token_estimate_s is None


def test_judge_follower_without_json_body():
    c = judge_follower("http://f:1/health", 500, "<html>oops</html>")
    assert not c.ok and c.node == "follower f:1" and "HTTP 500" in c.detail


def test_config_from_env_and_poll_bound():
    cfg = AgentConfig.from_env({
        "RUFUS_LEADER_HTTP": "http://10.0.0.5:8000/", "RUFUS_FOLLOWER_HEALTH_URLS": "http://a/h, http://b/h",
        "RUFUS_UNIT_MODELS": "rufus_llm,rufus_qp_medusa", "RUFUS_AGENT_PORT": "9090"})
    assert cfg.leader_http == "http://10.0.0.5:8000" and cfg.unit == "10.0.0.5:8000"
    assert cfg.follower_health_urls == ("http://a/h", "http://b/h")
    assert cfg.models == ("rufus_llm", "rufus_qp_medusa") and cfg.port == 9090
    assert cfg.check_port == 8091 and cfg.poll_s <= 1.0
    assert cfg.leader_metrics == "http://127.0.0.1:8002/metrics"


def test_transitions_counted_and_metrics_exported():
    nodes = FakeNodes()
    agent = make_agent(nodes)
    agent.poll_once()
    nodes.answers["http://f1:8081/health"] = (None, "refused")
    agent.poll_once()
    nodes.answers["http://f1:8081/health"] = (200, '{"rank": 1, "state": "running"}')
    agent.poll_once()
    assert agent.transitions == {"healthy": 2, "unhealthy": 1}
    text = agent.metrics()
    assert 'rufus_unit_healthy{unit="u0"} 1' in text
    assert 'rufus_unit_health_transitions_total{unit="u0",to="unhealthy"} 1' in text
    assert 'rufus_unit_outstanding{unit="u0"} 5.0' in text
    assert 'rufus_unit_node_up{unit="u0",node="leader",check="server ready"} 1' in text


# ----------------------------------------------------------------------- real sockets
class _Node:
    """A tiny HTTP server playing a leader (ready + metrics) or a follower (/health)."""

    def __init__(self) -> None:
        self.status = 200
        node = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = METRICS_TEXT.encode() if self.path == "/metrics" else \
                    json.dumps({"rank": 1, "state": "running" if node.status == 200
                                else "failed"}).encode()
                self.send_response(200 if self.path == "/metrics" else node.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _get(url: str, timeout: float = 2.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _agent_check(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return s.recv(1024).decode()


def _wait_for(cond, what: str, timeout: float = 10.0) -> None:
    """An event wait with a generous bound (never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def _counting(agent: UnitAgent) -> list[Snapshot]:
    """Record every completed poll's snapshot, in order (the poll loop calls poll_once)."""
    polls: list[Snapshot] = []
    poll_once = agent.poll_once

    def counted() -> Snapshot:
        snap = poll_once()
        polls.append(snap)
        return snap

    agent.poll_once = counted  # type: ignore[method-assign]
    return polls


def test_real_endpoints_detect_a_dead_follower_on_the_next_poll():
    """With the 0.5 s default poll that is within a second; counted in polls, not seconds."""
    leader, follower = _Node(), _Node()
    cfg = AgentConfig(leader_http=f"http://127.0.0.1:{leader.port}",
                      leader_metrics=f"http://127.0.0.1:{leader.port}/metrics",
                      follower_health_urls=(f"http://127.0.0.1:{follower.port}/health",),
                      port=free_port(), check_port=free_port(), bind="127.0.0.1", poll_s=0.2,
                      unit="u0")
    agent = UnitAgent(cfg)
    polls = _counting(agent)
    agent.start()
    try:
        _wait_for(lambda: _get(f"http://127.0.0.1:{cfg.port}/health")[0] == 200, "healthy")
        assert _agent_check(cfg.check_port) == "up ready 80%\n"
        status, load = _get(f"http://127.0.0.1:{cfg.port}/load")
        assert status == 200 and load["outstanding"] == 5 and load["kv_cache_usage"] == 0.25
        with urllib.request.urlopen(f"http://127.0.0.1:{cfg.port}/metrics", timeout=2) as r:
            assert b"rufus_unit_healthy" in r.read()

        follower.close()  # the follower process is gone
        done_before = len(polls)  # poll number done_before may have probed it still alive
        _wait_for(lambda: _get(f"http://127.0.0.1:{cfg.port}/health")[0] != 200, "unhealthy")
        first_down = next(i for i, snap in enumerate(polls) if not snap.healthy)
        assert first_down <= done_before + 1, (first_down, done_before)
        status, body = _get(f"http://127.0.0.1:{cfg.port}/health")
        assert status == 503 and body["failing"][0]["node"].startswith("follower")
        assert _agent_check(cfg.check_port).startswith("down #follower")
    finally:
        agent.stop()
        leader.close()


def test_probe_of_a_hung_node_does_not_block_endpoints():
    """A node that accepts but never answers: the poll times out, and /health answers from
    the last snapshot while a probe is still stuck (held here until the test releases it)."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    port = hung.getsockname()[1]
    cfg = AgentConfig(leader_http=f"http://127.0.0.1:{port}",
                      leader_metrics=f"http://127.0.0.1:{port}/metrics", port=free_port(),
                      check_port=free_port(), bind="127.0.0.1", poll_s=0.2, probe_timeout_s=0.3)
    hang, probing, release = threading.Event(), threading.Event(), threading.Event()

    def fetch(url: str, timeout: float) -> tuple[int | None, str]:
        if hang.is_set():  # a probe that outlives any endpoint call below
            probing.set()
            release.wait(60)
        return http_fetch(url, timeout)

    agent = UnitAgent(cfg, fetch=fetch)
    polls = _counting(agent)
    agent.start()
    try:
        _wait_for(lambda: polls, "first poll (the hung node timed out)")
        hang.set()
        assert probing.wait(10), "no poll started after the first one"
        # the probe stays stuck up to 60 s: an answer within 10 s came from the snapshot
        status, body = _get(f"http://127.0.0.1:{cfg.port}/health", timeout=10)
        assert not release.is_set()
        assert status == 503 and "unreachable" in body["failing"][0]["detail"]
    finally:
        release.set()
        agent.stop()
        hung.close()


def test_empty_snapshot_is_unhealthy():
    assert not Snapshot().healthy
    assert agent_reply(Snapshot(at=time.time()), stale=False).startswith("down #")


def test_sigterm_makes_the_agent_process_answer_down_then_exit():
    """``python -m proxy.agent`` on SIGTERM (compose stop, a rolling update's drain) answers
    ``down`` to HAProxy's agent check for RUFUS_AGENT_DRAIN_S, then exits 0."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    port, check_port = free_port(), free_port()
    env = {**os.environ, "RUFUS_AGENT_PORT": str(port), "RUFUS_AGENT_CHECK_PORT": str(check_port),
           "RUFUS_LEADER_HTTP": f"http://127.0.0.1:{free_port()}", "RUFUS_AGENT_DRAIN_S": "10"}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "proxy.agent"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                return _agent_check(check_port).startswith("down #")  # no leader: down
            except OSError:
                return False
        _wait_for(listening, "agent listening", timeout=30)
        proc.send_signal(signal.SIGTERM)
        def draining() -> bool:
            try:
                return "drain" in _agent_check(check_port)
            except OSError:  # a check refused on a busy box: ask again
                return False
        # the drain lasts 10 s, so a machine busy with parallel tests still sees it
        _wait_for(draining, "a 'down #agent: ...drain' line", timeout=30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
