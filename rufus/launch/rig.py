"""A multi-node inference unit on one machine: leader tritonserver + follower processes.

Used by ``make rig`` (scripts/rig.py), the multi-node tests and the benchmark. Each node is
its own process group (as a container would be), started with the environment a real
deployment gives it (``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``, ...), so
the code under test is the deployed code; only the addresses are local.

Modes:

* ``loopback`` (default, used by the tests): every node on 127.0.0.1, distinct ports.
* ``netns``: each follower in its own network namespace joined to the host by a veth pair
  (10.77.<rank>.0/24), so leader <-> follower traffic (control channel, torch.distributed
  rendezvous, Gloo, vLLM's broadcast queue) really crosses an interface. Needs root and
  iproute2; the leader stays in the host namespace so clients reach Triton as usual.

:class:`Supervisor` gives the unit LeaderWorkerSet's ``RecreateGroupOnPodRestart``
semantics: when any node exits, or the leader's model stops being ready, the whole unit is
stopped and started again.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rufus.env import env_opt, env_port, env_str, environ_copy, exits_on_env_error, help_text
from rufus.launch.server import ROOT, TritonServer, free_port

log = logging.getLogger("rufus.launch.rig")

MODEL = "rufus_llm"
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"pipeline_parallel_size": 2}


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def core_binding(rank: int, nnodes: int, ncpu: int | None = None) -> str:
    """Give each node its own cores, as separate hosts would have (vLLM's OMP binding).

    With vLLM's default ("auto") every node on one machine binds its worker to core 0.
    """
    ncpu = ncpu or os.cpu_count() or 1
    if ncpu < nnodes:
        return "auto"
    per = ncpu // nnodes
    lo = rank * per
    return str(lo) if per == 1 else f"{lo}-{lo + per - 1}"


def _killpg(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Netns:
    """One follower's network namespace + veth pair (host side .1, namespace side .2)."""

    name: str
    index: int

    @property
    def host_ip(self) -> str:
        return f"10.77.{self.index}.1"

    @property
    def ns_ip(self) -> str:
        return f"10.77.{self.index}.2"

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def create(self) -> Netns:
        self.delete()
        host_if, ns_if = f"rfh{self.index}", f"rfn{self.index}"
        self._ip("netns", "add", self.name)
        self._ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        self._ip("link", "set", ns_if, "netns", self.name)
        self._ip("addr", "add", f"{self.host_ip}/24", "dev", host_if)
        self._ip("link", "set", host_if, "up")
        self._ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", ns_if)
        self._ip("netns", "exec", self.name, "ip", "link", "set", ns_if, "up")
        self._ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", f"rfh{self.index}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


@dataclass
class LocalUnit:
    """Leader (tritonserver, rank 0) + ``nnodes - 1`` followers, each a process group."""

    nnodes: int = 2
    engine_args: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_ENGINE_ARGS))
    log_dir: Path = Path("/tmp")
    mode: str = "loopback"
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    leader_port: int = field(default_factory=free_port)
    control_port: int = field(default_factory=free_port)
    health_ports: list[int] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    bind_cores: bool = True
    # cores the leader's tritonserver and its children may use (None: all)
    leader_cpus: tuple[int, ...] | None = None
    # models the leader loads (rufus_llm spans every node; the planner runs on the leader)
    models: list[str] = field(default_factory=lambda: [MODEL])
    # the control channel's shared secret (every node gets the same; SECURITY.md)
    unit_secret: str = field(repr=False, default_factory=lambda: env_opt(
        "RUFUS_UNIT_SECRET") or secrets.token_hex(32))
    leader: TritonServer | None = None
    followers: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    generation: int = 0
    _netns: dict[int, Netns] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("loopback", "netns"):
            raise ValueError(f"mode must be loopback or netns, got {self.mode!r}")
        while len(self.health_ports) < self.nnodes - 1:
            self.health_ports.append(free_port())
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ environment
    @property
    def leader_addr(self) -> str:
        return self._netns[1].host_ip if self.mode == "netns" and self._netns else "127.0.0.1"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def health_url(self, rank: int) -> str:
        host = self._netns[rank].ns_ip if self.mode == "netns" and rank in self._netns \
            else "127.0.0.1"
        return f"http://{host}:{self.health_ports[rank - 1]}/health"

    def node_env(self, rank: int) -> dict[str, str]:
        env = {
            "LWS_GROUP_SIZE": str(self.nnodes),
            "LWS_WORKER_INDEX": str(rank),
            "LWS_LEADER_ADDRESS": self.leader_addr,
            "RUFUS_LEADER_PORT": str(self.leader_port),
            "RUFUS_CONTROL_PORT": str(self.control_port),
            "RUFUS_UNIT_SECRET": self.unit_secret,
            "RUFUS_UNIT_MODEL": MODEL,
            "RUFUS_RUFUS_LLM_ENGINE_ARGS": json.dumps(self.engine_args),
            "VLLM_CPU_KVCACHE_SPACE": env_str("VLLM_CPU_KVCACHE_SPACE", "1"),
            "TOKENIZERS_PARALLELISM": "false",
        }
        if rank > 0:
            env["RUFUS_HEALTH_PORT"] = str(self.health_ports[rank - 1])
        if self.bind_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = core_binding(rank, self.nnodes)
        if self.mode == "netns" and self._netns:
            # vLLM advertises this address for its broadcast queue (get_ip()).
            env["VLLM_HOST_IP"] = self._netns[rank].ns_ip if rank else self._netns[1].host_ip
        env.update(self.extra_env)
        return env

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalUnit:
        """Start every node (leader first, as a deployment usually does; order is free)."""
        self.generation += 1
        if self.mode == "netns":
            if self.nnodes > 2:
                raise ValueError("netns mode wires one follower (nnodes=2)")
            self._netns = {1: Netns(f"rufus-f1-{os.getpid()}", 1).create()}
        self.leader = TritonServer(
            models=list(self.models), grpc_port=self.grpc_port, http_port=self.http_port,
            metrics_port=self.metrics_port, extra_env=self.node_env(0),
            log_path=self.log_dir / "rig-leader.log", cpus=self.leader_cpus)
        self.leader.start()
        for rank in range(1, self.nnodes):
            self.followers[rank] = self.start_follower(rank)
        log.info("unit generation %d started: leader pid %d, followers %s (mode %s)",
                 self.generation, self.leader.proc.pid if self.leader.proc else -1,
                 {r: p.pid for r, p in self.followers.items()}, self.mode)
        return self

    def start_follower(self, rank: int, extra_env: dict[str, str] | None = None,
                       log_name: str | None = None) -> subprocess.Popen[bytes]:
        """``python -m follower`` as its own process group (like a container)."""
        env = environ_copy(self.node_env(rank), extra_env or {})
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                         if env.get("PYTHONPATH") else "")
        cmd = [_python(), "-m", "follower"]
        if self.mode == "netns" and rank in self._netns:
            cmd = ["ip", "netns", "exec", self._netns[rank].name, *cmd]
        out = open(self.log_dir / (log_name or f"rig-follower{rank}.log"), "ab")
        try:
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    def leader_ready(self) -> bool:
        """The leader's model is loaded and its engine serves (``rufus_engine_ready``: the
        model stays loaded when its engine dies, so Triton's readiness alone stays true)."""
        return self.leader is not None and all(self.leader.serving(m) for m in self.models)

    def follower_health(self, rank: int) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.health_url(rank), timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            return 0, {}

    def wait_ready(self, timeout: float = 900.0) -> float:
        """Leader's model ready and every follower's /health 200; fail fast on an exit."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            dead = self.exited()
            if dead:
                raise RuntimeError(f"unit failed to start: {dead} (logs in {self.log_dir})")
            leader = self.leader
            stalled = leader.stalled_loads() if leader is not None else []
            if leader is not None and stalled:
                raise RuntimeError(f"unit failed to start: {leader.stall_message(stalled)}")
            if self.leader_ready() and all(self.follower_health(r)[0] == 200
                                           for r in self.followers):
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"unit not ready after {timeout:.0f} s (logs in {self.log_dir})")

    def describe_start(self) -> str:
        """Where a starting unit stands: the leader's process and models, each follower's
        health (for progress lines while a start takes minutes)."""
        if self.leader is None or self.leader.proc is None:
            parts = ["leader not started"]
        elif self.leader.proc.poll() is not None:
            parts = [f"leader exited with {self.leader.proc.returncode}"]
        else:
            waiting = [m for m in self.models if not self.leader.is_ready(m)]
            parts = [f"leader loading {', '.join(waiting)}" if waiting else "leader ready"]
        for rank in self.followers:
            status, body = self.follower_health(rank)
            parts.append(f"follower{rank} " + (f"{status} {body.get('state', '')}".strip()
                                               if status else "not answering"))
        return ", ".join(parts)

    def exited(self) -> str:
        """Which node processes have exited, with their codes ('' if none)."""
        out = []
        if self.leader is not None and self.leader.proc is not None \
                and self.leader.proc.poll() is not None:
            out.append(f"leader exited with {self.leader.proc.returncode}")
        for rank, p in self.followers.items():
            if p.poll() is not None:
                out.append(f"follower rank {rank} exited with {p.returncode}")
        return "; ".join(out)

    def kill_follower(self, rank: int = 1, sig: int = signal.SIGKILL) -> None:
        """Simulate a follower node crash: the whole process group, like a container."""
        _killpg(self.followers.get(rank), sig)

    def kill_follower_mid_stream(self, model: str = "rufus_llm",
                                 timeout: float = 120) -> tuple[float, Any]:
        """Stream a long greedy answer and crash follower 1 at its 3rd chunk (the failure
        drill of the benchmark and of the integration test): returns the monotonic time of
        the kill and the stream's :class:`~rufus.client.RequestFailed` (None if it ended
        without one)."""
        from rufus.client import RequestFailed, generate

        chunks, killed_at = 0, 0.0
        try:
            for _ in generate(self.url, model, "Tell me a long story about a shoe.", stream=True,
                              sampling={"temperature": 0.0, "max_tokens": 900,
                                        "ignore_eos": True}, timeout=timeout):
                chunks += 1
                if chunks == 3:
                    killed_at = time.monotonic()
                    self.kill_follower(1)
        except RequestFailed as exc:
            return killed_at, exc
        return killed_at, None

    def kill_leader(self, sig: int = signal.SIGKILL) -> None:
        if self.leader is not None:
            _killpg(self.leader.proc, sig)

    def stop(self) -> None:
        """End every process this unit started, by process group; remove namespaces."""
        for p in self.followers.values():
            if p.poll() is None:
                _killpg(p, signal.SIGTERM)
        if self.leader is not None:
            self.leader.stop(timeout=20)
        deadline = time.monotonic() + 10
        for p in self.followers.values():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            _killpg(p)  # stragglers in the group (vLLM workers)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                log.error("follower pid %d did not exit after SIGKILL", p.pid)
        self.followers.clear()
        for ns in self._netns.values():
            ns.delete()
        self._netns.clear()


@dataclass
class Event:
    t: float
    kind: str
    detail: str = ""


class Supervisor:
    """Keeps a :class:`LocalUnit` whole: any node lost -> stop all -> start all.

    After a node exits it waits up to ``drain_s`` for the leader to report the model not
    ready itself (so in-flight streams end with UNAVAILABLE from the leader rather than a
    reset connection), then recreates the group.
    """

    def __init__(self, unit: LocalUnit, *, start_timeout: float = 900.0, drain_s: float = 10.0,
                 max_restarts: int = 20) -> None:
        self.unit = unit
        self.start_timeout = start_timeout
        self.drain_s = drain_s
        self.max_restarts = max_restarts
        self.events: list[Event] = []
        self.restarts = 0
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._detached = threading.Event()
        self._thread: threading.Thread | None = None

    def _event(self, kind: str, detail: str = "") -> None:
        self.events.append(Event(time.monotonic(), kind, detail))
        log.info("supervisor: %s %s", kind, detail)

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._run, name="rig-supervisor", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float) -> bool:
        return self.ready.wait(timeout)

    def detach(self) -> None:
        """Stop acting on failures but leave the unit running (tests of unsupervised failure).

        The supervisor thread stays alive: tritonserver is started with PR_SET_PDEATHSIG,
        which fires when the *thread* that started it exits.
        """
        self._detached.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.unit.stop()

    def last(self, kind: str) -> Event | None:
        return next((e for e in reversed(self.events) if e.kind == kind), None)

    @property
    def running(self) -> bool:
        """The supervisor thread is alive (it ends on stop() or after too many restarts)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def failed_starts(self) -> int:
        """Starts that failed since the unit was last ready (a unit that cannot start is
        retried for ever: a caller waiting for it decides when to give up)."""
        n = 0
        for e in reversed(self.events):
            if e.kind == "ready":
                break
            n += e.kind == "start_failed"
        return n

    def _run(self) -> None:
        while not self._stop.is_set():
            self.unit.start()
            self._event("started", f"generation {self.unit.generation}")
            try:
                took = self._wait_ready()
            except Exception as exc:  # noqa: BLE001 - a failed start is a restart too
                self._event("start_failed", str(exc))
                self.unit.stop()
                if not self._backoff():
                    return
                continue
            if took is None:
                return
            self._event("ready", f"in {took:.1f} s")
            self.ready.set()
            reason = self._watch()
            self.ready.clear()
            if reason is None:
                return
            self._event("broken", reason)
            self._drain()
            self.unit.stop()
            self._event("stopped", f"generation {self.unit.generation}")
            if not self._backoff():
                return

    def _wait_ready(self) -> float | None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            try:
                return self.unit.wait_ready(timeout=min(5.0, self.start_timeout))
            except TimeoutError:
                if time.monotonic() - t0 > self.start_timeout:
                    raise
        return None

    def _watch(self) -> str | None:
        while not self._stop.wait(0.25):
            if self._detached.is_set():
                continue
            dead = self.unit.exited()
            if dead:
                return dead
            if not self.unit.leader_ready():
                # one retry: a single slow probe is not a failure
                time.sleep(0.5)
                if not self.unit.leader_ready() and not self._stop.is_set():
                    return "leader model not ready"
        return None

    def _drain(self) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.drain_s:
            leader = self.unit.leader
            if leader is None or leader.proc is None or leader.proc.poll() is not None \
                    or not self.unit.leader_ready():
                self._event("leader_not_ready", f"{time.monotonic() - t0:.2f} s after break")
                return
            time.sleep(0.1)
        self._event("drain_timeout", f"leader still ready after {self.drain_s:.0f} s")

    def _backoff(self) -> bool:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            self._event("gave_up", f"{self.restarts - 1} restarts")
            return False
        delay = min(2.0 * self.restarts, 10.0) if self.restarts > 3 else 1.0
        self._event("restarting", f"restart #{self.restarts} in {delay:.0f} s")
        return not self._stop.wait(delay)


@exits_on_env_error
def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text({
            "GRPC_PORT, HTTP_PORT, METRICS_PORT": "defaults of the leader's port options",
            "RUFUS_UNIT_SECRET": "control-channel secret shared by the nodes (random if unset)",
            "VLLM_CPU_KVCACHE_SPACE": "KV cache per node, GiB (default 1)"}))
    ap.add_argument("--nnodes", type=int, default=2)
    ap.add_argument("--mode", choices=["loopback", "netns"], default="loopback",
                    help="netns: follower in its own network namespace via a veth pair "
                         "(root + iproute2)")
    ap.add_argument("--engine-args", default=json.dumps(DEFAULT_ENGINE_ARGS),
                    help="JSON engine-arg overrides for both nodes (default: %(default)s)")
    ap.add_argument("--grpc-port", type=int, default=env_port("GRPC_PORT", 8001))
    ap.add_argument("--http-port", type=int, default=env_port("HTTP_PORT", 8000))
    ap.add_argument("--metrics-port", type=int, default=env_port("METRICS_PORT", 8002))
    ap.add_argument("--leader-port", type=int, default=29500)
    ap.add_argument("--control-port", type=int, default=29501)
    ap.add_argument("--health-port", type=int, default=8081,
                    help="first follower's /health port (rank r uses this + r - 1)")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-rig"))
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    unit = LocalUnit(
        nnodes=a.nnodes, engine_args=json.loads(a.engine_args), log_dir=Path(a.log_dir),
        mode=a.mode, grpc_port=a.grpc_port, http_port=a.http_port,
        metrics_port=a.metrics_port, leader_port=a.leader_port, control_port=a.control_port,
        health_ports=[a.health_port + i for i in range(a.nnodes - 1)])
    sup = Supervisor(unit)
    stop = {"flag": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"[rig] logs in {a.log_dir}; gRPC on {unit.url}; follower health "
          f"{[unit.health_url(r) for r in range(1, a.nnodes)]}", file=sys.stderr, flush=True)
    sup.start()
    try:
        while not stop["flag"] and sup.running:
            time.sleep(0.5)
    finally:
        print("[rig] stopping the unit", file=sys.stderr, flush=True)
        sup.stop()
    return 0 if stop["flag"] else 1

