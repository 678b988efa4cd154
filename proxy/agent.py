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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rufus.env import env_float, env_int, env_port, help_text
from rufus.wire import CAPACITY_GAUGES

log = logging.getLogger("proxy.agent")

# The capacity (sequences) that weighs 100 % unless RUFUS_CAPACITY_REFERENCE says otherwise:
# the default model.json's max_num_seqs, so a fleet of default units weighs as before.
DEFAULT_CAPACITY_REFERENCE = 64

# Seconds an agent told to stop keeps answering ``down`` before it exits (UnitAgent.drain),
# unless RUFUS_AGENT_DRAIN_S says otherwise: four or more of HAProxy's 1 s agent checks,
# well inside compose's 10 s and Kubernetes' 30 s stop grace.
DRAIN_S = 4.5

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
            capacity_reference=env_int("RUFUS_CAPACITY_REFERENCE", cls.capacity_reference, env,
                                       minimum=1, maximum=1_000_000),
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
    # the assistant's SLO admission (rufus/assistant/admission.py): the first answer text a
    # new turn would get now, and the SLO it is admitted against (None: not served here)
    first_token_estimate_s: float | None = None
    first_token_slo_s: float | None = None


# A sequence of this many tokens (bounded by max_model_len) is what the unit's KV cache is
# measured in: a shopping turn here is a prompt with product cards and history (a few hundred
# tokens) plus an answer of up to a few hundred.
TYPICAL_SEQUENCE_TOKENS = 1024
# HAProxy 2.6 turns ``up ready N%`` into weight = initial weight x N / 100 and silently clamps
# it at 256 (its largest server weight; measured with haproxy 2.6.12, tests/integration/
# test_capacity_haproxy.py). render() gives every unit weight 100, so 256 % is the most a
# reply can mean; the agent clamps itself so /load and /metrics show what HAProxy applies.
MAX_WEIGHT_PERCENT = 256


@dataclass
class Capacity:
    """The unit's size, from the ``rufus_engine_*`` gauges its engine exports.

    ``sequences`` is the unit's capacity: the concurrent sequences it runs at full speed,
    ``max_num_seqs`` bounded by how many sequences of :data:`TYPICAL_SEQUENCE_TOKENS`
    (at most ``max_model_len``) its KV cache holds. vLLM batches up to ``max_num_seqs``, but
    a cache too small for them makes it preempt and recompute, so the smaller of the two is
    what the unit sustains. Nodes and parallel degrees are reported, not multiplied in: they
    already show in the KV cache (more nodes, more memory) and in speed, and speed needs no
    weight — ``leastconn`` gives a faster unit more requests by itself, because its streams
    end sooner. A unit serving several models is as big as its first model that reports a
    capacity (``RUFUS_UNIT_MODELS`` order: the unit's own model, rufus_llm, comes first).
    """

    model: str
    max_num_seqs: int
    kv_cache_tokens: int = 0
    max_model_len: int = 0
    nodes: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def sequences(self) -> int:
        if self.kv_cache_tokens <= 0:  # not reported: the batch limit alone
            return max(1, self.max_num_seqs)
        per_seq = min(self.max_model_len or TYPICAL_SEQUENCE_TOKENS, TYPICAL_SEQUENCE_TOKENS)
        return max(1, min(self.max_num_seqs, self.kv_cache_tokens // per_seq))


@dataclass
class Snapshot:
    """Everything one poll learned; endpoints answer from the latest one."""

    checks: list[NodeCheck] = field(default_factory=list)
    load: Load | None = None
    capacity: Capacity | None = None
    load_error: str = ""
    at: float = 0.0  # time.time() of the poll
    poll_s: float = 0.0  # how long the poll took

    @property
    def failing(self) -> list[NodeCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and not self.failing


# The reason :func:`http_fetch` gives for a probe that got no answer in time (a slow or hung
# node) rather than a refused connection: the agent gives a slow node ``slow_polls`` polls.
TIMED_OUT = "timed out"


def http_fetch(url: str, timeout: float) -> tuple[int | None, str]:
    """GET ``url``; (status, body) for any HTTP answer, (None, reason) when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace") if exc.fp else ""
        return exc.code, body
    except TimeoutError:
        return None, f"{TIMED_OUT} after {timeout:g} s"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            return None, f"{TIMED_OUT} after {timeout:g} s"
        return None, f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def timed_out(status: int | None, body: str) -> bool:
    return status is None and body.startswith(TIMED_OUT)


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


def prometheus_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) of each sample line in Prometheus text; comments and
    lines whose value does not parse are skipped. The one reader of leader metrics here and
    in proxy/orchestrator.py."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        yield head.split("{", 1)[0], dict(prometheus_labels(head)), v


def judge_engines(text: str, models: Sequence[str]) -> list[NodeCheck]:
    """``rufus_engine_ready`` per model: a model whose engine died stays loaded (Triton's
    model readiness stays 200) while it replaces the engine, so this gauge is the check."""
    out = []
    for name, labels, value in prometheus_samples(text):
        model = labels.get("model")
        if name == "rufus_engine_ready" and model in models:
            ok = value != 0
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
    slo: dict[str, float] = {}
    for name, labels, v in prometheus_samples(text):
        if name in SLO_SERIES:  # whichever model serves turns on this unit
            slo[name] = max(slo.get(name, v), v)
            continue
        if name not in sums and name != "rufus_kv_cache_usage_ratio":
            continue
        if labels.get("model") not in wanted:
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
                running=sums["rufus_requests_running"], kv_cache_usage=kv,
                first_token_estimate_s=slo.get(SLO_SERIES[0]),
                first_token_slo_s=slo.get(SLO_SERIES[1]))


# the assistant's admission gauges: estimate for a new turn now, and its SLO
SLO_SERIES = ("rufus_assistant_first_token_estimate_seconds",
              "rufus_assistant_first_token_slo_seconds")


def slo_factor(load: Load) -> float:
    """1 while a new turn's estimated first answer text is within half the SLO, falling
    linearly to 1 % at the SLO: new conversations (and keyed ones, through the affinity
    backend's bounded load) go to units that can answer them in time, before this one has
    to refuse. 1 when the unit reports no estimate or admission is off."""
    est, slo = load.first_token_estimate_s, load.first_token_slo_s
    if est is None or not slo or slo <= 0:
        return 1.0
    return max(0.01, min(1.0, 2.0 * (slo - est) / slo))


_CAPACITY_FIELDS = {name: key for key, (name, _) in CAPACITY_GAUGES.items()}


def parse_capacity(text: str, models: Sequence[str]) -> Capacity | None:
    """The unit's :class:`Capacity` from the leader's Prometheus text, or None when no model
    of the unit exports one (an older leader, an engine still starting): the weight then
    carries load alone, as before capacities were reported."""
    found: dict[str, dict[str, int]] = {}
    for name, labels, value in prometheus_samples(text):
        key = _CAPACITY_FIELDS.get(name)
        model = labels.get("model")
        if key is None or model not in models:
            continue
        try:
            found.setdefault(model, {})[key] = int(value)
        except ValueError:  # NaN
            continue
    for model in models:
        got = found.get(model, {})
        if got.get("sequences", 0) > 0:
            return Capacity(model=model, max_num_seqs=got["sequences"],
                            kv_cache_tokens=got.get("kv_cache_tokens", 0),
                            max_model_len=got.get("max_model_len", 0),
                            nodes=got.get("nodes", 1) or 1,
                            tensor_parallel=got.get("tensor_parallel", 1) or 1,
                            pipeline_parallel=got.get("pipeline_parallel", 1) or 1)
    return None


def prometheus_labels(head: str) -> list[tuple[str, str]]:
    if "{" not in head:
        return []
    inner = head[head.index("{") + 1: head.rindex("}")]
    out = []
    for part in inner.split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out.append((k.strip(), v.strip().strip('"')))
    return out


def load_factor(load: Load | None, kv_soft: float = 0.8) -> float:
    """How much of its capacity the unit can still offer, 0.01-1, from its own view of load.

    HAProxy's ``leastconn`` already counts the streams *it* has open to each unit, exactly
    and without lag; this adds what it cannot see: (1) a queue inside the engine
    (``waiting`` > 0 means the batch is full, a new request waits for a slot: scale by
    running / (running + waiting)); (2) KV-cache pressure above ``kv_soft`` (vLLM will
    preempt soon: fall linearly to 10 % at full). Unknown load is 1: load is advice, health
    decides membership.
    """
    if load is None:
        return 1.0
    queue = 1.0
    if load.waiting > 0:
        queue = load.running / (load.running + load.waiting) if load.running > 0 else 0.1
    kv = 1.0
    if load.kv_cache_usage > kv_soft:
        kv = 1.0 - 0.9 * min((load.kv_cache_usage - kv_soft) / (1.0 - kv_soft), 1.0)
    return max(0.01, min(1.0, queue, kv, slo_factor(load)))


def weight_percent(load: Load | None, kv_soft: float = 0.8, *,
                   capacity: Capacity | None = None,
                   reference: int = DEFAULT_CAPACITY_REFERENCE) -> int:
    """HAProxy weight, in % of the configured weight (100): load factor x capacity / reference.

    ``leastconn`` picks the unit with the fewest in-flight streams *per unit of weight*, so a
    weight proportional to capacity gives each unit streams in proportion to the sequences it
    can run (:class:`Capacity`), and the load factor (:func:`load_factor`) takes back what
    it cannot absorb right now. ``reference``: the capacity that weighs 100 %; every agent
    behind one ingress must use the same. Clamped to 1-:data:`MAX_WEIGHT_PERCENT` (a unit
    more than 2.56x the reference weighs as 2.56x: set the reference to the largest unit's
    capacity). Unknown capacity weighs as the reference: load alone, 1-100 %, as before
    capacities were reported.
    """
    factor = load_factor(load, kv_soft)
    if capacity is None:
        return max(1, min(100, round(100 * factor)))
    return max(1, min(MAX_WEIGHT_PERCENT, round(100 * factor * capacity.sequences / reference)))


def snapshot_weight(snap: Snapshot, reference: int = DEFAULT_CAPACITY_REFERENCE) -> int:
    """The weight the agent reports for a snapshot (agent-check, /load, /metrics)."""
    return weight_percent(snap.load, capacity=snap.capacity, reference=reference)


def agent_reply(snap: Snapshot, stale: bool,
                reference: int = DEFAULT_CAPACITY_REFERENCE) -> str:
    """One line of HAProxy's agent-check protocol for the current snapshot."""
    if stale:
        return "down #agent poll stale\n"
    if not snap.healthy:
        reason = "; ".join(f"{c.node}: {c.detail}" for c in snap.failing) or "no probe yet"
        # " #" starts HAProxy's description (shown in its stats and logs); without the
        # space HAProxy 2.6 reads the whole line as an error and ignores it
        return f"down #{_short(reason, 200).replace(chr(10), ' ')}\n"
    return f"up ready {snapshot_weight(snap, reference)}%\n"


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
                f"HTTP {status}" if status else _short(body))
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

    def weight(self, snap: Snapshot) -> int:
        return snapshot_weight(snap, self.cfg.capacity_reference)

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
                                "weight_percent": self.weight(snap)}
        if snap.load is not None:
            body.update(asdict(snap.load))
        else:
            body.update({"outstanding": None, "waiting": None, "running": None,
                         "kv_cache_usage": None, "error": snap.load_error})
        cap = snap.capacity
        body["capacity"] = cap.sequences if cap is not None else None
        body["capacity_reference"] = self.cfg.capacity_reference
        body["engine"] = asdict(cap) if cap is not None else None
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
            f"rufus_unit_weight_percent{{{lab}}} {self.weight(snap)}",
            "# HELP rufus_unit_capacity_reference_sequences Capacity that weighs 100 %.",
            "# TYPE rufus_unit_capacity_reference_sequences gauge",
            f"rufus_unit_capacity_reference_sequences{{{lab}}} {self.cfg.capacity_reference}",
        ]
        if snap.capacity is not None:
            cap = snap.capacity
            for name, help_, v in (
                ("capacity_sequences", "Concurrent sequences the unit runs at full speed.",
                 cap.sequences),
                ("max_num_seqs", "The engine's batch limit.", cap.max_num_seqs),
                ("kv_cache_tokens", "Tokens the engine's KV cache holds.", cap.kv_cache_tokens),
                ("nodes", "Nodes the unit's engine spans.", cap.nodes),
            ):
                lines += [f"# HELP rufus_unit_{name} {help_}", f"# TYPE rufus_unit_{name} gauge",
                          f"rufus_unit_{name}{{{lab}}} {v}"]
        if snap.load is not None:
            for name, help_, v in (
                ("outstanding", "Requests admitted and not finished on the leader.",
                 snap.load.outstanding),
                ("waiting", "Requests queued in the engine(s).", snap.load.waiting),
                ("running", "Requests running in the engine(s).", snap.load.running),
                ("kv_cache_usage_ratio", "Highest KV-cache usage among the unit's engines.",
                 snap.load.kv_cache_usage),
                ("first_token_estimate_seconds", "First answer text a new turn would get now "
                 "(the assistant's admission estimate; NaN: not reported).",
                 _or_nan(snap.load.first_token_estimate_s)),
                ("first_token_slo_seconds", "The SLO new turns are admitted against.",
                 _or_nan(snap.load.first_token_slo_s)),
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
                    self.request.sendall(
                        agent_reply(snap, stale, agent.cfg.capacity_reference).encode())
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


def _or_nan(v: float | None) -> float:
    return float("nan") if v is None else v


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


ENVIRONMENT = {
    "RUFUS_LEADER_HTTP": "the leader's tritonserver HTTP (default http://127.0.0.1:8000)",
    "RUFUS_LEADER_METRICS": "its Prometheus metrics (default http://127.0.0.1:8002/metrics)",
    "RUFUS_FOLLOWER_HEALTH_URLS": "comma-separated follower /health URLs (default none)",
    "RUFUS_UNIT_MODELS": "comma-separated models the unit must serve (default rufus_llm)",
    "RUFUS_AGENT_PORT": "this agent's HTTP port: /health /load /metrics (default 8090)",
    "RUFUS_AGENT_CHECK_PORT": "HAProxy agent-check port (default 8091)",
    "RUFUS_CAPACITY_REFERENCE": "unit capacity (sequences) that weighs 100 %; the same on every "
                                "agent behind one ingress (default 64)",
    "RUFUS_AGENT_DRAIN_S": "on SIGTERM, answer 'down' this long before exiting, so HAProxy "
                           "keeps the unit out until its next agent says 'up' (default 4.5)",
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
        drain_s = env_float("RUFUS_AGENT_DRAIN_S", DRAIN_S, minimum=0.0, maximum=60.0)
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

