"""What the orchestrator reads every round, per region: its unit agents' ``/health`` and
``/load``, its leaders' first-token histograms (differenced between rounds, so p50/p99 are
over the last window only) and, optionally, its ingress's HAProxy stats, judged into one
:class:`~proxy.orchestrator_policy.RegionSignals` per region (:class:`Collector`)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from proxy.global_ingress import RuntimeAPI
from proxy.orchestrator_config import OrchestratorConfig, RegionConfig
from proxy.orchestrator_policy import RegionSignals, ttft_quantile
from proxy.probes import Fetch, http_fetch
from proxy.prometheus import prometheus_samples

TTFT_METRIC = "rufus_time_to_first_token_seconds"


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
