"""HAProxy for the data path: render its configuration for N units, run it, read its state.

Why HAProxy and not our own proxy: it is the part that every request's bytes cross, so it
must be fast, correct HTTP/2 and boring. HAProxy (Debian's 2.6) gives us, with no code:

- HTTP/2 cleartext (h2c) on both sides, so gRPC streams pass through unchanged (trailers,
  flow control, RST_STREAM on failure);
- closed by default: only inference, health and metadata RPCs/paths pass; anything else
  (model control, repository, shared memory, statistics, trace, logging, config) gets
  PERMISSION_DENIED (gRPC) or 403 (HTTP) from HAProxy itself; short request-header
  timeouts and per-address connection caps stop slow clients (:class:`Limits`);
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
- retry a *gRPC* request after the unit answered it with an error (SLO admission, engine
  died, at capacity): the gRPC status travels inside an HTTP 200 response, and L7 retries
  need the whole request body buffered while a bidirectional gRPC stream's body never ends
  -> our client retries UNAVAILABLE before the first token (``rufus.client.generate(...,
  retries=N)``), and the unit agent lowers the weight of a unit whose estimate nears its SLO
  so new streams go elsewhere first. On Triton HTTP, a connection failure, an empty answer
  or a 503 is retried by HAProxy on another unit (:data:`HTTP_RETRY`); the generate
  endpoint's refusals are not: that tritonserver answers every model error there with 400;
- split a tritonclient stream that carries many requests -> not done: our client opens one
  stream per request (documented contract).

    python -m proxy.compose_ingress > proxy/haproxy/haproxy.cfg     # deployment flavor
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

from rufus.wire import CONVERSATION_HEADER

HAPROXY = "haproxy"


@dataclass(frozen=True)
class Backend:
    """One unit as HAProxy sees it: its leader's gRPC port and its agent's two ports."""

    name: str
    host: str
    grpc_port: int
    agent_port: int
    agent_check_port: int
    http_port: int | None = None  # Triton HTTP, when the ingress also serves HTTP (render)


# On HTTP a unit that drops the connection, answers nothing or answers 503 before any byte
# (a unit's OpenAI frontend refusing, a proxy in front of a unit) gets the request resent to
# another unit by HAProxy itself; a gRPC refusal travels inside an HTTP 200 (trailers) and
# Triton's generate refusals as 400s: those are the client's to retry (module docstring).
HTTP_RETRY = [
    "    # a unit that drops the connection, answers nothing or refuses with 503 before any",
    "    # byte gets the request sent to another unit (redispatch)",
    "    retry-on conn-failure empty-response 503",
    "    option redispatch 1",
    "    # a retry replays the request from HAProxy's buffer: wait for the whole (small) body",
    "    # before picking a unit, or a request whose body came in a second packet is not",
    "    # retried",
    "    option http-buffer-request",
]


# Panic routing (as Envoy's panic threshold): with every unit judged down at once, which on
# a loaded host is a health-check flap far more often than a real fleet-wide outage (a
# cell next door starting starves the other's agent), the deployment config sends traffic
# to every unit regardless of health instead of answering 503 to all of it. A unit that is
# really gone refuses the connection and the request is redispatched to another; with one
# unit there is no other, so single-unit configs keep plain 503s.
PANIC_SUFFIX = "_panic"
PANIC_COMMENT = [
    "    # panic routing: only while every unit above is DOWN (a health-check flap on a",
    "    # loaded host, more often than not), each unit is tried regardless of health; one",
    "    # that is really gone refuses the connection and the request goes to the next",
]


def documented_units(n: int, host: str = "127.0.0.1") -> list[Backend]:
    """The fixed port layout of ``make fleet --fixed-ports`` and proxy/haproxy/haproxy.cfg:
    unit i: gRPC 8101+10i, HTTP 8100+10i, metrics 8102+10i, agent 8190+i / 8290+i."""
    return [Backend(f"unit{i}", host, 8101 + 10 * i, 8190 + i, 8290 + i) for i in range(n)]


@dataclass(frozen=True)
class Limits:
    """Timeouts and connection limits of the ingress (one set for every rendering).

    Slow clients vs long streams: ``http_request`` bounds how long a client may take to
    send a request's headers (HTTP/1) or its first request on a new connection (HTTP/2),
    so a slowloris client is cut after seconds; ``client``/``server`` bound *idle* time on
    an open stream (a request waiting in the engine's queue, gaps between tokens) and stay
    long, so a token stream is never cut while it makes progress. ``per_source`` caps one
    client address's concurrent connections (gRPC multiplexes: a real client needs few);
    raise it when many clients share one address (NAT, another proxy in front).
    """

    http_request: str = "10s"
    keep_alive: str = "60s"
    client: str = "10m"
    server: str = "10m"
    client_fin: str = "5s"
    connect: str = "1s"
    check: str = "800ms"
    queue: str = "5s"
    maxconn: int = 4096
    per_source: int = 256


# Conversation affinity: requests that carry the conversation key (gRPC metadata / HTTP
# header ``x-rufus-conversation``) pick a unit by consistent hashing of it, bounded: no unit
# takes more than AFFINITY_BALANCE_FACTOR % of the keyed streams' average (HAProxy's
# bounded-load consistent hashing moves the excess to the next unit on the ring), so a hot
# key spills over instead of overloading its unit. Requests without it keep least
# outstanding requests. Each policy counts its own streams: keyed and unkeyed traffic are
# each balanced, the agent's weight (engine-side load) covers what neither sees.
AFFINITY_BALANCE_FACTOR = 150


# The one balance setting: least outstanding requests. HAProxy counts the streams in
# flight per unit itself; the benchmark's round-robin frontend is its baseline only.
BALANCE = "leastconn"

# What a public client may call; everything else is refused at the ingress (SECURITY.md).
# gRPC: Triton's inference, health and metadata RPCs; metadata includes the read-only model
# config (clients such as perf_analyzer read it first, to learn that a model is decoupled).
GRPC_SERVICE = "/inference.GRPCInferenceService/"
PUBLIC_RPCS = ("ModelInfer", "ModelStreamInfer", "ServerLive", "ServerReady", "ModelReady",
               "ServerMetadata", "ModelMetadata", "ModelConfig")
# Triton HTTP: GET health/metadata/config/readiness, POST infer/generate(_stream). Model names are
# plain (no '%', no '/'), so an encoded path cannot reach another API behind an allowed one;
# /v2/models/stats is Triton's statistics API, not a model called "stats".
_MODEL = r"/v2/models/[A-Za-z0-9_.-]+(/versions/[0-9]+)?"
HTTP_READ_RE = rf"^/v2(/health/(live|ready))?$|^{_MODEL}(/ready|/config)?$"
HTTP_POST_RE = rf"^{_MODEL}/(infer|generate|generate_stream)$"
REFUSAL = "not served at this ingress: inference, health and metadata only (SECURITY.md)"


def global_section(limits: Limits, stats_socket: str | None = None) -> list[str]:
    out = ["global",
           "    log stdout format raw local0 info",
           f"    maxconn {limits.maxconn}",
           "    # one HTTP/2 stream per gRPC request: room for many in flight per client connection",
           "    tune.h2.max-concurrent-streams 256"]
    if stats_socket:
        out.append(f"    stats socket {stats_socket} mode 600 level admin")
    return out


def defaults_section(limits: Limits) -> list[str]:
    """The one defaults block of every rendering."""
    return [
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    # log only failed/retried/redispatched/refused streams: at thousands of requests a",
        "    # second the normal ones are noise; the Prometheus exporter has the counts",
        "    option dontlog-normal",
        f"    timeout connect {limits.connect}",
        "    # slow clients (slowloris): request headers, or a new connection's first request,",
        "    # within this; idle connections between requests within keep-alive",
        f"    timeout http-request {limits.http_request}",
        f"    timeout http-keep-alive {limits.keep_alive}",
        f"    timeout client-fin {limits.client_fin}",
        "    # an open stream is idle while a request waits in the engine's queue or between",
        "    # tokens: be generous, so long token streams are never cut",
        f"    timeout client {limits.client}",
        f"    timeout server {limits.server}",
        f"    timeout check {limits.check}",
        f"    timeout queue {limits.queue}",
        "    # a unit whose gRPC port refuses the connection (tritonserver just died) gets the",
        "    # stream sent to another unit; errors *inside* a gRPC stream are the client's to",
        "    # retry (rufus.client retries=N, before the first token only)",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure",
    ]


def per_source_table(limits: Limits) -> list[str]:
    """One table counting each client address's connections across every frontend."""
    return ["backend per_source",
            "    # concurrent connections per client address (all frontends together)",
            "    stick-table type ipv6 size 100k expire 60s store conn_cur"]


def _limit_lines(limits: Limits) -> list[str]:
    return ["    tcp-request connection track-sc0 src table per_source",
            f"    tcp-request connection reject if {{ sc0_conn_cur gt {limits.per_source} }}"]


def _affinity_rule(backend: str | None) -> list[str]:
    """Keyed requests (the conversation header present) go to the affinity backend."""
    if backend is None:
        return []
    return [f"    use_backend {backend} if {{ req.hdr({CONVERSATION_HEADER}) -m found }}"]


def _affinity_backend(name: str, servers: list[str], options: list[str] | None = None
                      ) -> list[str]:
    """Bounded-load consistent hashing on the conversation key over ``servers`` (lines that
    ``track`` the units' health elsewhere, so membership is decided in one place)."""
    return [f"backend {name}", *(options or []),
            "    # conversation affinity: one unit per conversation key (its prefix cache),",
            f"    # but none above {AFFINITY_BALANCE_FACTOR}% of the average keyed load (a hot key "
            "spills over)",
            f"    balance hdr({CONVERSATION_HEADER})",
            "    hash-type consistent",
            f"    hash-balance-factor {AFFINITY_BALANCE_FACTOR}",
            *servers]


def grpc_frontend(name: str, bind: str, backend: str, limits: Limits,
                   affinity: str | None = None) -> list[str]:
    """h2c frontend forwarding only the public RPCs; others get PERMISSION_DENIED (7) as a
    gRPC trailers-only response, so clients see a gRPC error, not a transport failure.
    ``affinity``: the backend for requests carrying the conversation key."""
    rpcs = " ".join(GRPC_SERVICE + r for r in PUBLIC_RPCS)
    return [f"frontend {name}",
            "    # no `proto h2`: HAProxy detects the h2c preface itself, and until then the",
            "    # connection is under `timeout http-request` (with `proto h2`, 2.6 leaves a",
            "    # connection that never sends a byte to `timeout client`: a slowloris hole)",
            f"    bind {bind}",
            *_limit_lines(limits),
            f"    acl public_rpc path {rpcs}",
            "    http-request set-var(txn.refused) bool(true) if !public_rpc",
            "    # a trailers-only gRPC response: HTTP 200, grpc-status 7 (PERMISSION_DENIED)",
            f'    http-request return status 200 hdr grpc-status 7 hdr grpc-message "{REFUSAL}" '
            "if !public_rpc",
            "    # `return` without a body drops its content-type; gRPC clients want one",
            "    http-after-response set-header content-type application/grpc "
            "if { var(txn.refused) -m bool }",
            *_affinity_rule(affinity),
            f"    default_backend {backend}"]


def _http_frontend(name: str, bind: str, backend: str, limits: Limits,
                   affinity: str | None = None) -> list[str]:
    """Triton HTTP frontend forwarding only health, metadata and inference paths; the rest
    gets 403 with a one-line reason."""
    return [f"frontend {name}",
            f"    bind {bind}",
            *_limit_lines(limits),
            "    acl read_method method GET HEAD",
            f"    acl read_path path_reg {HTTP_READ_RE}",
            "    acl triton_stats path /v2/models/stats",
            f"    acl post_path path_reg {HTTP_POST_RE}",
            "    http-request allow if read_method read_path !triton_stats",
            "    http-request allow if METH_POST post_path",
            f'    http-request return status 403 content-type text/plain string "{REFUSAL}"',
            *_affinity_rule(affinity),
            f"    default_backend {backend}"]


def _frontends(bind: str, port: int, rr_port: int | None, equal_port: int | None,
               http_port: int | None, limits: Limits) -> list[str]:
    """The data-path frontends of :func:`render`, blank-line separated: the main gRPC one
    (least outstanding requests, conversation affinity) and each optional one asked for."""
    out = grpc_frontend("grpc_lor", f"{bind}:{port}", "units_lor", limits,
                        affinity="units_affinity")
    if rr_port is not None:
        out += ["", *grpc_frontend("grpc_rr", f"{bind}:{rr_port}", "units_rr", limits)]
    if equal_port is not None:
        out += ["", *grpc_frontend("grpc_equal", f"{bind}:{equal_port}", "units_equal", limits)]
    if http_port is not None:
        out += ["", *_http_frontend("triton_http", f"{bind}:{http_port}", "units_http", limits)]
    return out


def _stats_frontend(bind: str, stats_port: int) -> list[str]:
    """HAProxy's own Prometheus exporter (``/metrics``) and stats page, on their own port,
    apart from the data path's access rules."""
    return ["frontend stats", f"    bind {bind}:{stats_port}",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    stats enable", "    stats uri /stats", "    stats refresh 2s"]


def _lor_backend(units: list[Backend], check_inter_ms: int, fall: int, rise: int
                 ) -> list[str]:
    """The one backend that health-checks the units (HTTP and agent checks on the unit
    agent); the other backends' servers track these, so membership is decided here."""
    return [
        "backend units_lor",
        "    # least outstanding requests: HAProxy counts in-flight streams per unit itself",
        f"    balance {BALANCE}",
        "    option httpchk",
        "    # the check goes to the unit agent (HTTP/1.1 on the server's `check port`), not to",
        "    # the h2c gRPC port: without `proto h1` here HAProxy would speak h2 to it",
        "    http-check connect default proto h1",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        f"    default-server inter {check_inter_ms}ms fastinter 500ms downinter {check_inter_ms}ms "
        f"fall {fall} rise {rise} agent-inter {check_inter_ms}ms",
        *(f"    server {u.name} {u.host}:{u.grpc_port} proto h2 check port {u.agent_port} "
          f"agent-check agent-port {u.agent_check_port} weight 100" for u in units),
    ]


def _tracking_backends(units: list[Backend], tracked: list[str], *, http_port: int | None,
                       rr_port: int | None, equal_port: int | None) -> list[str]:
    """The optional frontends' backends, blank-line separated, tracking units_lor's health:
    Triton HTTP (:data:`HTTP_RETRY`) and the benchmark's round-robin and equal baselines."""
    out: list[str] = []
    if http_port is not None:
        http = [f"    server {u.name} {u.host}:{u.http_port} track units_lor/{u.name}"
                for u in units if u.http_port is not None]
        out += ["", "backend units_http", f"    balance {BALANCE}", *HTTP_RETRY, *http]
    if rr_port is not None:
        out += ["", "backend units_rr",
                "    # the baseline the benchmark compares against; same health as units_lor",
                "    balance roundrobin", *tracked]
    if equal_port is not None:
        out += ["", "backend units_equal",
                "    # leastconn with equal static weights (tracked servers keep their configured",
                "    # weight, not the agent's): the capacity benchmark's baseline",
                f"    balance {BALANCE}", *tracked]
    return out


def render(
    units: list[Backend],
    *,
    port: int = 9000,
    rr_port: int | None = None,
    equal_port: int | None = None,
    http_port: int | None = None,
    stats_port: int | None = 9100,
    stats_socket: str | None = None,
    bind: str = "0.0.0.0",
    check_inter_ms: int = 1000,
    fall: int = 2,
    rise: int = 2,
    limits: Limits = Limits(),
) -> str:
    """haproxy.cfg text. ``rr_port`` adds a round-robin frontend over the same units
    (tracking the same health), used by the benchmark to compare policies in one run;
    ``equal_port`` a leastconn frontend with equal static weights (no agent weights: the
    capacity benchmark's baseline). Requests carrying the conversation key go to
    ``units_affinity`` on the main frontend (:data:`AFFINITY_BALANCE_FACTOR`). ``http_port``
    adds Triton's HTTP API over the units' ``http_port`` (a refusal retried on another unit,
    :data:`HTTP_RETRY`).

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
    out = [*global_section(limits, stats_socket), "", *defaults_section(limits), "",
           *_frontends(bind, port, rr_port, equal_port, http_port, limits)]
    if stats_port is not None:
        out += ["", *_stats_frontend(bind, stats_port)]
    out += ["", *per_source_table(limits),
            "", *_lor_backend(units, check_inter_ms, fall, rise)]
    tracked = [f"    server {u.name} {u.host}:{u.grpc_port} proto h2 track units_lor/{u.name}"
               for u in units]
    out += ["", *_affinity_backend("units_affinity", tracked)]
    out += _tracking_backends(units, tracked, http_port=http_port, rr_port=rr_port,
                              equal_port=equal_port)
    return "\n".join(out) + "\n"


# a server whose container is not up yet (or is being recreated) starts without an address
# instead of stopping HAProxy, and gets one from Docker's DNS when it appears
def runtime_exchange(sock: socket.socket, cmd: str) -> str:
    """Send one runtime-API command on a connected socket and read the reply to its end
    (HAProxy closes the connection after answering a non-interactive command)."""
    sock.sendall(cmd.encode() + b"\n")
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


def stat_servers(stat_csv: str, backend: str) -> dict[str, dict[str, str]]:
    """The servers of ``backend`` in HAProxy's stats CSV (the runtime API's ``show stat`` or
    the stats page's ``;csv``, the same format): name -> row (status, scur, weight, ...)."""
    rows = csv.DictReader(io.StringIO(stat_csv.lstrip("# ")))
    return {r["svname"]: r for r in rows
            if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND")}


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
            return runtime_exchange(s, cmd)

    def servers(self, backend: str = "units_lor") -> dict[str, dict[str, str]]:
        """Per server: status (UP/DOWN/...), scur (streams in flight), stot, weight, checks."""
        return stat_servers(self.command("show stat"), backend)

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
    ap = argparse.ArgumentParser(
        description="Render the local fleet's haproxy.cfg for N units (the deployment "
                    "flavor: python -m proxy.compose_ingress)")
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--rr-port", type=int, default=None)
    ap.add_argument("--stats-port", type=int, default=9100)
    ap.add_argument("--stats-socket", default="/run/haproxy/rufus.sock")
    a = ap.parse_args()
    print(render(documented_units(a.units, a.host), port=a.port, rr_port=a.rr_port,
                 stats_port=a.stats_port, stats_socket=a.stats_socket), end="")


if __name__ == "__main__":
    main()
