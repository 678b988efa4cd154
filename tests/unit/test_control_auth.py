"""Closed by default, unit level (issue 12): the multi-node control channel (only a holder of
the unit secret joins, reads are bounded, a rejection names keys not values, a bad peer fails
only its own connection; real loopback sockets, no vLLM), and the launcher's restricted-API
flags and admin key (tests/integration/test_security.py runs them against tritonserver)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rufus.launch.server import free_port
from rufus.multinode import control as unit
from rufus.multinode.topology import Topology

SECRET = b"unit-test-secret-0123456789"
FP = {"model": {"name": "m", "config_sha256": "abc"}, "max_model_len": 1024,
      "pipeline_parallel_size": 2}


def topo(rank: int = 0, control: int = 0) -> Topology:
    return Topology(2, rank, "127.0.0.1", 29500, 8081, control or free_port())


@pytest.fixture
def leader(monkeypatch):
    monkeypatch.setattr(unit, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(unit, "PEER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(unit, "HELLO_TIMEOUT_S", 1.0)
    failed: list[str] = []
    ctl = unit.LeaderControl(topo(), FP, failed.append, join_timeout=60, bind="127.0.0.1",
                             secret=SECRET).start()
    ctl.failed = failed  # type: ignore[attr-defined]
    yield ctl
    ctl.close()


def follower(ctl: unit.LeaderControl, secret: bytes = SECRET, fp: dict | None = None,
             ) -> unit.FollowerControl:
    return unit.FollowerControl(topo(1, ctl.topo.leader_control_port), fp or FP, secret)


def raw(ctl: unit.LeaderControl) -> tuple[socket.socket, dict]:
    """A bare TCP peer: connect and read the leader's challenge."""
    s = socket.create_connection(("127.0.0.1", ctl.topo.leader_control_port), timeout=3)
    return s, unit._Lines(s).read(3)


def closed_by_peer(s: socket.socket, timeout: float = 3.0) -> bytes:
    """Everything the leader sent until it closed the connection."""
    s.settimeout(timeout)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def still_open_to_good_follower(ctl: unit.LeaderControl) -> None:
    assert ctl.state == "waiting" and not ctl.failed
    f = follower(ctl)
    f.connect(wait_s=5)
    assert ctl.state == "running" and ctl.members.keys() == {1}
    f.close()


def test_wrong_secret_is_refused_and_learns_nothing(leader):
    with pytest.raises(unit.Rejected, match="authentication failed") as err:
        follower(leader, secret=b"not-the-unit-secret-000").connect(wait_s=5)
    assert "1024" not in str(err.value) and "abc" not in str(err.value)
    still_open_to_good_follower(leader)


def test_unsigned_hello_is_refused(leader):
    s, challenge = raw(leader)
    assert challenge["type"] == "challenge" and len(challenge["nonce"]) >= 32
    s.sendall((json.dumps({"type": "hello", "rank": 1, "fingerprint": FP}) + "\n").encode())
    reply = closed_by_peer(s)
    assert json.loads(reply)["reason"] == "authentication failed"
    s.close()
    still_open_to_good_follower(leader)


def test_replayed_hello_fails_against_a_fresh_challenge(leader):
    """A captured hello is bound to its challenge's nonce: replaying it does not join."""
    s, challenge = raw(leader)
    hello = {"type": "hello", "rank": 1, "nnodes": 2, "fingerprint": FP, "nonce": "ab" * 16}
    hello["mac"] = unit._mac(SECRET, "hello", challenge["nonce"], hello)
    s.close()  # the genuine exchange is abandoned; the attacker replays it
    s2, _ = raw(leader)
    s2.sendall((json.dumps(hello) + "\n").encode())
    assert json.loads(closed_by_peer(s2))["reason"] == "authentication failed"
    s2.close()
    still_open_to_good_follower(leader)


def test_mismatch_names_only_the_differing_keys(leader):
    bad = {**FP, "max_model_len": 512}
    with pytest.raises(unit.Rejected) as err:
        follower(leader, fp=bad).connect(wait_s=5)
    msg = str(err.value)
    assert "mismatch in: max_model_len" in msg
    assert "512" in msg            # the follower's own value, added on its side
    assert "1024" not in msg       # never the leader's value
    assert "abc" not in msg and "pipeline_parallel_size" not in msg
    still_open_to_good_follower(leader)


@pytest.mark.parametrize("payload", [
    b"x" * (unit.MAX_LINE + 10),                      # no newline, over the bound
    b"{not json\n",
    b"\xff\xfe\n",                                     # not UTF-8
    b"[" * 100_000 + b"\n",                            # deep nesting (RecursionError)
    b"[1, 2]\n",                                       # not an object
    b'{"type": 7}\n',                                  # type not a string
    b'{"type": "hello", "mac": 1, "nonce": []}\n',     # wrong field types
], ids=["oversized", "bad-json", "bad-utf8", "deep", "list", "type", "fields"])
def test_malformed_hello_fails_only_that_connection(leader, payload):
    s, _ = raw(leader)
    try:
        s.sendall(payload)
    except OSError:
        pass  # the leader may close while we are still sending the oversized line
    try:
        closed_by_peer(s)
    except ConnectionResetError:
        pass
    s.close()
    still_open_to_good_follower(leader)


def test_authentic_but_malformed_fields_are_refused_cleanly(leader):
    """Even a holder of the secret cannot crash the accept side with odd field types."""
    for fields in ({"rank": "1", "fingerprint": FP}, {"rank": True, "fingerprint": FP},
                   {"rank": 1, "fingerprint": ["x"]}, {"rank": 7, "fingerprint": FP}):
        s, challenge = raw(leader)
        hello = {"type": "hello", "nonce": "cd" * 16, **fields}
        hello["mac"] = unit._mac(SECRET, "hello", challenge["nonce"], hello)
        s.sendall((json.dumps(hello) + "\n").encode())
        assert json.loads(closed_by_peer(s))["type"] == "reject"
        s.close()
    still_open_to_good_follower(leader)


def test_follower_refuses_a_leader_without_the_secret():
    """Mutual: a fake leader that answers 'welcome' without the mac is not trusted."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def fake() -> None:
        conn, _ = srv.accept()
        conn.sendall(b'{"type": "challenge", "nonce": "00"}\n')
        unit._Lines(conn).read(5)
        conn.sendall(b'{"type": "welcome"}\n')
        time.sleep(1)
        conn.close()

    threading.Thread(target=fake, daemon=True).start()
    f = unit.FollowerControl(topo(1, port), FP, SECRET)
    with pytest.raises(unit.Rejected, match="without proving"):
        f.connect(wait_s=5)
    srv.close()


def test_pending_handshakes_are_bounded(leader, monkeypatch):
    silent = [socket.create_connection(("127.0.0.1", leader.topo.leader_control_port))
              for _ in range(unit.MAX_PENDING)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", leader.topo.leader_control_port))
    assert closed_by_peer(extra, timeout=3) == b""  # closed at once, no challenge
    extra.close()
    for s in silent:
        s.close()
    time.sleep(1.5)  # HELLO_TIMEOUT_S (1 s here) frees the slots
    still_open_to_good_follower(leader)


def test_secret_is_required_and_bind_is_configurable(monkeypatch):
    monkeypatch.delenv(unit.SECRET_ENV, raising=False)
    with pytest.raises(unit.UnitError, match="RUFUS_UNIT_SECRET must be set"):
        unit.unit_secret()
    monkeypatch.setenv(unit.SECRET_ENV, "short")
    with pytest.raises(unit.UnitError, match="too short"):
        unit.unit_secret()
    with pytest.raises(unit.UnitError):
        unit.LeaderControl(topo(), FP, lambda r: None)
    monkeypatch.setenv(unit.SECRET_ENV, SECRET.decode())
    monkeypatch.setenv(unit.BIND_ENV, "127.0.0.1")
    ctl = unit.LeaderControl(topo(), FP, lambda r: None)
    assert ctl._srv.getsockname()[0] == "127.0.0.1"
    ctl.close()
    assert unit.DEFAULT_BIND == "0.0.0.0"


# ----------------------------------------------------------------- launcher: restricted APIs
def test_launcher_restricts_admin_apis_and_never_shows_the_key(monkeypatch):
    from rufus.env import EnvError
    from rufus.launch import server

    monkeypatch.setattr(server, "triton_env", lambda: {"tritonserver": "/bin/true",
                                                       "backend_directory": "/b"})
    monkeypatch.setenv(server.ADMIN_KEY_ENV, "k" * 40)
    srv = server.TritonServer()
    shown, run = " ".join(srv.command()), " ".join(srv.command(reveal_key=True))
    assert srv.admin_key == "k" * 40 and srv.admin_key not in shown + repr(srv)
    assert srv.admin_key in run and "<RUFUS_ADMIN_KEY>" in shown
    for flag in ("--grpc-restricted-protocol=", "--http-restricted-api="):
        apis = run.split(flag)[1].split(":")[0].split(",")
        assert set(apis) == {"model-repository", "shared-memory", "statistics",
                             "trace", "logging"}  # health, metadata, config, inference open
    assert srv.admin_headers("http") == {"rufus-admin-key": "k" * 40}
    assert srv.admin_headers() == {"triton-grpc-protocol-rufus-admin-key": "k" * 40}
    monkeypatch.delenv(server.ADMIN_KEY_ENV)
    a, b = server.TritonServer(), server.TritonServer()
    assert a.admin_key != b.admin_key and len(a.admin_key) >= 32  # unset: random, unshared
    monkeypatch.setenv(server.ADMIN_KEY_ENV, "short")
    with pytest.raises(EnvError, match="at least 16"):
        server.TritonServer()


# ----------------------------------------------------------------- the follower process
@pytest.mark.parametrize("secret,says", [
    ("wrong-secret-0123456789abcdef", "authentication failed"),
    (None, "RUFUS_UNIT_SECRET must be set"),
], ids=["wrong-secret", "no-secret"])
def test_follower_process_without_the_secret_exits_2_before_any_vllm_work(
        leader, tmp_path, secret, says):
    """``python -m follower`` as deployed: refused (or refusing to start) with exit code 2
    (EXIT_CONFIG) and a log line naming the cause; the leader keeps waiting."""
    model_json = tmp_path / "model.json"
    model_json.write_text(json.dumps({"model": "org/model", "pipeline_parallel_size": 2}))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != unit.SECRET_ENV}
    env.update({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "127.0.0.1",
                "RUFUS_CONTROL_PORT": str(leader.topo.leader_control_port),
                "RUFUS_HEALTH_PORT": str(free_port()), "RUFUS_BIND": "127.0.0.1",
                "RUFUS_MODEL_JSON": str(model_json), "RUFUS_JOIN_WAIT_S": "10",
                "PYTHONPATH": str(root)})
    if secret:
        env[unit.SECRET_ENV] = secret
    out = subprocess.run([sys.executable, "-m", "follower"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert says in out.stderr
    if secret:
        assert secret not in out.stderr
    assert leader.state == "waiting" and not leader.failed
