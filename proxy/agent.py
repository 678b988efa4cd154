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
- the leader's Prometheus metrics for load (outstanding, waiting, running, KV-cache usage)
  and for capacity (the ``rufus_engine_*`` gauges its engine exports from its own
  configuration: max_num_seqs, KV-cache tokens, max_model_len, nodes; :class:`Capacity`).

The unit is healthy iff every one of those health probes passes. A background thread probes
all nodes in parallel every 0.5 s with a short timeout, so a broken unit (refused, or
answering not ready) is reported within about one second, a hung one (no answer: three
timed-out polls in a row, since one slow answer on a busy host is not a failure) within
about three, and HAProxy (one agent ``down``, or 3 failed HTTP checks) takes it out inside
the 5 s budget (figures: docs/benchmarks-history.md, "Failover"). On SIGTERM the agent answers
``down`` for a few seconds before exiting (:meth:`UnitAgent.drain`). Probe results are cached:
the endpoints below never block on the unit, so a hung leader cannot hang the load
balancer's checks.

Endpoints (``RUFUS_AGENT_PORT``, default 8090):

- ``GET /health``  200/503, JSON naming each failing node and why;
- ``GET /load``    JSON: outstanding, waiting, running, kv_cache_usage, capacity (+ weight, age);
- ``GET /metrics`` Prometheus text: ``rufus_unit_*``.

HAProxy agent protocol (``RUFUS_AGENT_CHECK_PORT``, default 8091): each TCP connection gets
one line and is closed — ``up ready 73%`` while healthy, ``down #<reason>`` while not (HAProxy
marks it DOWN at once). The weight carries what HAProxy cannot count itself: the unit's size
(capacity relative to ``RUFUS_CAPACITY_REFERENCE``, so a unit that batches four times as many
sequences gets four times the streams under ``leastconn``) times its load factor (requests
that reached the unit through other ingress replicas, queueing in the engine, KV-cache
pressure); :func:`weight_percent`.

    python -m proxy.agent        # configuration from the environment only

This module is the agent process: its configuration, the poller that keeps the latest
snapshot (:class:`UnitAgent`) and the CLI. By job: the probes and their verdicts are in
proxy/probes.py, load, capacity and weight in proxy/capacity.py, the answers and their
servers in proxy/agent_http.py; the names tests and tools import stay importable here.
"""

from __future__ import annotations

import logging
import signal
import socketserver
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy.agent_http import (
    agent_reply,
    health_body,
    load_body,
    metrics_text,
    serve,
    snapshot_weight,
)
from proxy.capacity import (
    DEFAULT_CAPACITY_REFERENCE,
    MAX_WEIGHT_PERCENT,
    SLO_SERIES,
    TYPICAL_SEQUENCE_TOKENS,
    Capacity,
    Load,
    load_factor,
    parse_capacity,
    parse_load,
    slo_factor,
    weight_percent,
)
from proxy.probes import (
    TIMED_OUT,
    Fetch,
    NodeCheck,
    Snapshot,
    follower_name,
    http_fetch,
    judge_engines,
    judge_follower,
    judge_leader,
    shorten,
    timed_out,
)
from proxy.prometheus import prometheus_labels, prometheus_samples
from rufus.serving.settings import env_var, group, help_epilog, read
from rufus.telemetry import tracing
from rufus.telemetry.tracing import TracingSettings

__all__ = [  # the agent's API, wherever its piece lives
    "DEFAULT_CAPACITY_REFERENCE", "DRAIN_S", "MAX_WEIGHT_PERCENT", "SLO_SERIES",
    "TIMED_OUT", "TYPICAL_SEQUENCE_TOKENS", "AgentConfig", "AgentSettings", "Capacity", "Fetch", "Load",
    "NodeCheck", "Snapshot", "UnitAgent", "agent_reply", "follower_name", "http_fetch",
    "judge_engines", "judge_follower", "judge_leader", "load_factor", "main", "parse_capacity",
    "parse_load", "prometheus_labels", "prometheus_samples", "slo_factor", "snapshot_weight",
    "timed_out", "weight_percent",
]

log = logging.getLogger("proxy.agent")

# Seconds an agent told to stop keeps answering ``down`` before it exits (UnitAgent.drain),
# unless RUFUS_AGENT_DRAIN_S says otherwise: four or more of HAProxy's 1 s agent checks,
# well inside compose's 10 s and Kubernetes' 30 s stop grace.
DRAIN_S = 4.5


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
    # A node that answered before and now lets a probe time out is slow (its host busy: a
    # cell next door loading models), not yet failed: it counts as failing at this many
    # timed-out polls in a row (~2.6 s; a hung node is still out inside the 5 s budget).
    # A refused connection or a non-200 answer counts at once.
    slow_polls: int = 3
    unit: str = ""
    # sequences of capacity that weigh 100 %: the same on every agent behind one ingress
    capacity_reference: int = DEFAULT_CAPACITY_REFERENCE

    @property
    def stale_after_s(self) -> float:
        """A snapshot older than this means the poller itself is stuck: report unhealthy."""
        return 3 * self.poll_s + 2 * self.probe_timeout_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentConfig:
        s = read(AgentSettings, env=env)

        def csv(value: str) -> tuple[str, ...]:
            return tuple(x.strip() for x in value.split(",") if x.strip())

        leader = s.leader_http.rstrip("/")
        return cls(leader_http=leader, leader_metrics=s.leader_metrics,
                   follower_health_urls=csv(s.follower_health_urls), models=csv(s.models),
                   port=s.port, check_port=s.check_port, unit=urlsplit(leader).netloc,
                   capacity_reference=s.capacity_reference)


@dataclass(frozen=True)
class AgentSettings:
    """What ``python -m proxy.agent`` reads from the environment (its --help lists it)."""

    leader_http: str = env_var("RUFUS_LEADER_HTTP", AgentConfig.leader_http,
                               "the leader's tritonserver HTTP")
    leader_metrics: str = env_var("RUFUS_LEADER_METRICS", AgentConfig.leader_metrics,
                                  "its Prometheus metrics")
    follower_health_urls: str = env_var("RUFUS_FOLLOWER_HEALTH_URLS", "",
                                        "comma-separated follower /health URLs",
                                        default_text="none")
    models: str = env_var("RUFUS_UNIT_MODELS", ",".join(AgentConfig.models),
                          "comma-separated models the unit must serve")
    port: int = env_var("RUFUS_AGENT_PORT", AgentConfig.port,
                        "this agent's HTTP port: /health /load /metrics", minimum=1,
                        maximum=65535)
    check_port: int = env_var("RUFUS_AGENT_CHECK_PORT", AgentConfig.check_port,
                              "HAProxy agent-check port", minimum=1, maximum=65535)
    capacity_reference: int = env_var(
        "RUFUS_CAPACITY_REFERENCE", AgentConfig.capacity_reference,
        "unit capacity (sequences) that weighs 100 %; the same on every agent behind one "
        "ingress", minimum=1, maximum=1_000_000)
    drain_s: float = env_var("RUFUS_AGENT_DRAIN_S", DRAIN_S,
                             "on SIGTERM, answer 'down' this long before exiting, so HAProxy "
                             "keeps the unit out until its next agent says 'up'", minimum=0.0,
                             maximum=60.0)
    traces: TracingSettings = group(TracingSettings)  # noqa: RUF009 - a default_factory field


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
        self._capacity: Capacity | None = None
        # per probe: its last verdict and how many polls in a row it has timed out
        self._last_check: dict[str, NodeCheck] = {}
        self._slow: dict[str, int] = {}
        self._draining = ""

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
                check = judge_leader(status, body, "server ready")
            elif key.startswith("model:"):
                check = judge_leader(status, body, f"model {key[6:]} ready")
            else:
                check = judge_follower(key[9:], status, body)
            checks.append(self._tolerate_slow(key, check, timed_out(status, body)))
        status, body = metrics.result()
        if status == 200:
            checks.extend(judge_engines(body, cfg.models))
        snap = Snapshot(checks=checks, at=time.time())
        # capacity is configuration: a poll whose metrics did not answer (or an engine still
        # starting) keeps the last one, so a small unit never briefly weighs as the reference
        snap.capacity = self._capacity
        if status == 200:
            try:
                snap.load = parse_load(body, cfg.models)
            except ValueError as exc:
                snap.load_error = str(exc)
            snap.capacity = parse_capacity(body, cfg.models) or self._capacity
        else:
            snap.load_error = f"metrics {cfg.leader_metrics}: " + (
                f"HTTP {status}" if status else shorten(body))
        snap.poll_s = time.monotonic() - t0
        self._publish(snap)
        return snap

    def _tolerate_slow(self, key: str, check: NodeCheck, slow: bool) -> NodeCheck:
        """A probe that timed out keeps its node's last good verdict for up to
        ``slow_polls - 1`` polls in a row: on a busy host one slow answer must not take the
        unit out of rotation (with every other cell out, that is every request failing)."""
        slow_n = self._slow.get(key, 0) + 1 if slow else 0
        self._slow[key] = slow_n
        last = self._last_check.get(key)
        if slow and last is not None and last.ok and slow_n < self.cfg.slow_polls:
            if slow_n == 1:
                log.info("unit %s: %s (%s) answered no probe within %.1f s; still counted "
                         "ready unless %d polls in a row time out", self.cfg.unit, check.node,
                         check.check, self.cfg.probe_timeout_s, self.cfg.slow_polls)
            return NodeCheck(last.node, last.check, True,
                             f"{last.detail} (slow: {slow_n} probe(s) timed out)")
        self._last_check[key] = check
        return check

    def _publish(self, snap: Snapshot) -> None:
        with self._lock:
            self.snapshot = snap
            was = self._was_healthy
            self._was_healthy = snap.healthy
            if snap.healthy != was:
                self.transitions["healthy" if snap.healthy else "unhealthy"] += 1
                if snap.healthy:
                    self.healthy_since = snap.at
        if snap.healthy != was and tracing.enabled():
            # a transition is a short trace of its own: the poll, and why (no request text)
            tracing.end(tracing.start_span(
                "unit " + ("healthy" if snap.healthy else "unhealthy"), attributes={
                    "rufus.unit": self.cfg.unit, "rufus.checks": len(snap.checks),
                    "rufus.failing": [f"{c.node}: {c.check}" for c in snap.failing][:8]},
                start_ns=int((snap.at - snap.poll_s) * 1e9)))
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
        if snap.capacity is not None and snap.capacity != self._capacity:
            self._log_capacity(snap.capacity)
        self._capacity = snap.capacity

    def _log_capacity(self, cap: Capacity) -> None:
        ref = self.cfg.capacity_reference
        per_seq = min(cap.max_model_len or TYPICAL_SEQUENCE_TOKENS, TYPICAL_SEQUENCE_TOKENS)
        kv = (f"KV cache {cap.kv_cache_tokens} tokens = {cap.kv_cache_tokens // per_seq} "
              f"sequences of {per_seq}" if cap.kv_cache_tokens else "KV cache size not reported")
        log.info("unit %s capacity: %d sequences (%s: max_num_seqs %d, %s; %d node(s), TP %d, "
                 "PP %d); full weight %d%% of reference %d", self.cfg.unit, cap.sequences,
                 cap.model, cap.max_num_seqs, kv, cap.nodes, cap.tensor_parallel,
                 cap.pipeline_parallel, min(round(100 * cap.sequences / ref), MAX_WEIGHT_PERCENT),
                 ref)
        if 100 * cap.sequences / ref > MAX_WEIGHT_PERCENT:
            log.warning("unit %s: capacity %d is more than %.2fx the reference %d; HAProxy "
                        "weighs it as %.2fx. Set RUFUS_CAPACITY_REFERENCE (on every agent) to "
                        "the largest unit's capacity", self.cfg.unit, cap.sequences,
                        MAX_WEIGHT_PERCENT / 100, ref, MAX_WEIGHT_PERCENT / 100)

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
            snap, draining = self.snapshot, self._draining
        if draining:  # answered as a fresh, failing snapshot: never "stale"
            return Snapshot(checks=[NodeCheck("agent", "drain", False, draining)],
                            load=snap.load, capacity=snap.capacity, at=time.time()), False
        stale = (time.time() - snap.at) > self.cfg.stale_after_s
        return snap, stale

    def drain(self, reason: str = "agent stopping: unit drained for a restart or update") -> None:
        """Report the unit down from now on (the agent is about to exit).

        Said before exiting, not left to the checks failing: an agent that only disappears
        leaves HAProxy's *agent* health up, and when the unit's containers are recreated
        (rolling update) HAProxy takes the server out of DNS maintenance as UP before its
        first check, sending requests to a unit still loading its models. Answering
        ``down`` to a few agent checks first brings the agent health to zero, so the
        recreated unit stays DOWN until its new agent says ``up``."""
        with self._lock:
            self._draining = reason
        log.info("unit %s: draining -- reporting down to the load balancer (%s)",
                 self.cfg.unit, reason)

    def health(self) -> tuple[int, dict[str, Any]]:
        snap, stale = self.current()
        return health_body(self.cfg.unit, snap, stale, self.healthy_since)

    def load(self) -> dict[str, Any]:
        snap, stale = self.current()
        return load_body(self.cfg.unit, snap, stale, self.cfg.capacity_reference)

    def metrics(self) -> str:
        snap, stale = self.current()
        return metrics_text(self.cfg.unit, snap, stale, self.transitions,
                            self.cfg.capacity_reference)

    def check_line(self) -> str:
        """The agent-check reply now."""
        snap, stale = self.current()
        return agent_reply(snap, stale, self.cfg.capacity_reference)

    # ---------------------------------------------------------------- servers
    def start(self, poll: bool = True) -> UnitAgent:
        self._servers = serve(self, self.cfg.bind, self.cfg.port, self.cfg.check_port)
        if poll:
            threading.Thread(target=self._loop, name="agent-poll", daemon=True).start()
        log.info("unit agent for %s: HTTP :%d (/health /load /metrics), agent-check :%d; "
                 "leader %s, metrics %s, followers %s, models %s, poll every %.2f s, capacity "
                 "reference %d sequences", self.cfg.unit, self.cfg.port, self.cfg.check_port,
                 self.cfg.leader_http, self.cfg.leader_metrics,
                 list(self.cfg.follower_health_urls) or "none", list(self.cfg.models),
                 self.cfg.poll_s, self.cfg.capacity_reference)
        return self

    def stop(self) -> None:
        self._stop.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m proxy.agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Unit agent: health and load of one inference unit for the load "
                    "balancer. Configuration from the environment only.",
        epilog=help_epilog(AgentSettings)).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        tracing.setup("rufus-agent")  # off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    except ValueError as exc:
        log.error("tracing stays off: %s", exc)
    try:
        cfg = AgentConfig.from_env()
        drain_s = read(AgentSettings).drain_s
    except ValueError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    # Handlers before the ports open: a SIGTERM that comes once the agent answers (a roll
    # right after a start) must drain, not kill it with the default action. The handler only
    # records the signal: one that called Event.set() deadlocked when the signal landed
    # while the main thread held that Event's lock inside wait() (the agent then never
    # drained nor exited).
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    try:
        agent = UnitAgent(cfg).start()
    except OSError as exc:
        log.error("cannot listen on :%d/:%d: %s", cfg.port, cfg.check_port, exc)
        return 1
    while not stopping:
        time.sleep(0.1)
    if drain_s > 0:
        agent.drain()
        # HAProxy asks every agent-inter (1 s); its agent health falls to zero after three
        # failed answers (rise 2 + fall 3 - 1 = 4, then 3, 2, below rise: 0)
        time.sleep(drain_s)
    log.info("unit agent for %s stopping", cfg.unit)
    agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

