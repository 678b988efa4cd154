"""A local fleet: N inference units, one unit agent each, HAProxy in front.

Each unit is the multi-node unit of ``rufus/launch/rig.py`` (leader tritonserver + ``python -m
follower`` processes, each its own process group) kept whole by its ``Supervisor`` (any
node lost -> the whole unit is recreated, like LeaderWorkerSet). ``nnodes=1`` gives
single-node units (one tritonserver), useful when CPU is scarce. Every process is ended by
pid / process group in :meth:`Fleet.stop`.

Used by ``make fleet`` (``python -m rufus.launch.fleet``, or scripts/fleet.py), the proxy
integration tests and the lab's fleet benchmarks (lab/fleet_bench.py adds the ``bench``
command of scripts/fleet.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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

from proxy.haproxy import Backend, HAProxy, render
from rufus.env import environ_copy
from rufus.launch.rig import MODEL, LocalUnit, Supervisor
from rufus.launch.server import ROOT, free_port

log = logging.getLogger("rufus.launch.fleet")

# Small engines: two units (four vLLM processes with followers) share this machine's cores.
FLEET_ENGINE_ARGS: dict[str, Any] = {"max_num_seqs": 8, "max_model_len": 1024}


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


@dataclass
class FleetPorts:
    """Where one unit listens. ``fixed(i)`` is the documented layout (proxy/README.md)."""

    grpc: int
    http: int
    metrics: int
    leader: int
    control: int
    follower_health: int
    agent: int
    agent_check: int

    @classmethod
    def fixed(cls, i: int) -> FleetPorts:
        b = 8100 + 10 * i
        return cls(grpc=b + 1, http=b, metrics=b + 2, leader=29500 + 10 * i,
                   control=29501 + 10 * i, follower_health=b + 3, agent=8190 + i,
                   agent_check=8290 + i)

    @classmethod
    def free(cls) -> FleetPorts:
        return cls(*(free_port() for _ in range(8)))


@dataclass
class FleetUnit:
    index: int
    unit: LocalUnit
    sup: Supervisor
    ports: FleetPorts
    agent_proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"unit{self.index}"

    @property
    def url(self) -> str:
        return self.unit.url

    def agent_env(self) -> dict[str, str]:
        return {
            "RUFUS_LEADER_HTTP": f"http://127.0.0.1:{self.unit.http_port}",
            "RUFUS_LEADER_METRICS": f"http://127.0.0.1:{self.unit.metrics_port}/metrics",
            "RUFUS_FOLLOWER_HEALTH_URLS": ",".join(
                self.unit.health_url(r) for r in range(1, self.unit.nnodes)),
            "RUFUS_UNIT_MODELS": ",".join(self.unit.models),
            "RUFUS_AGENT_PORT": str(self.ports.agent),
            "RUFUS_AGENT_CHECK_PORT": str(self.ports.agent_check),
        }

    def backend(self) -> Backend:
        return Backend(self.name, "127.0.0.1", self.unit.grpc_port, self.ports.agent,
                       self.ports.agent_check)

    def agent_health(self) -> tuple[int, dict[str, Any]]:
        url = f"http://127.0.0.1:{self.ports.agent}/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            return 0, {}

    def pgids(self) -> set[int]:
        out = {p.pid for p in self.unit.followers.values()}
        if self.unit.leader is not None and self.unit.leader.proc is not None:
            out.add(self.unit.leader.proc.pid)
        if self.agent_proc is not None:
            out.add(self.agent_proc.pid)
        return out


@dataclass
class Fleet:
    n_units: int = 2
    nnodes: int = 2
    engine_args: dict[str, Any] = field(default_factory=lambda: dict(FLEET_ENGINE_ARGS))
    log_dir: Path = Path("/tmp/rufus-fleet")
    fixed_ports: bool = False
    ingress_port: int = 0
    rr_port: int | None = None  # add a round-robin frontend (benchmark)
    # add a plain-leastconn frontend with equal static weights (the capacity benchmark's
    # baseline): same units and health as units_lor, without the agents' weights
    equal_port: int | None = None
    # per-unit engine-arg overrides over ``engine_args`` (heterogeneous units), index = unit
    unit_engine_args: list[dict[str, Any]] = field(default_factory=list)
    # models every unit's leader loads (the assistant benchmark adds the planner)
    models: list[str] = field(default_factory=lambda: [MODEL])
    stats_port: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # single-node units: each unit's process tree confined to one core (:meth:`_unit_cpus`)
    pin_units: bool = True
    first_core: int = 0  # unit i's core: the (first_core + i)-th this process may use
    # start unit i+1 only once unit i is ready (in :meth:`wait_ready`): on a small host one
    # unit compiles at a time and the next loads its compile cache, instead of every unit
    # compiling the same graphs at once on shared cores
    stagger: bool = False
    units: list[FleetUnit] = field(default_factory=list)
    haproxy: HAProxy | None = None

    def __post_init__(self) -> None:
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.ingress_port:
            self.ingress_port = 9000 if self.fixed_ports else free_port()
        if self.stats_port is None and self.fixed_ports:
            self.stats_port = 9100

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ingress_port}"

    @property
    def equal_url(self) -> str:
        if self.equal_port is None:
            raise ValueError("fleet started without an equal-weights frontend")
        return f"127.0.0.1:{self.equal_port}"

    @property
    def rr_url(self) -> str:
        if self.rr_port is None:
            raise ValueError("fleet started without a round-robin frontend")
        return f"127.0.0.1:{self.rr_port}"

    # ------------------------------------------------------------------ lifecycle
    def _unit_env(self, i: int) -> dict[str, str]:
        env = dict(self.extra_env)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.nnodes == 1:
            # one core per single-node unit, as separate hosts would have
            ncpu = os.cpu_count() or 1
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                           str((self.first_core + i) % ncpu) if ncpu > 1 else "auto")
        return env

    def _unit_cpus(self, i: int) -> tuple[int, ...] | None:
        """A single-node unit's whole process tree on its own core (its planner too, not
        only vLLM's worker), as a host of its own would be: otherwise the planner's threads
        follow idle cores into the other unit's and stall behind its busy-polling engine
        (plans of 3-6 s at a 1 s median, docs/benchmarks-history.md "Conversation affinity")."""
        cpus = sorted(os.sched_getaffinity(0))
        if not self.pin_units or self.nnodes != 1 or len(cpus) < 2:
            return None
        return (cpus[(self.first_core + i) % len(cpus)],)

    def start(self) -> Fleet:
        """Start units (their supervisors), agents and HAProxy; returns at once."""
        args = dict(self.engine_args)
        if self.nnodes > 1:
            args.setdefault("pipeline_parallel_size", self.nnodes)
        for i in range(self.n_units):
            ports = FleetPorts.fixed(i) if self.fixed_ports else FleetPorts.free()
            unit_args = {**args, **(self.unit_engine_args[i] if i < len(self.unit_engine_args)
                                    else {})}
            unit = LocalUnit(
                nnodes=self.nnodes, engine_args=unit_args, models=list(self.models),
                log_dir=self.log_dir / f"unit{i}",
                grpc_port=ports.grpc, http_port=ports.http, metrics_port=ports.metrics,
                leader_port=ports.leader, control_port=ports.control,
                health_ports=[ports.follower_health + r for r in range(self.nnodes - 1)],
                extra_env=self._unit_env(i), bind_cores=self.nnodes > 1,
                leader_cpus=self._unit_cpus(i))
            fu = FleetUnit(i, unit, Supervisor(unit, start_timeout=900, drain_s=10), ports)
            self.units.append(fu)
            if not self.stagger or i == 0:
                fu.sup.start()
            self._start_agent(fu)
        cfg = render([u.backend() for u in self.units], port=self.ingress_port,
                     rr_port=self.rr_port, equal_port=self.equal_port,
                     stats_port=self.stats_port,
                     stats_socket=str(self.log_dir / "haproxy" / "haproxy.sock"),
                     bind="127.0.0.1")
        self.haproxy = HAProxy(cfg, self.log_dir / "haproxy",
                               self.log_dir / "haproxy.log").start()
        log.info("fleet: %d unit(s) x %d node(s) starting; ingress grpc %s; logs in %s",
                 self.n_units, self.nnodes, self.url, self.log_dir)
        return self

    def _start_agent(self, fu: FleetUnit) -> None:
        env = environ_copy(fu.agent_env())
        # the fleet stops HAProxy before its agents: no drain to announce
        env.setdefault("RUFUS_AGENT_DRAIN_S", "0")
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                         if env.get("PYTHONPATH") else "")
        out = open(self.log_dir / f"agent{fu.index}.log", "ab")
        try:
            fu.agent_proc = subprocess.Popen([_python(), "-m", "proxy.agent"], cwd=ROOT, env=env,
                                             stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        finally:
            out.close()

    def wait_ready(self, timeout: float = 960.0, progress_s: float = 30.0,
                   max_failed_starts: int = 3) -> float:
        """Every unit ready (its supervisor says so) and UP in HAProxy; with ``stagger``
        each unit is started here once the one before it is ready.

        Says every ``progress_s`` seconds where each unit stands (a start takes minutes on
        2 cores, and silence looked like a hang), and fails with the reason, the unit's
        ports and log tails, and the busiest processes on the host (:meth:`diagnose`) as soon
        as a unit has failed ``max_failed_starts`` starts in a row, its supervisor gave
        up, or ``timeout`` is reached: a supervisor retries a failing start for ever.
        """
        t0 = time.monotonic()
        last_note = t0
        while True:
            now = time.monotonic()
            for prev, fu in zip([None, *self.units], self.units, strict=False):
                if not fu.sup.started and (prev is None or prev.sup.ready.is_set()):
                    log.info("fleet: starting %s", fu.name)
                    fu.sup.start()
            for fu in self.units:
                failed = fu.sup.failed_starts()
                if failed >= max_failed_starts or (fu.sup.started and not fu.sup.running):
                    raise RuntimeError(f"{fu.name} does not start ({failed} failed starts in a "
                                       f"row):\n{self.diagnose()}")
            if all(fu.sup.ready.is_set() for fu in self.units) and all(
                    s == "UP" for s in self.server_status().values()):
                return now - t0
            if now - t0 >= timeout:
                raise TimeoutError(f"fleet not ready after {timeout:.0f} s:\n{self.diagnose()}")
            if progress_s and now - last_note >= progress_s:
                last_note = now
                say(f"waiting for the fleet ({now - t0:.0f} s): {self.progress()}")
            time.sleep(0.5)

    def progress(self) -> str:
        """One line: each unit's supervisor state and HAProxy's view."""
        parts = []
        for fu in self.units:
            if fu.sup.ready.is_set():
                state = "ready"
            elif not fu.sup.started:
                state = "not started (staggered)"
            else:
                last = fu.sup.events[-1] if fu.sup.events else None
                state = f"{last.kind} {last.detail}".strip() if last else "starting"
                state += f", {fu.unit.describe_start()}"
            parts.append(f"{fu.name}: {state}")
        try:
            parts.append(f"HAProxy {self.server_status()}")
        except (OSError, ValueError, AssertionError):
            pass
        return "; ".join(parts)

    def diagnose(self) -> str:
        """What an operator needs when the fleet does not come up: per unit the supervisor's
        events, which of its ports are not listening or held by another process, the tail
        of each node's log; then the processes using the most CPU (a leftover server from
        an earlier run starves a start on a 2-core host)."""
        lines = [self.progress()]
        for fu in self.units:
            if fu.sup.ready.is_set():
                continue
            events = [f"{e.kind} {e.detail}".strip() for e in fu.sup.events[-8:]]
            lines.append(f"{fu.name} events: {events}")
            lines.append(f"{fu.name} ports: {port_report(self._unit_ports(fu), fu.pgids())}")
            for path in sorted(fu.unit.log_dir.glob("rig-*.log")):
                lines.append(f"--- {path} (tail)")
                lines.extend(_tail(path, 15))
        lines.append(f"busiest processes: {busiest_processes()}")
        return "\n".join(lines)

    def _unit_ports(self, fu: FleetUnit) -> dict[str, int]:
        u = fu.unit
        ports = {"grpc": u.grpc_port, "http": u.http_port, "metrics": u.metrics_port,
                 "rendezvous": u.leader_port, "control": u.control_port,
                 "agent": fu.ports.agent, "agent-check": fu.ports.agent_check}
        ports.update({f"follower{r + 1} health": p for r, p in enumerate(u.health_ports)})
        return ports

    def describe(self) -> str:
        """Where everything listens, for the operator (printed by ``make fleet``)."""
        lines = [f"ingress (gRPC, least outstanding): {self.url}"]
        if self.rr_port:
            lines.append(f"ingress (gRPC, round robin):       {self.rr_url}")
        if self.equal_port:
            lines.append(f"ingress (gRPC, equal weights):     {self.equal_url}")
        if self.stats_port:
            lines.append(f"HAProxy stats: http://127.0.0.1:{self.stats_port}/stats  "
                         f"Prometheus: http://127.0.0.1:{self.stats_port}/metrics")
        for fu in self.units:
            u = fu.unit
            lines.append(f"{fu.name}: leader grpc :{u.grpc_port} http :{u.http_port} metrics "
                         f":{u.metrics_port}; followers "
                         f"{[u.health_url(r) for r in range(1, u.nnodes)]}; agent "
                         f"http://127.0.0.1:{fu.ports.agent}/health, agent-check "
                         f":{fu.ports.agent_check}")
        lines.append(f"logs: {self.log_dir}")
        return "\n".join(lines)

    def server_status(self) -> dict[str, str]:
        assert self.haproxy is not None
        return {name: row["status"] for name, row in self.haproxy.servers().items()}

    def served(self, backend: str = "units_lor") -> dict[str, int]:
        """Streams each unit has been sent since HAProxy started (stot)."""
        assert self.haproxy is not None
        return {name: int(row["stot"] or 0) for name, row in self.haproxy.servers(backend).items()}

    def stop(self) -> None:
        """HAProxy, agents, then units (SIGTERM, then SIGKILL of each process group)."""
        if self.haproxy is not None:
            self.haproxy.stop()
        for fu in self.units:
            p = fu.agent_proc
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
        threads = [threading.Thread(target=fu.sup.stop, daemon=True) for fu in self.units]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        log.info("fleet stopped")

    def pgids(self) -> set[int]:
        out: set[int] = set()
        for fu in self.units:
            out |= fu.pgids()
        if self.haproxy is not None and self.haproxy.proc is not None:
            out.add(self.haproxy.proc.pid)
        return out


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError as exc:
        return [f"(unreadable: {exc})"]


def port_report(ports: dict[str, int], own_pgids: set[int] | None = None) -> str:
    """Per named port: listening (by which process) or free. A port held by a process
    outside ``own_pgids`` is flagged: a server of this unit cannot bind it."""
    import psutil

    holders: dict[int, int | None] = {}
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr:
                holders.setdefault(c.laddr.port, c.pid)
    except (psutil.Error, OSError):
        pass
    out = []
    for name, port in ports.items():
        if port not in holders:
            out.append(f"{name} {port} free")
            continue
        pid = holders[port]
        try:
            proc = psutil.Process(pid) if pid else None
            who = f"pid {pid} {proc.name()}" if proc else "an unknown process"
            foreign = proc is not None and own_pgids is not None \
                and os.getpgid(proc.pid) not in own_pgids
        except (psutil.Error, OSError):
            who, foreign = f"pid {pid}", False
        out.append(f"{name} {port} held by {who}" + (" OUTSIDE THIS UNIT" if foreign else ""))
    return ", ".join(out)


def busiest_processes(n: int = 5, sample_s: float = 0.5) -> str:
    """The ``n`` processes using the most CPU over ``sample_s`` seconds."""
    import psutil

    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(sample_s)
    use = []
    for p in procs:
        try:
            use.append((p.cpu_percent(None), p))
        except psutil.Error:
            continue
    use.sort(key=lambda x: -x[0])
    return "; ".join(f"{pct:.0f}% pid {p.pid} {' '.join(p.info['cmdline'] or [p.info['name'] or ''])[:100]}"
                     for pct, p in use[:n])


# ---------------------------------------------------------------------------- CLI
COMMANDS = {"up": "start the fleet, print where everything listens; Ctrl-C stops all (make fleet)"}
FLEET_HELP = """
Every process started here is ended by process group on exit (Ctrl-C, SIGTERM, or an error).

environment: the units read the serving variables of docs/configuration.md, e.g.
  RUFUS_ENGINE_ARGS
"""


def say(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


def build_fleet(a: argparse.Namespace, rr: bool = False) -> Fleet:
    fleet = Fleet(n_units=a.units, nnodes=a.nnodes, log_dir=Path(a.log_dir),
                  fixed_ports=a.fixed_ports,
                  rr_port=(9001 if a.fixed_ports else free_port()) if rr else None)
    if a.engine_args:
        fleet.engine_args.update(json.loads(a.engine_args))
    return fleet


def cmd_up(a: argparse.Namespace) -> int:
    fleet = build_fleet(a)
    stop = {"flag": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    try:
        fleet.start()
        say("starting (first engine start compiles: 1-3 minutes on 2 cores)\n" + fleet.describe())
        t0 = time.monotonic()
        while not stop["flag"]:
            st = fleet.server_status()
            if all(s == "UP" for s in st.values()):
                say(f"all units UP after {time.monotonic() - t0:.0f} s. Try:\n"
                    f"  .venv/bin/python -m rufus.client --url {fleet.url} "
                    f"\"What should I pack for a beach trip?\"\nCtrl-C stops everything.")
                break
            time.sleep(1)
        last: dict[str, str] = {}
        while not stop["flag"]:
            st = fleet.server_status()
            if st != last:
                say(f"HAProxy sees {st}")
                last = st
            time.sleep(1)
    finally:
        say("stopping HAProxy, agents and units")
        fleet.stop()
    return 0


def parser(commands: dict[str, str] = COMMANDS, prog: str = "python -m rufus.launch.fleet"
           ) -> argparse.ArgumentParser:
    """The fleet's options and its ``commands`` (name -> one line of help): the first is
    the default. The lab adds its own command and options (lab/fleet_bench.py)."""
    lines = "".join(f"  {name:<7} {text}\n" for name, text in commands.items())
    ap = argparse.ArgumentParser(
        prog=prog, epilog="commands:\n" + lines + FLEET_HELP,
        description="A local fleet: N inference units + unit agents + HAProxy on this machine.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default=next(iter(commands)), choices=list(commands))
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--nnodes", type=_positive, default=2,
                    help="nodes per unit (leader + followers); 1 = single-node units "
                         "(default: 2)")
    ap.add_argument("--fixed-ports", action="store_true",
                    help="documented ports (ingress 9000, RR 9001, stats 9100, unit i at 8100+10i)")
    ap.add_argument("--engine-args", default="", help="JSON engine-arg overrides for every unit")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-fleet"))
    return ap


def _positive(raw: str) -> int:
    """An argparse type: a whole number >= 1 (the message names the value)."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number >= 1, not {raw[:20]!r}")
    return n


def parse(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and set up logging."""
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return a


def main(argv: list[str] | None = None) -> int:
    return cmd_up(parse(parser(), argv))


if __name__ == "__main__":
    raise SystemExit(main())
