"""Multi-region traffic orchestrator: each region's share of global traffic, set on a real HAProxy.

Why a process of its own: the global ingress (HAProxy, weighted round robin over the
regions' own ingresses) balances requests, but it cannot know that a region is slow, full
or has lost its units: that is in the regions' monitoring. This process reads what an
operator's monitoring would read, every ``--interval`` seconds:

- each unit agent (proxy/agent.py): ``GET /health`` (is the unit whole) and ``GET /load``
  (requests outstanding);
- each unit leader's Prometheus endpoint: the ``rufus_time_to_first_token_seconds``
  histogram, differenced between rounds, so p50/p99 are over the last window only;
- optionally the region ingress's HAProxy stats (admin socket): is the ingress reachable,
  and, without agents, which servers are UP and how many streams they carry;

decides the shares with the pure policy in proxy/orchestrator_policy.py (hysteresis,
bounded steps, fail-out at once, gradual return, SLA shedding), and applies them with the
global HAProxy's runtime API, ``set weight <backend>/<server> <share>``. It also serves its
own Prometheus metrics and logs one line per decision that changed something, with the
reason. ``--dry-run`` prints the decisions and touches nothing.

    python -m proxy.orchestrator --print-example-config > regions.json
    python -m proxy.orchestrator --config regions.json --dry-run
    python -m proxy.orchestrator --config regions.json --interval 5 --metrics-port 9300
    python -m proxy.orchestrator --config regions.json --render-global-config  # the global ingress
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
import time
import tomllib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from proxy.agent import Fetch, http_fetch, prometheus_samples
from proxy.haproxy import (
    HAProxy,
    Limits,
    defaults_section,
    global_section,
    grpc_frontend,
    per_source_table,
    runtime_exchange,
)
from proxy.orchestrator_policy import (
    Decision,
    PolicyConfig,
    PolicyState,
    RegionSignals,
    decide,
    initial_state,
    ttft_quantile,
)

log = logging.getLogger("proxy.orchestrator")

TTFT_METRIC = "rufus_time_to_first_token_seconds"


# ----------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class RegionConfig:
    """One region: where its monitoring is, and which global-ingress server carries it."""

    name: str
    baseline: float  # operator-set share (any scale: normalized over regions)
    agents: tuple[str, ...] = ()  # unit agent base URLs, http://host:port
    metrics: tuple[str, ...] = ()  # unit leaders' Prometheus URLs (first-token latency)
    ingress_stats: str = ""  # region HAProxy admin socket: /path, unix:/path or host:port
    ingress_backend: str = "units_lor"
    ingress: str = ""  # the region ingress's gRPC host:port (only to render the global config)
    server: str = ""  # server name in the global backend (default: the region name)
    slots_per_unit: int = 8  # requests a unit runs at once (max_num_seqs): load = outstanding / slots

    @property
    def server_name(self) -> str:
        return self.server or self.name


@dataclass(frozen=True)
class OrchestratorConfig:
    regions: tuple[RegionConfig, ...]
    runtime_api: str = ""  # the global ingress's admin socket
    backend: str = "regions"  # the global ingress's backend whose server weights we set
    interval_s: float = 5.0
    model: str = "rufus_llm"  # whose first-token histogram counts
    probe_timeout_s: float = 1.0
    ttft_window_rounds: int = 1  # p50/p99 over the observations of the last N rounds
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OrchestratorConfig:
        """Validated; a wrong entry is named (``regions[1].agents: ...``)."""
        known = {f.name for f in fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"unknown config keys {sorted(extra)} (known: {sorted(known)})")
        raw_regions = d.get("regions")
        if not isinstance(raw_regions, list) or not raw_regions:
            raise ValueError("regions: a non-empty list of regions is required")
        regions = []
        rkeys = {f.name for f in fields(RegionConfig)}
        for i, r in enumerate(raw_regions):
            where = f"regions[{i}]"
            if not isinstance(r, dict):
                raise ValueError(f"{where}: expected a table/object")
            bad = set(r) - rkeys
            if bad:
                raise ValueError(f"{where}: unknown keys {sorted(bad)} (known: {sorted(rkeys)})")
            if not r.get("name"):
                raise ValueError(f"{where}.name: required")
            try:
                baseline = float(r.get("baseline", 0))
            except (TypeError, ValueError):
                raise ValueError(f"{where}.baseline: expected a number") from None
            if baseline <= 0:
                raise ValueError(f"{where}.baseline: must be > 0 (the operator's share)")
            for key in ("agents", "metrics"):
                if not isinstance(r.get(key, []), list):
                    raise ValueError(f"{where}.{key}: expected a list of URLs")
            rc = RegionConfig(
                name=str(r["name"]), baseline=baseline,
                agents=tuple(str(a).rstrip("/") for a in r.get("agents", [])),
                metrics=tuple(str(m) for m in r.get("metrics", [])),
                ingress_stats=str(r.get("ingress_stats", "")),
                ingress_backend=str(r.get("ingress_backend", "units_lor")),
                ingress=str(r.get("ingress", "")), server=str(r.get("server", "")),
                slots_per_unit=int(r.get("slots_per_unit", 8)))
            if not rc.agents and not rc.ingress_stats:
                raise ValueError(f"{where}: give its unit agents or its ingress_stats (or both)")
            if rc.slots_per_unit < 1:
                raise ValueError(f"{where}.slots_per_unit: must be >= 1")
            regions.append(rc)
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise ValueError(f"regions: names must be unique, got {names}")
        policy = d.get("policy", {})
        if not isinstance(policy, dict):
            raise ValueError("policy: expected a table/object")
        pkeys = {f.name for f in fields(PolicyConfig)}
        if set(policy) - pkeys:
            raise ValueError(f"policy: unknown keys {sorted(set(policy) - pkeys)} (known: {sorted(pkeys)})")
        out = cls(regions=tuple(regions), runtime_api=str(d.get("runtime_api", "")),
                  backend=str(d.get("backend", "regions")),
                  interval_s=float(d.get("interval_s", 5.0)), model=str(d.get("model", "rufus_llm")),
                  probe_timeout_s=float(d.get("probe_timeout_s", 1.0)),
                  ttft_window_rounds=int(d.get("ttft_window_rounds", 1)),
                  policy=PolicyConfig(**policy))
        if out.interval_s <= 0 or out.probe_timeout_s <= 0 or out.ttft_window_rounds < 1:
            raise ValueError("interval_s and probe_timeout_s must be > 0, ttft_window_rounds >= 1")
        return out

    @classmethod
    def load(cls, path: Path) -> OrchestratorConfig:
        text = Path(path).read_text()
        data = tomllib.loads(text) if str(path).endswith(".toml") else json.loads(text)
        return cls.from_dict(data)


EXAMPLE_CONFIG: dict[str, Any] = {
    "runtime_api": "unix:/run/haproxy/global.sock",
    "backend": "regions",
    "interval_s": 5,
    "model": "rufus_llm",
    "regions": [
        {"name": "us-east", "baseline": 40, "ingress": "10.1.0.10:8001",
         "agents": ["http://10.1.0.21:8090", "http://10.1.0.22:8090"],
         "metrics": ["http://10.1.0.21:8002/metrics", "http://10.1.0.22:8002/metrics"],
         "ingress_stats": "10.1.0.10:9999", "slots_per_unit": 8},
        {"name": "us-west", "baseline": 35, "ingress": "10.2.0.10:8001",
         "agents": ["http://10.2.0.21:8090"], "metrics": ["http://10.2.0.21:8002/metrics"]},
        {"name": "eu-west", "baseline": 25, "ingress": "10.3.0.10:8001",
         "ingress_stats": "10.3.0.10:9999"},
    ],
    "policy": {f.name: getattr(PolicyConfig(), f.name) for f in fields(PolicyConfig)},
}


# ----------------------------------------------------------------------- HAProxy runtime API
class RuntimeAPI(HAProxy):
    """The admin socket of an HAProxy this process did not start (the global ingress, a
    region's ingress). ``show stat`` parsing is :meth:`HAProxy.servers`; this adds TCP
    addresses (``host:port``, ``ipv4@host:port``) beside unix sockets."""

    def __init__(self, address: str, timeout_s: float = 3.0) -> None:
        super().__init__("", Path("."))
        self.address = address
        self.timeout_s = timeout_s

    @property
    def stats_socket(self) -> Path:
        return Path(self.address.removeprefix("unix:").removeprefix("unix@"))

    @property
    def is_tcp(self) -> bool:
        a = self.address.removeprefix("ipv4@")
        return not a.startswith(("/", "unix:", "unix@", ".")) and ":" in a

    def start(self) -> HAProxy:
        raise TypeError("RuntimeAPI talks to a running HAProxy; it starts nothing")

    def stop(self) -> None:
        return None

    def command(self, cmd: str) -> str:
        if not self.is_tcp:
            return super().command(cmd)
        host, _, port = self.address.removeprefix("ipv4@").rpartition(":")
        with socket.create_connection((host, int(port)), timeout=self.timeout_s) as s:
            return runtime_exchange(s, cmd)

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        """HAProxy answers nothing on success and one line of error otherwise."""
        reply = self.command(f"set weight {backend}/{server} {weight}").strip()
        if reply:
            raise RuntimeError(f"set weight {backend}/{server} {weight}: {reply}")

    def weights(self, backend: str) -> dict[str, int]:
        rows = self.servers(backend)
        return {name: int(r.get("uweight") or r.get("weight") or 0) for name, r in rows.items()}


def render_global(regions: Sequence[tuple[str, str]], shares: Mapping[str, int], *, port: int,
                  stats_socket: str, bind: str = "0.0.0.0", backend: str = "regions",
                  limits: Limits = Limits(), l7_retry: bool = True) -> str:
    """haproxy.cfg of the global ingress: one gRPC frontend (the same allow-list and limits
    as a region's), weighted round robin over the regions' ingresses, weights = shares.

    Weighted round robin, not least connections: a share is a fraction of *requests*, and
    a region's own ingress already balances its units by outstanding requests. No health
    checks here: taking a region out is the orchestrator's decision (it sees units, not
    just a listening ingress). Until its next round, a region whose last unit just died
    answers 503 from its own ingress (no server) or resets the stream; the global ingress
    retries those on another region (``retry-on ... 503`` + ``redispatch``). That L7 retry
    needs the whole request in HAProxy's buffer before it is forwarded, so the ingress
    waits for the end of the request (``wait-for-body``). Our contract is one request per
    stream, half-closed with it (rufus.client, tritonclient's ``stream_infer`` with a
    finite iterator): measured, no added latency. A client that keeps one stream open for
    many requests never ends its request: it gets 408 after ``limits.http_request``;
    ``l7_retry=False`` serves such clients, and then the requests a dying region resets
    before the orchestrator's next round are lost (the kill drill lost some that way:
    docs/benchmarks.md). ``time`` is not short on purpose: HAProxy answers 408 when it
    expires, and a CPU-starved client was seen sending its message late.
    """
    if not regions:
        raise ValueError("no regions")
    out = [*global_section(limits, stats_socket), "", *defaults_section(limits), "",
           *grpc_frontend("grpc_global", f"{bind}:{port}", backend, limits), "",
           *per_source_table(limits), "",
           f"backend {backend}",
           "    # each server is a region's ingress; its weight is the region's share of global",
           "    # traffic, set at run time by python -m proxy.orchestrator (set weight)",
           "    balance roundrobin"]
    if l7_retry:
        out += ["    # a region that just lost its units answers 503 (no server) or resets the",
                "    # stream until the orchestrator's next round: send the request to another",
                "    # region. A retry needs the whole request in the buffer: wait for the end of",
                "    # the request (one request per stream, half-closed with it: our client);",
                "    # bounded like a slow client's headers, and HAProxy answers 408 on expiry",
                "    retry-on conn-failure empty-response junk-response 502 503 504",
                f"    http-request wait-for-body time {limits.http_request}"]
    for name, addr in regions:
        out.append(f"    server {name} {addr} proto h2 weight {int(shares.get(name, 0))}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------- reading signals
def parse_histogram(text: str, metric: str, model: str) -> dict[float, float] | None:
    """Cumulative bucket counts (le -> count) of ``metric`` for ``model``, summed over its
    label sets (versions); None when the series is absent."""
    want = metric + "_bucket"
    out: dict[float, float] = {}
    for name, labels, value in prometheus_samples(text):
        if name != want or labels.get("model") != model or "le" not in labels:
            continue
        try:
            le = float(labels["le"])  # "+Inf" parses
        except ValueError:
            continue
        out[le] = out.get(le, 0.0) + value
    return out or None


def histogram_delta(now: dict[float, float], then: dict[float, float] | None) -> dict[float, float]:
    """Observations between two scrapes; a counter that went down (the leader restarted)
    means everything in ``now`` is new."""
    if then is None:
        return dict(now)
    delta = {le: c - then.get(le, 0.0) for le, c in now.items()}
    if any(v < 0 for v in delta.values()):
        return dict(now)
    return delta


@dataclass
class UnitReading:
    source: str
    healthy: bool
    outstanding: float | None
    detail: str = ""


class Collector:
    """Reads every region's monitoring in parallel, each probe bounded by a timeout."""

    def __init__(self, cfg: OrchestratorConfig, fetch: Fetch = http_fetch,
                 admin: Callable[[str], RuntimeAPI] = RuntimeAPI) -> None:
        self.cfg = cfg
        self.fetch = fetch
        self.admin = admin
        self._hist: dict[str, deque[dict[float, float]]] = {}
        self.ttft_samples: dict[str, float] = {}
        self.units: dict[str, list[UnitReading]] = {}
        workers = 2 + sum(2 * len(r.agents) + len(r.metrics) + 1 for r in cfg.regions)
        self._pool = ThreadPoolExecutor(max_workers=min(workers, 32),
                                        thread_name_prefix="orchestrator-probe")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def collect(self) -> list[RegionSignals]:
        """Every probe of every region at once (a round takes one probe timeout, not one per
        unit), then each region judged from its answers."""
        agents = {(r.name, a): self._pool.submit(self._agent, a)
                  for r in self.cfg.regions for a in r.agents}
        scrapes = {url: self._pool.submit(self.fetch, url, self.cfg.probe_timeout_s)
                   for r in self.cfg.regions for url in r.metrics}
        stats = {r.name: self._pool.submit(self._stats, r)
                 for r in self.cfg.regions if r.ingress_stats}
        return [self._region(r, [agents[(r.name, a)].result() for a in r.agents],
                             {u: scrapes[u].result() for u in r.metrics},
                             stats[r.name].result() if r.name in stats else None)
                for r in self.cfg.regions]

    def _stats(self, r: RegionConfig) -> dict[str, dict[str, str]] | str:
        """The region ingress's servers, or why they could not be read."""
        try:
            return self.admin(r.ingress_stats).servers(r.ingress_backend)
        except (OSError, ValueError, RuntimeError) as exc:
            return f"ingress stats {r.ingress_stats}: {type(exc).__name__}: {exc}"

    def _agent(self, url: str) -> UnitReading:
        t = self.cfg.probe_timeout_s
        status, body = self.fetch(f"{url}/health", t)
        if status is None:
            return UnitReading(url, False, None, f"agent {url} unreachable ({body})")
        detail = ""
        if status != 200:
            try:
                failing = json.loads(body).get("failing", [])
                detail = "; ".join(f"{f.get('node')}: {f.get('detail')}" for f in failing)
            except (ValueError, AttributeError):
                detail = body[:160]
            detail = f"{url}: {detail or f'HTTP {status}'}"
        outstanding = None
        lstatus, lbody = self.fetch(f"{url}/load", t)
        if lstatus == 200:
            try:
                value = json.loads(lbody).get("outstanding")
                outstanding = float(value) if value is not None else None
            except (ValueError, AttributeError, TypeError):
                outstanding = None
        return UnitReading(url, status == 200, outstanding, detail[:300])

    def _ttft(self, scrapes: Mapping[str, tuple[int | None, str]]
              ) -> tuple[float | None, float | None, float]:
        merged: dict[float, float] = {}
        for url, (status, body) in scrapes.items():
            if status != 200:
                continue
            hist = parse_histogram(body, TTFT_METRIC, self.cfg.model)
            if hist is None:
                continue
            past = self._hist.setdefault(url, deque(maxlen=self.cfg.ttft_window_rounds + 1))
            then = past[0] if past else None
            past.append(hist)
            if then is None:
                continue  # the first scrape has no window yet
            for le, c in histogram_delta(hist, then).items():
                merged[le] = merged.get(le, 0.0) + c
        buckets = sorted(merged.items())
        count = buckets[-1][1] if buckets else 0.0
        return ttft_quantile(buckets, 0.5), ttft_quantile(buckets, 0.99), count

    def _region(self, r: RegionConfig, units: list[UnitReading],
                scrapes: Mapping[str, tuple[int | None, str]],
                stats: dict[str, dict[str, str]] | str | None) -> RegionSignals:
        reachable = True
        details = [u.detail for u in units if u.detail]
        if stats is not None:
            rows: dict[str, dict[str, str]] = {}
            if isinstance(stats, str):
                reachable = False
                details.insert(0, stats)
            else:
                rows = stats
            if reachable and not rows:
                details.append(f"ingress backend {r.ingress_backend} has no servers")
            if not r.agents:
                units = [UnitReading(name, row.get("status", "").startswith("UP"),
                                     float(row.get("scur") or 0),
                                     "" if row.get("status", "").startswith("UP") else
                                     f"{name}: {row.get('status')} {row.get('last_agt', '')}".strip())
                         for name, row in rows.items()]
                details = [d for d in details if d] + [u.detail for u in units if u.detail]
        elif units and all(u.detail.startswith("agent ") and "unreachable" in u.detail for u in units):
            reachable = False  # no agent answered: the region cannot be seen at all
        self.units[r.name] = units
        healthy = [u for u in units if u.healthy]
        known = [u.outstanding for u in healthy if u.outstanding is not None]
        load = (sum(known) / (len(healthy) * r.slots_per_unit)) if healthy and known else None
        p50, p99, n = self._ttft(scrapes) if r.metrics else (None, None, 0.0)
        self.ttft_samples[r.name] = n
        return RegionSignals(name=r.name, baseline=r.baseline, healthy_units=len(healthy),
                             total_units=len(units), reachable=reachable, load=load,
                             ttft_p50_s=p50, ttft_p99_s=p99,
                             ttft_samples=n if r.metrics else None, detail="; ".join(details)[:300])


# ----------------------------------------------------------------------- metrics
class Metrics:
    """The orchestrator's own Prometheus series (``rufus_orchestrator_*``)."""

    def __init__(self, regions: Sequence[str], dry_run: bool) -> None:
        self.lock = threading.Lock()
        self.regions = list(regions)
        self.dry_run = dry_run
        self.shares: dict[str, int] = {}
        self.decisions: dict[tuple[str, str], int] = {}
        self.rounds = 0
        self.apply_errors = 0
        self.last_round = 0.0
        self.signals: list[RegionSignals] = []
        self.samples: dict[str, float] = {}

    def update(self, signals: list[RegionSignals], d: Decision, samples: dict[str, float],
               apply_error: bool) -> None:
        with self.lock:
            self.rounds += 1
            self.last_round = time.time()
            self.shares = dict(d.shares)
            self.signals = list(signals)
            self.samples = dict(samples)
            self.apply_errors += int(apply_error)
            for c in d.changes():
                key = (c.region, c.kind)
                self.decisions[key] = self.decisions.get(key, 0) + 1

    def render(self) -> str:
        with self.lock:
            lines = [
                "# HELP rufus_orchestrator_share_percent Each region's share of global traffic "
                "(the global ingress weight).",
                "# TYPE rufus_orchestrator_share_percent gauge",
                *(f'rufus_orchestrator_share_percent{{region="{n}"}} {v}' for n, v in self.shares.items()),
                "# HELP rufus_orchestrator_decisions_total Share changes, by region and kind of "
                "reason (fail_out, shed_ttft, shed_load, receive, return, restore, donate).",
                "# TYPE rufus_orchestrator_decisions_total counter",
                *(f'rufus_orchestrator_decisions_total{{region="{r}",kind="{k}"}} {v}'
                  for (r, k), v in sorted(self.decisions.items())),
                "# HELP rufus_orchestrator_rounds_total Decision rounds run.",
                "# TYPE rufus_orchestrator_rounds_total counter",
                f"rufus_orchestrator_rounds_total {self.rounds}",
                "# HELP rufus_orchestrator_apply_errors_total Rounds whose weights could not be set.",
                "# TYPE rufus_orchestrator_apply_errors_total counter",
                f"rufus_orchestrator_apply_errors_total {self.apply_errors}",
                "# HELP rufus_orchestrator_last_round_timestamp_seconds When the last round ended.",
                "# TYPE rufus_orchestrator_last_round_timestamp_seconds gauge",
                f"rufus_orchestrator_last_round_timestamp_seconds {self.last_round:.3f}",
                "# HELP rufus_orchestrator_dry_run 1 if decisions are printed, not applied.",
                "# TYPE rufus_orchestrator_dry_run gauge",
                f"rufus_orchestrator_dry_run {int(self.dry_run)}",
            ]
            series: list[tuple[str, str, Callable[[RegionSignals], float | None]]] = [
                ("region_up", "1 if the region is reachable and has a healthy unit.",
                 lambda s: float(s.up)),
                ("region_healthy_units", "Healthy units.", lambda s: float(s.healthy_units)),
                ("region_units", "Units known.", lambda s: float(s.total_units)),
                ("region_load_ratio", "Outstanding requests / (healthy units x slots).",
                 lambda s: s.load),
                ("region_ttft_p50_seconds", "First-token p50 over the last window.",
                 lambda s: s.ttft_p50_s),
                ("region_ttft_p99_seconds", "First-token p99 over the last window.",
                 lambda s: s.ttft_p99_s),
            ]
            for name, help_, get in series:
                lines += [f"# HELP rufus_orchestrator_{name} {help_}",
                          f"# TYPE rufus_orchestrator_{name} gauge"]
                for s in self.signals:
                    v = get(s)
                    if v is not None:
                        lines.append(f'rufus_orchestrator_{name}{{region="{s.name}"}} {v:.6g}')
            lines += ["# HELP rufus_orchestrator_region_ttft_samples First-token observations "
                      "in the last window.", "# TYPE rufus_orchestrator_region_ttft_samples gauge"]
            lines += [f'rufus_orchestrator_region_ttft_samples{{region="{n}"}} {v:g}'
                      for n, v in self.samples.items()]
        return "\n".join(lines) + "\n"

    def serve(self, port: int, bind: str) -> ThreadingHTTPServer:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server naming
                ok = self.path.split("?", 1)[0] == "/metrics"
                data = metrics.render().encode() if ok else b"try /metrics\n"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug(fmt, *args)

        class HTTP(ThreadingHTTPServer):
            daemon_threads = True

        srv = HTTP((bind, port), Handler)
        threading.Thread(target=srv.serve_forever, name="orchestrator-metrics", daemon=True).start()
        return srv


# ----------------------------------------------------------------------- the orchestrator
class Orchestrator:
    """Rounds of read -> decide -> apply; every round recorded, changes logged."""

    def __init__(self, cfg: OrchestratorConfig, *, dry_run: bool = False,
                 collector: Collector | None = None,
                 admin: Callable[[str], RuntimeAPI] = RuntimeAPI,
                 decisions_log: Path | None = None, out: Any = None) -> None:
        if not dry_run and not cfg.runtime_api:
            raise ValueError("runtime_api: the global ingress's admin socket is required "
                             "(or run with --dry-run)")
        self.cfg = cfg
        self.dry_run = dry_run
        self.collector = collector or Collector(cfg, admin=admin)
        self.admin = admin
        self.metrics = Metrics([r.name for r in cfg.regions], dry_run)
        self.decisions_log = decisions_log
        self.out = out if out is not None else sys.stdout
        self.state = self._initial_state()
        self.metrics.shares = dict(self.state.shares)

    def _initial_state(self) -> PolicyState:
        """Continue from the weights the global ingress has now (an orchestrator restart in
        the middle of an incident must not snap back to baseline), else the baselines."""
        baselines = {r.name: r.baseline for r in self.cfg.regions}
        current: dict[str, int] | None = None
        if self.cfg.runtime_api:
            try:
                w = self.admin(self.cfg.runtime_api).weights(self.cfg.backend)
                current = {r.name: w[r.server_name] for r in self.cfg.regions if r.server_name in w}
            except (OSError, RuntimeError, ValueError, KeyError) as exc:
                log.warning("cannot read the global ingress weights (%s); starting from the "
                            "baselines", exc)
        state = initial_state(baselines, current)
        log.info("starting shares %s (%s)", state.shares,
                 "from the global ingress" if current and len(current) == len(baselines)
                 and sum(current.values()) else "baselines")
        return state

    def apply(self, shares: Mapping[str, int]) -> str:
        """Set every region's weight (all of them, every round: a restarted HAProxy or a
        hand edit is put right within one interval). Returns '' or the errors."""
        api = self.admin(self.cfg.runtime_api)
        errors = []
        for r in self.cfg.regions:
            try:
                api.set_weight(self.cfg.backend, r.server_name, int(shares[r.name]))
            except (OSError, RuntimeError) as exc:
                errors.append(f"{r.name}: {type(exc).__name__}: {exc}")
        return "; ".join(errors)

    def round(self) -> Decision:
        signals = self.collector.collect()
        d = decide(signals, self.state, self.cfg.policy)
        self.state = d.state
        error = "" if self.dry_run else self.apply(d.shares)
        if d.changed:
            level = logging.WARNING if any(c.kind == "fail_out" for c in d.changes()) else logging.INFO
            log.log(level, "shares %s -> %s%s: %s", _fmt(d.before), _fmt(d.shares),
                    " (dry run, not applied)" if self.dry_run else "", d.summary())
        else:
            log.debug("round %d: %s", d.state.rounds, d.summary())
        if error:
            log.error("could not set weights on %s: %s (will retry next round)",
                      self.cfg.runtime_api, error)
        if self.dry_run:
            print(f"{time.strftime('%H:%M:%S')} round {d.state.rounds} shares {_fmt(d.shares)}"
                  f"{' CHANGED' if d.changed else ''}: {d.summary()}", file=self.out, flush=True)
        self.metrics.update(signals, d, self.collector.ttft_samples, bool(error))
        if self.decisions_log is not None:
            rec = {"t": round(time.time(), 3), "round": d.state.rounds, "before": d.before,
                   "shares": d.shares, "changed": d.changed, "kinds": d.kinds,
                   "reasons": d.reasons, "signals": [asdict(s) for s in signals],
                   "applied": not self.dry_run and not error, "apply_error": error}
            with open(self.decisions_log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return d

    def run(self, stop: threading.Event, rounds: int = 0) -> None:
        n = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.round()
            except Exception:  # the loop must survive one bad round
                log.exception("round failed; shares unchanged")
            n += 1
            if rounds and n >= rounds:
                return
            stop.wait(max(self.cfg.interval_s - (time.monotonic() - t0), 0.05))

    def close(self) -> None:
        self.collector.close()


def _fmt(shares: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shares.items())


# ----------------------------------------------------------------------- CLI
EPILOG = """configuration (JSON, or TOML when the file ends in .toml; --print-example-config):
  runtime_api         global ingress admin socket: /path, unix:/path, host:port
  backend             its backend whose server weights are set (default regions)
  interval_s          seconds between rounds (default 5; --interval wins)
  regions[]           name, baseline (operator share), agents (unit agent URLs),
                      metrics (leader Prometheus URLs), ingress_stats (region HAProxy admin
                      socket), ingress_backend, ingress (gRPC host:port, for
                      --render-global-config), server (global server name), slots_per_unit
  policy              thresholds and steps (proxy/orchestrator_policy.py PolicyConfig)

Logs: one line per round that changed a share (WARNING for a fail-out), with the reason;
errors setting weights are retried next round. Metrics: rufus_orchestrator_* on
--metrics-port. environment: none read."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m proxy.orchestrator", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Multi-region traffic orchestrator: reads each region's health, load and "
                    "first-token latency, decides its share of global traffic, sets the global "
                    "HAProxy's weights through its runtime API.", epilog=EPILOG)
    ap.add_argument("--config", type=Path, help="regions and policy (JSON or .toml)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each round's decision; set no weight")
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between rounds (default: the config's interval_s, 5)")
    ap.add_argument("--runtime-api", default=None,
                    help="global ingress admin socket (overrides the config's runtime_api)")
    ap.add_argument("--metrics-port", type=int, default=9300,
                    help="Prometheus /metrics of the orchestrator (0: off; default %(default)s)")
    ap.add_argument("--metrics-bind", default="0.0.0.0")
    ap.add_argument("--decisions-log", type=Path, default=None,
                    help="append every round (signals, shares, reasons) as a JSON line")
    ap.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: run until SIGTERM)")
    ap.add_argument("--once", action="store_true", help="one round, then exit (same as --rounds 1)")
    ap.add_argument("--print-example-config", action="store_true",
                    help="print an example JSON config and exit")
    ap.add_argument("--render-global-config", action="store_true",
                    help="print the global ingress's haproxy.cfg for the config's regions and exit")
    ap.add_argument("--global-port", type=int, default=8001,
                    help="gRPC port of the rendered global ingress (default %(default)s)")
    ap.add_argument("--no-l7-retry", action="store_true",
                    help="render the global ingress without retrying a dying region's 503s on "
                         "another region (for clients that keep one stream open for many requests)")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.print_example_config:
        print(json.dumps(EXAMPLE_CONFIG, indent=1))
        return 0
    if a.config is None:
        ap.error("--config is required (see --print-example-config)")
    try:
        cfg = OrchestratorConfig.load(a.config)
    except (OSError, ValueError, TypeError, tomllib.TOMLDecodeError) as exc:
        print(f"bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    if a.interval is not None or a.runtime_api is not None:
        d = asdict(cfg)
        d["interval_s"] = a.interval if a.interval is not None else cfg.interval_s
        d["runtime_api"] = a.runtime_api if a.runtime_api is not None else cfg.runtime_api
        d["regions"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}
                        for r in d["regions"]]
        try:
            cfg = OrchestratorConfig.from_dict(d)
        except ValueError as exc:
            print(f"bad option: {exc}", file=sys.stderr)
            return 2
    if a.render_global_config:
        missing = [r.name for r in cfg.regions if not r.ingress]
        if missing:
            print(f"regions {missing} have no 'ingress' (host:port) to render", file=sys.stderr)
            return 2
        shares = initial_state({r.name: r.baseline for r in cfg.regions}).shares
        print(render_global([(r.server_name, r.ingress) for r in cfg.regions],
                            {r.server_name: shares[r.name] for r in cfg.regions},
                            port=a.global_port, stats_socket=cfg.runtime_api.removeprefix("unix:")
                            or "/run/haproxy/global.sock", backend=cfg.backend,
                            l7_retry=not a.no_l7_retry), end="")
        return 0
    try:
        orch = Orchestrator(cfg, dry_run=a.dry_run, decisions_log=a.decisions_log)
    except ValueError as exc:
        print(f"bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    srv = None
    if a.metrics_port:
        try:
            srv = orch.metrics.serve(a.metrics_port, a.metrics_bind)
        except OSError as exc:
            log.error("cannot listen on :%d for metrics: %s", a.metrics_port, exc)
            return 1
    stop = threading.Event()
    # set from another thread: a handler calling stop.set() deadlocks when the signal lands
    # while this (main) thread holds the Event's lock inside stop.wait()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    log.info("orchestrating %d region(s) %s every %.1f s%s; global ingress %s backend %s; "
             "metrics %s", len(cfg.regions), [r.name for r in cfg.regions], cfg.interval_s,
             " (DRY RUN: nothing applied)" if a.dry_run else "", cfg.runtime_api or "-",
             cfg.backend, f":{a.metrics_port}/metrics" if srv else "off")
    try:
        orch.run(stop, rounds=1 if a.once else a.rounds)
    finally:
        orch.close()
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    log.info("orchestrator stopped after %d round(s); shares %s", orch.state.rounds,
             _fmt(orch.state.shares))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
