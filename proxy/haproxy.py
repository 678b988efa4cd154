"""HAProxy for the data path: render its configuration for N units, run it, read its state.

Why HAProxy and not our own proxy: it is the part that every request's bytes cross, so it
must be fast, correct HTTP/2 and boring. HAProxy (Debian's 2.6) gives us, with no code:

- HTTP/2 cleartext (h2c) on both sides, so gRPC streams pass through unchanged (trailers,
  flow control, RST_STREAM on failure);
- a load-balancing decision **per HTTP/2 stream**: each gRPC call is one stream, and
  ``balance leastconn`` picks the server with the fewest streams in flight (HAProxy counts
  them itself, exactly, with no reporting lag) divided by its weight;
- active health checks (``GET /health`` on the unit agent) and the agent-check protocol, by
  which the unit agent marks its unit down at once and tunes its weight to engine-side load;
- ``retry-on conn-failure`` + ``option redispatch``: a stream whose connection to a unit
  cannot be established is sent to another unit (a unit whose tritonserver just died);
- logs, a stats socket and a Prometheus exporter.

What it cannot do, and who does it instead (see proxy/README.md):

- tell which unit is healthy from the unit's several nodes -> the unit agent (proxy/agent.py);
- retry a request after the unit *answered* it with an error (engine died, at capacity):
  the gRPC status travels inside an HTTP 200 response, and L7 retries need the whole request
  body buffered while a bidirectional gRPC stream's body never ends -> our client retries
  UNAVAILABLE before the first token (``rufus.client.generate(..., retries=N)``);
- split a tritonclient stream that carries many requests -> not done: our client opens one
  stream per request (documented contract).

    python -m proxy.haproxy --compose > proxy/haproxy/haproxy.cfg   # deployment flavor
    python -m proxy.haproxy --units 2                                # local fixed-port layout
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HAPROXY = "haproxy"


@dataclass(frozen=True)
class Backend:
    """One unit as HAProxy sees it: its leader's gRPC port and its agent's two ports."""

    name: str
    host: str
    grpc_port: int
    agent_port: int
    agent_check_port: int


def documented_units(n: int, host: str = "127.0.0.1") -> list[Backend]:
    """The fixed port layout of ``make fleet --fixed-ports`` and proxy/haproxy/haproxy.cfg:
    unit i: gRPC 8101+10i, HTTP 8100+10i, metrics 8102+10i, agent 8190+i / 8290+i."""
    return [Backend(f"unit{i}", host, 8101 + 10 * i, 8190 + i, 8290 + i) for i in range(n)]


def render(
    units: list[Backend],
    *,
    port: int = 9000,
    rr_port: int | None = None,
    stats_port: int | None = 9100,
    stats_socket: str | None = None,
    bind: str = "0.0.0.0",
    check_inter_ms: int = 1000,
    fall: int = 2,
    rise: int = 2,
) -> str:
    """haproxy.cfg text. ``rr_port`` adds a round-robin frontend over the same units
    (tracking the same health), used by the benchmark to compare policies in one run.

    Take-out time: the agent sees a failure within its poll (0.5 s, plus a probe timeout
    for a hung node) and answers ``down #<reason>`` to the next agent-check (every
    ``check_inter_ms``), which HAProxy applies at once ("DOWN (agent)"); the HTTP check
    confirms after ``fall`` failures at ``fastinter``. Worst case about 0.5 + 0.8 + 1 ~
    2.3 s, inside the 5 s budget. Put back once the agent answers ``up`` and ``rise`` HTTP
    checks pass (~1-2 s).
    Streams already open on a unit marked down are left to end on their own, on purpose:
    the leader ends them with ``[UNAVAILABLE] ...`` once its engine fails (within about a
    second of losing a node), and a leader that hangs is recreated by its supervisor, which
    closes the connection (HAProxy then resets the streams). With
    ``on-marked-down shutdown-sessions`` HAProxy won that race in our failover test and
    clients got ``CANCELLED: RST_STREAM`` instead of the leader's explicit error.
    """
    if not units:
        raise ValueError("no units to balance")
    g = ["global",
         "    log stdout format raw local0 info",
         "    maxconn 4096",
         "    # one HTTP/2 stream per gRPC request: room for many in flight per client connection",
         "    tune.h2.max-concurrent-streams 256"]
    if stats_socket:
        g.append(f"    stats socket {stats_socket} mode 600 level admin")
    out = [
        *g,
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    # log only failed/retried/redispatched streams: at thousands of requests a second",
        "    # the normal ones are noise; the Prometheus exporter has the counts",
        "    option dontlog-normal",
        "    timeout connect 1s",
        "    # a stream is idle while a request waits in the engine's queue: be generous",
        "    timeout client 10m",
        "    timeout server 10m",
        "    timeout check 800ms",
        "    timeout queue 5s",
        "    # a unit whose gRPC port refuses the connection (tritonserver just died) gets the",
        "    # stream sent to another unit; errors *inside* a gRPC stream are the client's job",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure",
        "",
        "frontend grpc_lor",
        f"    bind {bind}:{port} proto h2",
        "    default_backend units_lor",
    ]
    if rr_port is not None:
        out += ["", "frontend grpc_rr", f"    bind {bind}:{rr_port} proto h2",
                "    default_backend units_rr"]
    if stats_port is not None:
        out += ["", "frontend stats", f"    bind {bind}:{stats_port}",
                "    http-request use-service prometheus-exporter if { path /metrics }",
                "    stats enable", "    stats uri /stats", "    stats refresh 2s"]
    out += [
        "",
        "backend units_lor",
        "    # least outstanding requests: HAProxy counts in-flight streams per unit itself",
        "    balance leastconn",
        "    option httpchk",
        "    # the check goes to the unit agent (HTTP/1.1 on the server's `check port`), not to",
        "    # the h2c gRPC port: without `proto h1` here HAProxy would speak h2 to it",
        "    http-check connect default proto h1",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        f"    default-server inter {check_inter_ms}ms fastinter 500ms downinter {check_inter_ms}ms "
        f"fall {fall} rise {rise} agent-inter {check_inter_ms}ms",
    ]
    for u in units:
        out.append(f"    server {u.name} {u.host}:{u.grpc_port} proto h2 check port {u.agent_port} "
                   f"agent-check agent-port {u.agent_check_port} weight 100")
    if rr_port is not None:
        out += ["", "backend units_rr",
                "    # the baseline the benchmark compares against; same health as units_lor",
                "    balance roundrobin"]
        for u in units:
            out.append(f"    server {u.name} {u.host}:{u.grpc_port} proto h2 track units_lor/{u.name}")
    return "\n".join(out) + "\n"


def render_compose(n_units: int = 2, *, grpc_port: int = 8001, http_port: int = 8000,
                   agent_check_port: int = 8091, check_inter_ms: int = 1000) -> str:
    """The checked-in proxy/haproxy/haproxy.cfg: the deployment flavor (docker/compose.yaml).

    Addresses come from the environment HAProxy runs with (deploy/contract.py):
    ``RUFUS_UNIT<i>_GRPC`` / ``_HTTP`` / ``_AGENT``, each ``host:port``; clients reach gRPC on
    ``grpc_port`` and Triton HTTP on ``http_port`` (Triton's own ports, so clients do not
    change). The agent runs on its own host there, and HAProxy cannot split a ``host:port``
    variable into the check address and port, so health is checked on one server per unit
    *agent* (backend ``unit_health``) and the data-path servers ``track`` it: an agent
    ``down`` or a failed ``/health`` takes the unit out of both frontends at once. Trade-off:
    the agent's *weight* stays on the tracked server (HAProxy does not propagate weights), so
    here routing is plain leastconn on HAProxy's own stream counts; the local fleet, whose
    agents share the leader's host, uses :func:`render` and gets the weights too.
    """
    if n_units < 1:
        raise ValueError("no units to balance")
    out = [
        "# Rendered by `python -m proxy.haproxy --compose` (proxy/haproxy.py); do not edit by hand.",
        "# Unit addresses come from the environment: RUFUS_UNIT<i>_GRPC/_HTTP/_AGENT (host:port).",
        "global",
        "    log stdout format raw local0 info",
        "    maxconn 4096",
        "    # one HTTP/2 stream per gRPC request: room for many in flight per client connection",
        "    tune.h2.max-concurrent-streams 256",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",
        "    timeout connect 1s",
        "    # a stream is idle while a request waits in the engine's queue: be generous",
        "    timeout client 10m",
        "    timeout server 10m",
        "    timeout check 800ms",
        "    timeout queue 5s",
        "    # connection failures go to another unit; errors inside a gRPC stream are the",
        "    # client's to retry (rufus.client retries=N, before the first token only)",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure",
        "",
        "frontend grpc_lor",
        f"    bind :{grpc_port} proto h2",
        "    default_backend units_lor",
        "",
        "frontend triton_http",
        f"    bind :{http_port}",
        "    default_backend units_http",
        "",
        "backend unit_health",
        "    # one server per unit agent: GET /health (200 iff every node of the unit is ready)",
        "    # and the agent-check line ('down #why' takes the unit out at once)",
        "    option httpchk",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        f"    default-server inter {check_inter_ms}ms fastinter 500ms downinter {check_inter_ms}ms "
        f"fall 2 rise 2 agent-inter {check_inter_ms}ms",
    ]
    for i in range(n_units):
        out.append(f'    server unit{i} "${{RUFUS_UNIT{i}_AGENT}}" check agent-check '
                   f"agent-port {agent_check_port}")
    out += ["", "backend units_lor",
            "    # least outstanding requests: HAProxy counts in-flight streams per unit itself",
            "    balance leastconn"]
    for i in range(n_units):
        out.append(f'    server unit{i} "${{RUFUS_UNIT{i}_GRPC}}" proto h2 track unit_health/unit{i}')
    out += ["", "backend units_http", "    balance leastconn"]
    for i in range(n_units):
        out.append(f'    server unit{i} "${{RUFUS_UNIT{i}_HTTP}}" track unit_health/unit{i}')
    return "\n".join(out) + "\n"


def find_haproxy() -> str | None:
    return shutil.which(HAPROXY) or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None)


def check_config(cfg_path: Path) -> None:
    """``haproxy -c``: raise with HAProxy's own message if the configuration is invalid."""
    exe = find_haproxy()
    if exe is None:
        raise FileNotFoundError("haproxy not installed (scripts/setup.sh proxy installs it)")
    r = subprocess.run([exe, "-c", "-q", "-f", str(cfg_path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"haproxy rejected {cfg_path}: {r.stdout}{r.stderr}")


class HAProxy:
    """A foreground haproxy process in its own process group, ended by pid."""

    def __init__(self, cfg_text: str, workdir: Path, log_path: Path | None = None) -> None:
        self.workdir = workdir
        self.cfg_path = workdir / "haproxy.cfg"
        self.cfg_text = cfg_text
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def stats_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    def start(self) -> HAProxy:
        exe = find_haproxy()
        if exe is None:
            raise FileNotFoundError("haproxy not installed (scripts/setup.sh proxy installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cfg_path.write_text(self.cfg_text)
        check_config(self.cfg_path)
        out = open(self.log_path, "ab") if self.log_path else None
        # -db: foreground, no daemon; -W would add a master process we do not need.
        self.proc = subprocess.Popen([exe, "-db", "-f", str(self.cfg_path)], stdout=out or None,
                                     stderr=subprocess.STDOUT if out else None,
                                     start_new_session=True)
        t0 = time.monotonic()
        while not self.stats_socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode} (log {self.log_path})")
            if time.monotonic() - t0 > 10:
                raise TimeoutError("haproxy did not open its stats socket within 10 s")
            time.sleep(0.05)
        return self

    def command(self, cmd: str) -> str:
        """One command on the admin socket (``show stat``, ``show servers state``...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(str(self.stats_socket))
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode()

    def servers(self, backend: str = "units_lor") -> dict[str, dict[str, str]]:
        """Per server: status (UP/DOWN/...), scur (streams in flight), stot, weight, checks."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {r["svname"]: r for r in rows
                if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND")}

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop: finish in-flight streams
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description="Render haproxy.cfg for N units")
    ap.add_argument("--compose", action="store_true",
                    help="the deployment flavor (addresses from RUFUS_UNIT<i>_* env vars): "
                         "what proxy/haproxy/haproxy.cfg holds")
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--rr-port", type=int, default=None)
    ap.add_argument("--stats-port", type=int, default=9100)
    ap.add_argument("--stats-socket", default="/run/haproxy/rufus.sock")
    a = ap.parse_args()
    if a.compose:
        print(render_compose(a.units), end="")
        return
    print(render(documented_units(a.units, a.host), port=a.port, rr_port=a.rr_port,
                 stats_port=a.stats_port, stats_socket=a.stats_socket), end="")


if __name__ == "__main__":
    main()
