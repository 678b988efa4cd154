"""The multi-node unit's control channel: leader <-> follower handshake and heartbeats.

vLLM's multi-node executor moves the model inputs (broadcast) and activations (Gloo), but it
does not notice a peer that disappears: measured here with vLLM 0.32, after SIGKILL of the
follower node the leader's engine blocks in ``execute_model`` for
``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s) with every stream silent; after the leader
dies, the follower's worker waits forever. So each follower keeps one TCP connection to the
leader's control port (``Topology.leader_control_port``):

1. leader -> ``challenge`` {nonce}; follower -> ``hello`` {rank, nnodes, fingerprint, nonce,
   mac}; leader -> ``welcome`` {mac} or ``reject`` (bad mac, config mismatch, duplicate
   rank, unit already failed). ``mac`` is an HMAC-SHA256 keyed by the unit's shared secret
   (``RUFUS_UNIT_SECRET``) over both nonces and the hello, so only a holder of the secret
   joins, and the follower knows it reached the real leader; the secret never travels. A
   rejection names only the differing *keys* (never the leader's values), and an
   unauthenticated peer learns nothing but "authentication failed". A mismatched follower
   exits with a clear log line instead of hanging in torch.distributed rendezvous.
2. both sides send ``ping`` every ``HEARTBEAT_S``. A process that dies has its socket closed
   by the kernel, so the peer sees EOF at once; a hung or partitioned host is caught by
   the ``PEER_TIMEOUT_S`` read timeout.
3. leader loses a follower -> ``on_fail`` (the Triton model kills its engine core, so vLLM's
   own dead-engine path ends every in-flight request, and marks the model dead -> not ready)
   and closes every other follower's connection; a follower that loses the leader exits
   non-zero. The unit is all-or-nothing; the supervisor (rig, LWS, ECS) restarts it whole.

The leader needs no list of follower addresses: followers dial in. Every read is bounded
(``MAX_LINE`` bytes, ``MAX_PENDING`` handshakes at once); a malformed message fails only its
own connection (before admission the unit is untouched; after, that member is lost). The
leader binds ``RUFUS_BIND`` (default ``0.0.0.0``: followers dial in from other hosts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rufus.env import environ
from rufus.multinode.topology import (
    BIND_ENV,  # noqa: F401 - also read from here (tests)
    DEFAULT_BIND,  # noqa: F401 - also read from here (tests)
    NODE_KEYS,
    ControlSettings,
    Topology,
    heartbeat_s,
    topology_from_env,
)
from rufus.serving.settings import read

log = logging.getLogger("rufus.multinode.control")

HEARTBEAT_S, PEER_TIMEOUT_S = heartbeat_s(ControlSettings.peer_timeout_s), ControlSettings.peer_timeout_s
HELLO_TIMEOUT_S = 10.0
MAX_LINE = 64 * 1024      # one control message; a hello with a full fingerprint is ~2 KB
MAX_PENDING = 16          # handshakes in flight; more connections are closed at once
SECRET_ENV = "RUFUS_UNIT_SECRET"
MIN_SECRET_LEN = 16


def configure(settings: ControlSettings | None = None) -> ControlSettings:
    """Read the channel's settings once, where the process starts; time its channels by them."""
    global HEARTBEAT_S, PEER_TIMEOUT_S
    s = read(ControlSettings) if settings is None else settings
    HEARTBEAT_S, PEER_TIMEOUT_S = heartbeat_s(s.peer_timeout_s), s.peer_timeout_s
    return s


class UnitError(RuntimeError):
    """The unit cannot form or has broken; the message says which node and why."""


class Rejected(UnitError):
    """The leader refused this follower (config mismatch, duplicate rank, unit failed)."""


class LeaderUnreachable(UnitError):
    """No leader answered on the control port within the wait bound."""


class ProtocolError(ValueError):
    """A peer sent something that is not a well-formed control message."""


# ----------------------------------------------------------------------- shared secret
def unit_secret(env: dict[str, str] | None = None) -> bytes:
    """The unit's shared secret (same value on every node); never logged."""
    value = (environ() if env is None else env).get(SECRET_ENV, "")
    if len(value) < MIN_SECRET_LEN:
        raise UnitError(f"{SECRET_ENV} must be set to the same secret (>= {MIN_SECRET_LEN} "
                        f"characters, e.g. `openssl rand -hex 32`) on every node of the unit "
                        f"({'too short' if value else 'unset'}); see SECURITY.md")
    return value.encode()


def _mac(secret: bytes, *parts: Any) -> str:
    """HMAC-SHA256 over a canonical JSON of ``parts`` (hex)."""
    data = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def _hello_body(hello: dict[str, Any]) -> dict[str, Any]:
    """The hello fields the mac covers (all but the mac itself)."""
    return {k: v for k, v in hello.items() if k != "mac"}


# ----------------------------------------------------------------------- fingerprint
def _model_identity(model: str) -> Any:
    """A model's identity that survives different cache paths on different hosts."""
    path = Path(model)
    cfg = path / "config.json"
    if cfg.is_file():
        return {"name": path.name, "config_sha256": hashlib.sha256(cfg.read_bytes()).hexdigest()}
    return model


def fingerprint(engine_args: dict[str, Any]) -> dict[str, Any]:
    """Everything leader and follower must agree on: engine args minus the node's own rank."""
    fp = {k: v for k, v in engine_args.items() if k not in NODE_KEYS}
    fp["model"] = _model_identity(str(engine_args.get("model", "")))
    return json.loads(json.dumps(fp, sort_keys=True, default=str))


def diff_fingerprints(leader: dict[str, Any], follower: dict[str, Any]) -> list[str]:
    """Human-readable differences, e.g. ``pipeline_parallel_size: leader 2, follower 1``
    (for the leader's own log; the follower is told :func:`differing_keys` only)."""
    out = []
    for key in sorted(set(leader) | set(follower)):
        a, b = leader.get(key, "<unset>"), follower.get(key, "<unset>")
        if a != b:
            out.append(f"{key}: leader {a!r}, follower {b!r}")
    return out


def differing_keys(leader: dict[str, Any], follower: dict[str, Any]) -> list[str]:
    """Names of the keys whose values differ: all a rejected follower is told."""
    return [k for k in sorted(set(leader) | set(follower), key=str)
            if leader.get(k, "<unset>") != follower.get(k, "<unset>")]


# ----------------------------------------------------------------------- wire format
def _send(sock: socket.socket, msg: dict[str, Any], lock: threading.Lock | None = None) -> None:
    data = (json.dumps(msg) + "\n").encode()
    if lock is None:
        sock.sendall(data)
    else:
        with lock:
            sock.sendall(data)


class _Lines:
    """Newline-delimited JSON reader with a per-message timeout and a length bound."""

    def __init__(self, sock: socket.socket, max_line: int = MAX_LINE) -> None:
        self.sock = sock
        self.buf = b""
        self.max_line = max_line

    def read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if len(self.buf) > self.max_line:
                raise ProtocolError(f"control message longer than {self.max_line} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"peer silent for {timeout:.1f} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(65536, self.max_line + 1))
            except TimeoutError as exc:
                raise TimeoutError(f"peer silent for {timeout:.1f} s") from exc
            if not chunk:
                raise ConnectionError("connection closed by peer")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        if len(line) > self.max_line:
            raise ProtocolError(f"control message longer than {self.max_line} bytes")
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, deep nesting
            raise ProtocolError(f"malformed control message ({type(exc).__name__}; "
                                f"starts {line[:40]!r})") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise ProtocolError(f"control message is not an object with a type "
                                f"(starts {line[:40]!r})")
        return msg


def _heartbeat(sock: socket.socket, reader: _Lines, lock: threading.Lock,
               stop: threading.Event) -> str:
    """Ping the peer and wait for its pings until one side stops; returns why it ended."""

    def pinger() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                _send(sock, {"type": "ping"}, lock)
            except OSError:
                return

    threading.Thread(target=pinger, name="unit-ping", daemon=True).start()
    try:
        while not stop.is_set():
            msg = reader.read(PEER_TIMEOUT_S)
            if msg.get("type") == "bye":
                return f"peer said bye: {msg.get('reason', '')}"
        return "stopped"
    except (OSError, TimeoutError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()


# ----------------------------------------------------------------------- leader side
class LeaderControl:
    """Accepts followers on the control port; reports the first loss through ``on_fail``.

    ``state``: ``waiting`` (not all followers joined) -> ``running`` -> ``failed``. A failed
    unit rejects new followers: only a restart of the whole unit makes it whole again.
    """

    def __init__(self, topo: Topology, engine_fingerprint: dict[str, Any],
                 on_fail: Callable[[str], None], *, join_timeout: float = 600.0,
                 bind: str | None = None, secret: bytes | None = None) -> None:
        self.topo = topo
        self._secret = secret if secret is not None else unit_secret()
        bind = bind or read(ControlSettings).bind
        self.bind = bind
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self.fingerprint = engine_fingerprint
        self.on_fail = on_fail
        self.join_timeout = join_timeout
        self.state = "waiting"
        self.reason = ""
        self.members: dict[int, tuple[socket.socket, threading.Event]] = {}
        self._lock = threading.Lock()
        self._srv = socket.create_server((bind, topo.leader_control_port), reuse_port=False)
        self._srv.settimeout(1.0)
        self._closed = threading.Event()

    def start(self) -> LeaderControl:
        threading.Thread(target=self._accept_loop, name="unit-accept", daemon=True).start()
        threading.Thread(target=self._join_deadline, name="unit-join-deadline",
                         daemon=True).start()
        log.info("unit leader: control channel on %s:%d (authenticated), waiting for %d "
                 "follower(s) (join timeout %.0f s)", self.bind, self.topo.leader_control_port,
                 self.topo.nnodes - 1, self.join_timeout)
        return self

    def status(self) -> dict[str, Any]:
        return {**self.topo.as_dict(), "state": self.state, "members": sorted(self.members),
                "reason": self.reason}

    def fail(self, reason: str) -> None:
        """Break the unit once: tell the owner, then drop every follower (they exit)."""
        with self._lock:
            if self.state == "failed":
                return
            self.state = "failed"
            self.reason = reason
            members = list(self.members.values())
        log.error("unit leader: unit broken: %s; failing the engine so the unit is "
                  "restarted as a whole", reason)
        try:
            self.on_fail(reason)
        except Exception:
            log.exception("unit leader: on_fail callback failed")
        for sock, stop in members:
            # bye first: once ``stop`` is set the member's heartbeat thread closes the socket,
            # and a bye sent after that never reaches the follower, which then sees only
            # "connection closed" instead of the reason (a flaky unit test showed the race)
            try:
                _send(sock, {"type": "bye", "reason": reason})
            except OSError:
                pass
            stop.set()

    def close(self) -> None:
        self._closed.set()
        self._srv.close()

    def _join_deadline(self) -> None:
        if self._closed.wait(self.join_timeout):
            return
        with self._lock:
            missing = [r for r in range(1, self.topo.nnodes) if r not in self.members]
            waiting = self.state == "waiting"
        if waiting and missing:
            self.fail(f"follower rank(s) {missing} did not join within {self.join_timeout:.0f} s"
                      f" (are they started with LWS_LEADER_ADDRESS pointing here and "
                      f"RUFUS_CONTROL_PORT={self.topo.leader_control_port}?)")

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._pending.acquire(blocking=False):
                log.warning("unit leader: %d handshakes already in progress; closing the "
                            "connection from %s", MAX_PENDING, addr[0])
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, addr), name="unit-member",
                             daemon=True).start()

    def _serve(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        """One peer: authenticate and admit it, then heartbeat until it or the unit ends.
        Anything malformed before admission closes this connection only."""
        try:
            admitted = self._handshake(conn, addr)
        except Exception as exc:  # noqa: BLE001 - a bad peer must never take the accept side down
            log.warning("unit leader: handshake with %s failed (%s: %s); closing",
                        addr[0], type(exc).__name__, str(exc)[:200])
            admitted = None
        finally:
            self._pending.release()
        if admitted is None:
            conn.close()
            return
        rank, reader, stop = admitted
        why = _heartbeat(conn, reader, threading.Lock(), stop)
        conn.close()
        if self.state != "failed":
            self.fail(f"follower rank {rank} ({addr[0]}) lost: {why}")

    def _handshake(self, conn: socket.socket, addr: tuple[str, int]
                   ) -> tuple[int, _Lines, threading.Event] | None:
        nonce = secrets.token_hex(16)
        _send(conn, {"type": "challenge", "nonce": nonce})
        reader = _Lines(conn)
        try:
            hello = reader.read(HELLO_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("unit leader: %s:%d sent no valid hello (%s); closing", addr[0],
                        addr[1], exc)
            return None
        if not self._authentic(hello, nonce):
            log.error("unit leader: connection from %s failed authentication (wrong or missing "
                      "%s?); closing", addr[0], SECRET_ENV)
            _send(conn, {"type": "reject", "reason": "authentication failed"})
            return None
        rank = hello.get("rank")
        reason, detail = self._admit(hello)
        if reason:
            log.error("unit leader: rejected follower rank %s from %s: %s", rank, addr[0],
                      detail or reason)
            _send(conn, {"type": "reject", "reason": reason})
            return None
        assert isinstance(rank, int)
        stop = threading.Event()
        with self._lock:  # re-checked under the lock: two handshakes may race for one rank
            late = ("unit already failed; restart the whole unit" if self.state == "failed"
                    else f"rank {rank} is already a member" if rank in self.members else "")
            if not late:
                self.members[rank] = (conn, stop)
                if len(self.members) == self.topo.nnodes - 1 and self.state == "waiting":
                    self.state = "running"
        if late:
            _send(conn, {"type": "reject", "reason": late})
            return None
        try:
            _send(conn, {"type": "welcome", "mac": _mac(self._secret, "welcome", nonce,
                                                        hello["nonce"], rank)})
        except OSError:  # gone before it heard the welcome: it never joined
            with self._lock:
                self.members.pop(rank, None)
                if self.state == "running":
                    self.state = "waiting"
            raise
        log.info("unit leader: follower rank %s joined from %s (pid %s); members %s, state %s",
                 rank, addr[0], hello.get("pid"), sorted(self.members), self.state)
        return rank, reader, stop

    def _authentic(self, hello: dict[str, Any], nonce: str) -> bool:
        mac, their = hello.get("mac"), hello.get("nonce")
        if not (isinstance(mac, str) and isinstance(their, str) and len(their) <= 128):
            return False
        want = _mac(self._secret, "hello", nonce, _hello_body(hello))
        return hmac.compare_digest(mac.encode(), want.encode())

    def _admit(self, hello: dict[str, Any]) -> tuple[str, str]:
        """(reason sent to the follower, detail for our log); ('', '') admits."""
        if hello.get("type") != "hello":
            return f"expected a hello, got {str(hello.get('type'))[:40]!r}", ""
        rank = hello.get("rank")
        if self.state == "failed":
            return f"unit already failed ({self.reason}); restart the whole unit", ""
        theirs = hello.get("fingerprint")
        if not isinstance(theirs, dict):
            return "hello has no engine-config fingerprint (an object)", ""
        diffs = differing_keys(self.fingerprint, theirs)
        if diffs:
            return ("engine config mismatch in: " + ", ".join(map(str, diffs[:20])),
                    "engine config mismatch: " + "; ".join(
                        diff_fingerprints(self.fingerprint, theirs))[:2000])
        if isinstance(rank, bool) or not isinstance(rank, int) \
                or not 0 < rank < self.topo.nnodes:
            return f"rank {str(rank)[:20]!r} is outside 1..{self.topo.nnodes - 1}", ""
        if rank in self.members:
            return f"rank {rank} is already a member (two followers with one rank?)", ""
        return "", ""


# ----------------------------------------------------------------------- follower side
class FollowerControl:
    """One follower's connection to the leader: bounded wait, handshake, heartbeats."""

    def __init__(self, topo: Topology, engine_fingerprint: dict[str, Any],
                 secret: bytes | None = None) -> None:
        self.topo = topo
        self.fingerprint = engine_fingerprint
        self._secret = secret if secret is not None else unit_secret()
        self.sock: socket.socket | None = None
        self.stop = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.topo.leader_addr}:{self.topo.leader_control_port}"

    def connect(self, wait_s: float, retry_s: float = 1.0) -> None:
        """Dial the leader until ``wait_s`` passes (logging each try), then handshake."""
        t0 = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                sock = socket.create_connection(
                    (self.topo.leader_addr, self.topo.leader_control_port), timeout=5.0)
                break
            except OSError as exc:
                left = wait_s - (time.monotonic() - t0)
                if left <= 0:
                    raise LeaderUnreachable(
                        f"leader control port {self.address} not reachable after "
                        f"{attempt} attempts in {wait_s:.0f} s ({exc}); is the leader "
                        "(tritonserver with LWS_WORKER_INDEX=0) running?") from exc
                if attempt == 1 or attempt % 10 == 0:
                    log.info("waiting for leader at %s (attempt %d, %s; %.0f s left)",
                             self.address, attempt, exc.strerror or exc, left)
                time.sleep(min(retry_s, max(left, 0.05)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = _Lines(sock)
        nonce = secrets.token_hex(16)
        try:
            challenge = reader.read(30.0)
            if challenge.get("type") != "challenge" or not isinstance(challenge.get("nonce"), str):
                raise ProtocolError(f"expected a challenge, got {challenge.get('type')!r}")
            hello = {"type": "hello", "rank": self.topo.node_rank, "nnodes": self.topo.nnodes,
                     "fingerprint": self.fingerprint, "pid": os.getpid(),
                     "host": socket.gethostname(), "nonce": nonce}
            hello["mac"] = _mac(self._secret, "hello", challenge["nonce"], hello)
            _send(sock, hello)
            reply = reader.read(30.0)
        except (OSError, TimeoutError, ValueError) as exc:
            sock.close()
            raise LeaderUnreachable(f"leader at {self.address} did not complete the "
                                    f"handshake: {exc}") from exc
        if reply.get("type") != "welcome":
            sock.close()
            reason = str(reply.get("reason", reply.get("type")))[:2000]
            if reason.startswith("engine config mismatch"):
                keys = [k.strip() for k in reason.partition(":")[2].split(",")]
                reason += " (this follower has " + ", ".join(
                    f"{k}={self.fingerprint.get(k, '<unset>')!r}" for k in keys) + ")"
            raise Rejected(f"leader at {self.address} rejected rank {self.topo.node_rank}: "
                           f"{reason}")
        want = _mac(self._secret, "welcome", challenge["nonce"], nonce, self.topo.node_rank)
        if not hmac.compare_digest(str(reply.get("mac", "")).encode(), want.encode()):
            sock.close()
            raise Rejected(f"the peer at {self.address} welcomed us without proving it holds "
                           f"{SECRET_ENV}: not our leader (or a different secret)")
        self.sock = sock
        self._reader = reader
        log.info("joined unit: leader %s accepted rank %d of %d", self.address,
                 self.topo.node_rank, self.topo.nnodes)

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Heartbeat in the background; ``on_lost(reason)`` when the leader goes away."""
        sock = self.sock  # set once, by connect()
        assert sock is not None

        def run() -> None:
            why = _heartbeat(sock, self._reader, threading.Lock(), self.stop)
            if why != "stopped":
                on_lost(why)

        threading.Thread(target=run, name="unit-leader-watch", daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        if self.sock is not None:
            try:
                _send(self.sock, {"type": "bye", "reason": "follower stopping"})
            except OSError:
                pass
            self.sock.close()


# ----------------------------------------------------------------------- process helpers
def kill_vllm_children(pid: int | None = None) -> list[int]:
    """SIGKILL this process's vLLM descendants (engine core, workers); returns their pids.

    Killing the engine core is how a broken unit fails fast: vLLM's own monitor then marks
    the engine dead and every in-flight ``generate`` raises ``EngineDeadError``.
    """
    import psutil

    killed: list[int] = []
    try:
        kids = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return killed
    for p in kids:
        try:
            if p.name().startswith("VLLM::"):
                os.kill(p.pid, signal.SIGKILL)
                killed.append(p.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return killed


# ----------------------------------------------------------------------- leader attach
def unit_model_name(env: dict[str, str] | None = None) -> str:
    """The one model per tritonserver whose engine spans the unit (others stay local)."""
    return (env if env is not None else environ()).get("RUFUS_UNIT_MODEL", "rufus_llm")


ABORT_POLL_S = 0.5


def abort_start(host: Any, model_name: str, limit_s: float = 1800.0) -> int:
    """The unit broke while this leader's engine was still starting: keep killing vLLM's
    processes until the start has failed. One kill is not enough: an engine core spawned
    just after it would start anyway and wait in torch.distributed's rendezvous for a
    follower the control channel now rejects ("unit already failed"), a load that never
    ends and that no supervisor restarts (seen in the compose rig's rolling update). A
    failed load ends tritonserver's start, so the node's supervisor restarts it and the
    unit forms again. Returns how many processes it killed."""
    n = 0
    deadline = time.monotonic() + limit_s
    while host.starting and time.monotonic() < deadline:
        killed = kill_vllm_children()
        if killed:
            n += len(killed)
            log.error("%s: the unit broke during the start; killed vLLM processes %s",
                      model_name, killed)
        time.sleep(ABORT_POLL_S)
    return n


def unit_topology(model_name: str, topo: Topology | None = None) -> Topology | None:
    """The unit a Triton model leads (LWS_GROUP_SIZE > 1), None if single-node; on a follower: error."""
    topo = topo or topology_from_env()
    if not topo.multi_node or model_name != unit_model_name():
        return None
    if not topo.is_leader:
        raise UnitError(f"{model_name}: tritonserver runs only on the leader (rank 0), this "
                        f"node has LWS_WORKER_INDEX={topo.node_rank}; start `python -m follower`")
    return topo


def attach_leader(model_name: str, host: Any, topo: Topology) -> LeaderControl:
    """Leader side of the unit (:func:`unit_topology`), called before the engine starts:
    opens the control channel. On a broken unit it kills the engine core (in-flight
    requests end with UNAVAILABLE through vLLM's dead-engine path) and marks the host dead
    (the model unloads itself -> not ready)."""

    def on_fail(reason: str) -> None:
        started = host.engine is not None
        killed = kill_vllm_children()
        log.error("%s: killed vLLM processes %s (%s)", model_name, killed,
                  "in-flight requests end with UNAVAILABLE" if started
                  else "engine start fails, model load fails")
        if started:
            host.mark_dead(UnitError(f"multi-node unit broken: {reason}"))
        else:
            threading.Thread(target=abort_start, args=(host, model_name), daemon=True,
                             name=f"{model_name}-abort-start").start()

    settings = configure()
    control = LeaderControl(topo, fingerprint(host.engine_args), on_fail,
                            join_timeout=settings.join_wait_s, bind=settings.bind,
                            secret=unit_secret()).start()
    log.info("%s: leader of a %d-node unit: %s", model_name, topo.nnodes,
             {k: host.engine_args.get(k) for k in ("nnodes", "node_rank", "master_addr",
                                                    "master_port", "pipeline_parallel_size",
                                                    "tensor_parallel_size")})
    return control
