"""Unit agent: one per multi-node inference unit, next to its leader.

It answers one question for the load balancer — *can this unit take a new request, and how
loaded is it?* — from the facts the unit's nodes publish:

- the leader's tritonserver: ``GET /v2/health/ready`` and ``GET /v2/models/<m>/ready`` for
  every model the unit serves, and each model's ``rufus_engine_ready`` gauge (a model whose
  engine died stays loaded while it replaces the engine, so the gauge covers a dead engine
  core or a follower the leader has already given up on);
- every follower's ``GET /health`` (200 only while it runs in lockstep with the leader). The
  follower is probed directly, not only through the leader, because the leader needs up to
  its peer timeout to notice a hung follower while a dead one refuses our probe at once;
- the leader's Prometheus metrics for load (outstanding, waiting, running, KV-cache usage).

The unit is healthy iff every one of those health probes passes. A background thread probes
all nodes in parallel every 0.5 s with a short timeout, so a broken unit is reported within
about one second and HAProxy (one agent ``down``, or 2 failed HTTP checks) takes it out well
inside the 5 s budget (figures: docs/benchmarks.md, "Failover"). Probe results are cached:
the endpoints below never block on the unit, so a hung leader cannot hang the load
balancer's checks.

Endpoints (``RUFUS_AGENT_PORT``, default 8090):

- ``GET /health``  200/503, JSON naming each failing node and why;
- ``GET /load``    JSON: outstanding, waiting, running, kv_cache_usage (+ weight, age);
- ``GET /metrics`` Prometheus text: ``rufus_unit_*``.

HAProxy agent protocol (``RUFUS_AGENT_CHECK_PORT``, default 8091): each TCP connection gets
one line and is closed — ``up ready 73%`` while healthy (the weight carries load HAProxy
cannot count itself: requests that reached the unit through other ingress replicas, queueing
in the engine, KV-cache pressure), ``down #<reason>`` while not (HAProxy marks it DOWN at once).

    python -m proxy.agent        # configuration from the environment only
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rufus.env import env_port, help_text

log = logging.getLogger("proxy.agent")

# A probe returns (HTTP status or None when unreachable, body text or the error).
Fetch = Callable[[str, float], tuple[int | None, str]]


# ----------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class AgentConfig:
    leader_http: str = "http://127.0.0.1:8000"
    leader_metrics: str = "http://127.0.0.1:8002/metrics"
    follower_health_urls: tuple[str, ...] = ()
    models: tuple[str, ...] = ("rufus_llm",)
    port: int = 8090
    check_port: int = 8091
    bind: str = "0.0.0.0"
    # Fixed, not configurable: the 5 s take-out budget (poll + HAProxy's 1 s checks) rests
    # on them. Tests construct faster agents directly.
    poll_s: float = 0.5
    probe_timeout_s: float = 0.8
    unit: str = ""

    @property
    def stale_after_s(self) -> float:
        """A snapshot older than this means the poller itself is stuck: report unhealthy."""
        return 3 * self.poll_s + 2 * self.probe_timeout_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentConfig:
        env = os.environ if env is None else env

        def csv(name: str, default: str) -> tuple[str, ...]:
            return tuple(x.strip() for x in env.get(name, default).split(",") if x.strip())

        leader = env.get("RUFUS_LEADER_HTTP", cls.leader_http).rstrip("/")
        return cls(
            leader_http=leader,
            leader_metrics=env.get("RUFUS_LEADER_METRICS", cls.leader_metrics),
            follower_health_urls=csv("RUFUS_FOLLOWER_HEALTH_URLS", ""),
            models=csv("RUFUS_UNIT_MODELS", "rufus_llm"),
            port=env_port("RUFUS_AGENT_PORT", cls.port, env),
            check_port=env_port("RUFUS_AGENT_CHECK_PORT", cls.check_port, env),
            unit=urlsplit(leader).netloc,
        )


# ----------------------------------------------------------------------- pure logic
@dataclass
class NodeCheck:
    """One health probe: ``node`` names the process an operator has to look at."""

    node: str
    check: str
    ok: bool
    detail: str


@dataclass
class Load:
    outstanding: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0


@dataclass
class Snapshot:
    """Everything one poll learned; endpoints answer from the latest one."""

    checks: list[NodeCheck] = field(default_factory=list)
    load: Load | None = None
    load_error: str = ""
    at: float = 0.0  # time.time() of the poll
    poll_s: float = 0.0  # how long the poll took

    @property
    def failing(self) -> list[NodeCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and not self.failing


def http_fetch(url: str, timeout: float) -> tuple[int | None, str]:
    """GET ``url``; (status, body) for any HTTP answer, (None, reason) when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace") if exc.fp else ""
        return exc.code, body
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def follower_name(url: str) -> str:
    return f"follower {urlsplit(url).netloc or url}"


def judge_leader(status: int | None, body: str, check: str) -> NodeCheck:
    if status == 200:
        return NodeCheck("leader", check, True, "ready")
    if status is None:
        return NodeCheck("leader", check, False, f"unreachable ({_short(body)})")
    return NodeCheck("leader", check, False, f"HTTP {status} {_short(body)}".strip())


def judge_follower(url: str, status: int | None, body: str) -> NodeCheck:
    """A follower is healthy only on 200; its JSON ``state``/``rank`` go into the detail."""
    name = follower_name(url)
    info: dict[str, Any] = {}
    try:
        parsed = json.loads(body) if status is not None else {}
        info = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    if "rank" in info:
        name = f"follower rank {info['rank']} ({urlsplit(url).netloc})"
    if status == 200:
        return NodeCheck(name, "health", True, str(info.get("state", "ok")))
    if status is None:
        return NodeCheck(name, "health", False, f"unreachable ({_short(body)})")
    state = info.get("state")
    detail = f"state {state}: {info.get('detail', '')}" if state else _short(body)
    return NodeCheck(name, "health", False, f"HTTP {status} {detail}".strip())


def judge_engines(text: str, models: Sequence[str]) -> list[NodeCheck]:
    """``rufus_engine_ready`` per model: a model whose engine died stays loaded (Triton's
    model readiness stays 200) while it replaces the engine, so this gauge is the check."""
    out = []
    for line in text.splitlines():
        if not line.startswith("rufus_engine_ready{"):
            continue
        head, _, value = line.rpartition(" ")
        model = dict(_labels(head)).get("model")
        if model in models:
            ok = value.strip() not in ("0", "0.0")
            out.append(NodeCheck("leader", f"engine {model}", ok,
                                 "serving" if ok else "engine down (restarting or given up)"))
    return out


def parse_load(text: str, models: Sequence[str]) -> Load:
    """Unit load from the leader's Prometheus text, summed over the unit's models.

    KV-cache usage is the maximum across models (each model has its own engine and cache;
    the fullest one is the one that will start queueing)."""
    wanted = set(models)
    sums = {"rufus_requests_outstanding": 0.0, "rufus_requests_waiting": 0.0,
            "rufus_requests_running": 0.0}
    kv = 0.0
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name not in sums and name != "rufus_kv_cache_usage_ratio":
            continue
        labels = dict(_labels(head))
        if labels.get("model") not in wanted:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        seen = True
        if name == "rufus_kv_cache_usage_ratio":
            kv = max(kv, v)
        else:
            sums[name] += v
    if not seen:
        raise ValueError(f"no rufus_* load series for models {sorted(wanted)} in the metrics")
    return Load(outstanding=sums["rufus_requests_outstanding"],
                waiting=sums["rufus_requests_waiting"],
                running=sums["rufus_requests_running"], kv_cache_usage=kv)


def _labels(head: str) -> list[tuple[str, str]]:
    if "{" not in head:
        return []
    inner = head[head.index("{") + 1: head.rindex("}")]
    out = []
    for part in inner.split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out.append((k.strip(), v.strip().strip('"')))
    return out


def weight_percent(load: Load | None, kv_soft: float = 0.8) -> int:
    """HAProxy weight (1-100 %) from the unit's own view of its load.

    HAProxy's ``leastconn`` already counts the streams *it* has open to each unit, exactly
    and without lag; the weight adds what it cannot see: (1) a queue inside the engine
    (``waiting`` > 0 means the batch is full, a new request waits for a slot: scale by
    running / (running + waiting)); (2) KV-cache pressure above ``kv_soft`` (vLLM will
    preempt soon: fall linearly to 10 % at full). Unknown load keeps full weight: load is
    advice, health decides membership.
    """
    if load is None:
        return 100
    queue = 1.0
    if load.waiting > 0:
        queue = load.running / (load.running + load.waiting) if load.running > 0 else 0.1
    kv = 1.0
    if load.kv_cache_usage > kv_soft:
        kv = 1.0 - 0.9 * min((load.kv_cache_usage - kv_soft) / (1.0 - kv_soft), 1.0)
    return max(1, min(100, round(100 * min(queue, kv))))


def agent_reply(snap: Snapshot, stale: bool) -> str:
    """One line of HAProxy's agent-check protocol for the current snapshot."""
    if stale:
        return "down #agent poll stale\n"
    if not snap.healthy:
        reason = "; ".join(f"{c.node}: {c.detail}" for c in snap.failing) or "no probe yet"
        # " #" starts HAProxy's description (shown in its stats and logs); without the
        # space HAProxy 2.6 reads the whole line as an error and ignores it
        return f"down #{_short(reason, 200).replace(chr(10), ' ')}\n"
    return f"up ready {weight_percent(snap.load)}%\n"


# ----------------------------------------------------------------------- the agent
class UnitAgent:
    """Polls the unit's nodes in the background; serves /health, /load, /metrics, agent-check."""

    def __init__(self, cfg: AgentConfig, fetch: Fetch = http_fetch) -> None:
        self.cfg = cfg
        self.fetch = fetch
        self.snapshot = Snapshot()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=4 + len(cfg.models) + len(cfg.follower_health_urls),
                                        thread_name_prefix="agent-probe")
        self._servers: list[socketserver.BaseServer] = []
        self.transitions: dict[str, int] = {"healthy": 0, "unhealthy": 0}
        self.healthy_since = 0.0
        self._was_healthy: bool | None = None
        self._last_load_error = ""
        self._last_failing: set[tuple[str, str, str]] = set()

    # ---------------------------------------------------------------- polling
    def poll_once(self) -> Snapshot:
        """Probe every node in parallel (bounded by the probe timeout) and judge the unit."""
        cfg = self.cfg
        t = cfg.probe_timeout_s
        t0 = time.monotonic()
        jobs: list[tuple[str, Any]] = [
            ("leader", self._pool.submit(self.fetch, f"{cfg.leader_http}/v2/health/ready", t)),
        ]
        for m in cfg.models:
            jobs.append((f"model:{m}", self._pool.submit(
                self.fetch, f"{cfg.leader_http}/v2/models/{m}/ready", t)))
        for url in cfg.follower_health_urls:
            jobs.append((f"follower:{url}", self._pool.submit(self.fetch, url, t)))
        metrics = self._pool.submit(self.fetch, cfg.leader_metrics, t)
        checks: list[NodeCheck] = []
        for key, fut in jobs:
            status, body = fut.result()
            if key == "leader":
                checks.append(judge_leader(status, body, "server ready"))
            elif key.startswith("model:"):
                checks.append(judge_leader(status, body, f"model {key[6:]} ready"))
            else:
                checks.append(judge_follower(key[9:], status, body))
        status, body = metrics.result()
        if status == 200:
            checks.extend(judge_engines(body, cfg.models))
        snap = Snapshot(checks=checks, at=time.time())
        if status == 200:
            try:
                snap.load = parse_load(body, cfg.models)
            except ValueError as exc:
                snap.load_error = str(exc)
        else:
            snap.load_error = f"metrics {cfg.leader_metrics}: " + (
                f"HTTP {status}" if status else _short(body))
        snap.poll_s = time.monotonic() - t0
        self._publish(snap)
        return snap

    def _publish(self, snap: Snapshot) -> None:
        with self._lock:
            self.snapshot = snap
            was = self._was_healthy
            self._was_healthy = snap.healthy
            if snap.healthy != was:
                self.transitions["healthy" if snap.healthy else "unhealthy"] += 1
                if snap.healthy:
                    self.healthy_since = snap.at
        if snap.healthy != was:
            if snap.healthy:
                log.info("unit %s HEALTHY: all %d checks pass (leader, %d model(s), %d "
                         "follower(s)); load balancer will put it back", self.cfg.unit,
                         len(snap.checks), len(self.cfg.models), len(self.cfg.follower_health_urls))
            else:
                for c in snap.failing:
                    log.warning("unit %s UNHEALTHY: %s (%s): %s -- taken out of rotation until "
                                "every node is ready again", self.cfg.unit, c.node, c.check, c.detail)
        elif not snap.healthy:
            # still unhealthy, but for other reasons (e.g. follower: waiting -> joining)
            now = {(c.node, c.check, c.detail.split(":")[0]) for c in snap.failing}
            if now != self._last_failing:
                log.info("unit %s still unhealthy: %s", self.cfg.unit,
                         "; ".join(f"{c.node}: {c.detail}" for c in snap.failing))
        self._last_failing = {(c.node, c.check, c.detail.split(":")[0]) for c in snap.failing}
        if snap.load_error and snap.load_error != self._last_load_error:
            log.warning("unit %s: no load figures (%s); reporting full weight", self.cfg.unit,
                        snap.load_error)
        self._last_load_error = snap.load_error

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # the poller must survive; staleness would report it
                log.exception("unit %s: poll failed", self.cfg.unit)
            self._stop.wait(max(self.cfg.poll_s - (time.monotonic() - t0), 0.05))

    # ---------------------------------------------------------------- views
    def current(self) -> tuple[Snapshot, bool]:
        with self._lock:
            snap = self.snapshot
        stale = (time.time() - snap.at) > self.cfg.stale_after_s
        return snap, stale

    def health(self) -> tuple[int, dict[str, Any]]:
        snap, stale = self.current()
        healthy = snap.healthy and not stale
        failing = [asdict(c) for c in snap.failing]
        if stale:
            failing.append({"node": "agent", "check": "poll", "ok": False,
                            "detail": f"last poll {time.time() - snap.at:.1f} s ago"})
        body = {
            "unit": self.cfg.unit,
            "healthy": healthy,
            "failing": failing,
            "nodes": [asdict(c) for c in snap.checks],
            "checked_at": round(snap.at, 3),
            "healthy_since": round(self.healthy_since, 3) if healthy else None,
        }
        return (200 if healthy else 503), body

    def load(self) -> dict[str, Any]:
        snap, stale = self.current()
        body: dict[str, Any] = {"unit": self.cfg.unit, "healthy": snap.healthy and not stale,
                                "age_s": round(time.time() - snap.at, 3),
                                "weight_percent": weight_percent(snap.load)}
        if snap.load is not None:
            body.update(asdict(snap.load))
        else:
            body.update({"outstanding": None, "waiting": None, "running": None,
                         "kv_cache_usage": None, "error": snap.load_error})
        return body

    def metrics(self) -> str:
        snap, stale = self.current()
        healthy = snap.healthy and not stale
        lab = f'unit="{_esc(self.cfg.unit)}"'
        lines = [
            "# HELP rufus_unit_healthy 1 if every node of the unit passes its health probe.",
            "# TYPE rufus_unit_healthy gauge",
            f"rufus_unit_healthy{{{lab}}} {int(healthy)}",
            "# HELP rufus_unit_node_up 1 per passing probe, by node and check.",
            "# TYPE rufus_unit_node_up gauge",
        ]
        for c in snap.checks:
            lines.append(f'rufus_unit_node_up{{{lab},node="{_esc(c.node)}",check="{_esc(c.check)}"}} '
                         f"{int(c.ok)}")
        lines += [
            "# HELP rufus_unit_health_transitions_total Changes of the unit's health, by new state.",
            "# TYPE rufus_unit_health_transitions_total counter",
        ]
        for to, n in self.transitions.items():
            lines.append(f'rufus_unit_health_transitions_total{{{lab},to="{to}"}} {n}')
        lines += [
            "# HELP rufus_unit_poll_age_seconds Seconds since the agent's last completed poll.",
            "# TYPE rufus_unit_poll_age_seconds gauge",
            f"rufus_unit_poll_age_seconds{{{lab}}} {time.time() - snap.at:.3f}",
            "# HELP rufus_unit_poll_duration_seconds Duration of the last poll of all nodes.",
            "# TYPE rufus_unit_poll_duration_seconds gauge",
            f"rufus_unit_poll_duration_seconds{{{lab}}} {snap.poll_s:.4f}",
            "# HELP rufus_unit_weight_percent Weight reported to HAProxy's agent-check.",
            "# TYPE rufus_unit_weight_percent gauge",
            f"rufus_unit_weight_percent{{{lab}}} {weight_percent(snap.load)}",
        ]
        if snap.load is not None:
            for name, help_, v in (
                ("outstanding", "Requests admitted and not finished on the leader.",
                 snap.load.outstanding),
                ("waiting", "Requests queued in the engine(s).", snap.load.waiting),
                ("running", "Requests running in the engine(s).", snap.load.running),
                ("kv_cache_usage_ratio", "Highest KV-cache usage among the unit's engines.",
                 snap.load.kv_cache_usage),
            ):
                lines += [f"# HELP rufus_unit_{name} {help_}", f"# TYPE rufus_unit_{name} gauge",
                          f"rufus_unit_{name}{{{lab}}} {v}"]
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------- servers
    def start(self, poll: bool = True) -> UnitAgent:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server naming
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    code, body = agent.health()
                    self._send(code, json.dumps(body).encode(), "application/json")
                elif path == "/load":
                    self._send(200, json.dumps(agent.load()).encode(), "application/json")
                elif path == "/metrics":
                    self._send(200, agent.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b'{"error": "try /health, /load or /metrics"}',
                               "application/json")

            def _send(self, code: int, data: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: Any) -> None:  # probed every second: quiet
                log.debug(fmt, *args)

        class AgentCheck(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                snap, stale = agent.current()
                try:
                    self.request.sendall(agent_reply(snap, stale).encode())
                except OSError:
                    pass

        class TCP(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        class HTTP(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # a checker that hangs up early is normal; anything else is worth a line
                log.debug("agent HTTP: error serving %s", client_address, exc_info=True)

        http = HTTP((self.cfg.bind, self.cfg.port), Handler)
        check = TCP((self.cfg.bind, self.cfg.check_port), AgentCheck)
        self._servers = [http, check]
        for srv, name in ((http, "agent-http"), (check, "agent-check")):
            threading.Thread(target=srv.serve_forever, name=name, daemon=True).start()
        if poll:
            threading.Thread(target=self._loop, name="agent-poll", daemon=True).start()
        log.info("unit agent for %s: HTTP :%d (/health /load /metrics), agent-check :%d; "
                 "leader %s, metrics %s, followers %s, models %s, poll every %.2f s",
                 self.cfg.unit, self.cfg.port, self.cfg.check_port, self.cfg.leader_http,
                 self.cfg.leader_metrics, list(self.cfg.follower_health_urls) or "none",
                 list(self.cfg.models), self.cfg.poll_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


ENVIRONMENT = {
    "RUFUS_LEADER_HTTP": "the leader's tritonserver HTTP (default http://127.0.0.1:8000)",
    "RUFUS_LEADER_METRICS": "its Prometheus metrics (default http://127.0.0.1:8002/metrics)",
    "RUFUS_FOLLOWER_HEALTH_URLS": "comma-separated follower /health URLs (default none)",
    "RUFUS_UNIT_MODELS": "comma-separated models the unit must serve (default rufus_llm)",
    "RUFUS_AGENT_PORT": "this agent's HTTP port: /health /load /metrics (default 8090)",
    "RUFUS_AGENT_CHECK_PORT": "HAProxy agent-check port (default 8091)",
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m proxy.agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Unit agent: health and load of one inference unit for the load "
                    "balancer. Configuration from the environment only.",
        epilog=help_text(ENVIRONMENT)).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = AgentConfig.from_env()
    except ValueError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    try:
        agent = UnitAgent(cfg).start()
    except OSError as exc:
        log.error("cannot listen on :%d/:%d: %s", cfg.port, cfg.check_port, exc)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("unit agent for %s stopping", cfg.unit)
    agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

