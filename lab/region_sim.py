"""Prime Day across regions, simulated: the orchestrator's policy vs fixed shares (scripts/region_sim.py).

Why simulate: a region failure and a regional burst at fleet scale cannot be staged on one
machine, and the question is the policy's, not the engine's. The orchestrator's own policy
(proxy/orchestrator_policy.py ``decide``, the code the process runs) is fed the signals its
monitoring would read; the baselines are the same run with the shares fixed, and with fixed
shares plus a health-check failover.

Model (everything seeded; every policy sees the identical request stream):

- **Units**: fleet_sim.py's unit model (vLLM continuous batching, phases between batch
  changes) with its calibration, so a unit is our measured engine. Each region's units sit
  behind least outstanding requests (its own ingress). A unit admits at most
  ``max_outstanding`` requests (more are rejected at once); a request still queued
  ``deadline_s`` after it arrived is given up by its client (timed out).
- **Fleet size**: the source gives its chip count, its average tokens a minute and its P99
  first-response target, but not the throughput of a chip. The fleet is the number of
  our units that carries the day's peak at ``peak_utilization`` of their decode capacity,
  split across regions by baseline; a simulated unit therefore stands for
  chips / units chips. ``scale`` simulates that fraction of the fleet and of the traffic
  (per-unit load is unchanged; fewer units pool less, so the sample is the harder case).
- **Traffic**: tokens a minute -> requests a second through the mean answer length; a
  diurnal curve (24 h compressed into ``day_s`` simulated seconds, so ramps are steeper
  than a real day's); each region's demand is its baseline share of it. A ``direct_frac``
  of each region's demand reaches that region's ingress directly (clients pinned to their
  region: nobody can move it); the rest arrives at the global ingress and is split by the
  shares. A request served outside the region it came from pays ``rtt_s`` on its first
  token (the source's "small trade-off of latency to the first token").
- **Events**: one region's demand (direct and global) goes to ``burst_factor`` x for a
  while; later another region fails entirely (its requests in flight are lost; requests
  sent to it fail) and comes back empty.
- **Policies**: ``fixed`` (baseline shares all day, no failover); ``fixed_failover``
  (baseline shares; a failed region leaves after ``failover_delay_s`` of failed health
  checks and returns as long after it recovers, like DNS health checks);
  ``orchestrator`` (proxy/orchestrator_policy.py every ``interval_s`` on each region's
  health, load = outstanding / (units x slots) and server-side first-token p50/p99 of
  the last round).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lab.fleet_sim import CALIBRATION, ServiceModel, Session, Sim, WorkloadSpec, _argmin_random
from proxy.orchestrator_policy import (
    PolicyConfig,
    RegionSignals,
    apportion,
    baseline_shares,
    decide,
    initial_state,
)

POLICIES = ("fixed", "fixed_failover", "orchestrator")

SERVED, FAILED_REGION, PINNED_FAILED, REJECTED, TIMED_OUT, LOST_IN_FLIGHT, PENDING = range(7)
OUTCOMES = {FAILED_REGION: "sent to a failed region", PINNED_FAILED: "pinned to a failed region",
            REJECTED: "rejected (unit full)", TIMED_OUT: "timed out in queue",
            LOST_IN_FLIGHT: "lost in flight"}


@dataclass(frozen=True)
class RegionSpec:
    name: str
    baseline: float  # share of the world's demand that is this region's, and of the fleet


@dataclass(frozen=True)
class Scenario:
    """The source's Prime Day figures and the events of the day (times are fractions of it)."""

    regions: tuple[RegionSpec, ...] = (RegionSpec("us-east", 40), RegionSpec("us-west", 35),
                                       RegionSpec("eu-west", 25))
    chips: int = 80_000
    tokens_per_min: float = 3_000_000
    sla_ttft_s: float = 1.0
    peak_utilization: float = 0.5
    diurnal_amplitude: float = 0.4  # demand between (1 - a) and (1 + a) x the day's mean
    peak_at: float = 0.5  # fraction of the day where demand peaks
    day_s: float = 3600.0
    direct_frac: float = 0.5
    burst_region: str = "eu-west"
    burst_factor: float = 3.0
    burst_start: float = 0.30
    burst_len: float = 0.08
    fail_region: str = "us-west"
    fail_start: float = 0.62
    fail_len: float = 0.08
    rtt_s: float = 0.07
    deadline_s: float = 5.0
    max_outstanding: int = 32
    interval_s: float = 5.0  # the orchestrator process's default round
    failover_delay_s: float = 30.0
    scale: float = 0.1
    prompt_tokens: int = 150
    short_tokens: int = 40
    long_tokens: int = 250
    long_frac: float = 0.2

    def __post_init__(self) -> None:
        names = {r.name for r in self.regions}
        if self.burst_region not in names or self.fail_region not in names:
            raise ValueError(f"burst_region and fail_region must be among {sorted(names)}")
        if not 0 < self.scale <= 1 or not 0 < self.peak_utilization < 1:
            raise ValueError("scale in (0, 1], peak_utilization in (0, 1)")
        if not 0 <= self.direct_frac <= 1 or not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("direct_frac in [0, 1], diurnal_amplitude in [0, 1)")

    @property
    def mean_output_tokens(self) -> float:
        return (1 - self.long_frac) * self.short_tokens + self.long_frac * self.long_tokens

    def demand(self, t: float) -> float:
        """The diurnal factor around the day's mean (1.0)."""
        x = t / self.day_s - self.peak_at
        return 1.0 + self.diurnal_amplitude * math.cos(2 * math.pi * x)

    def window(self, which: str) -> tuple[float, float]:
        start, length = (self.burst_start, self.burst_len) if which == "burst" else \
            (self.fail_start, self.fail_len)
        return start * self.day_s, (start + length) * self.day_s


def fleet_units(sc: Scenario, model: ServiceModel) -> tuple[dict[str, int], int, float]:
    """Units per region (simulated, after ``scale``), full-scale units, and tokens/s a unit
    decodes at full batch."""
    unit_tok_s = model.max_num_seqs / model.step(model.max_num_seqs)
    peak_tok_s = sc.tokens_per_min / 60 * (1 + sc.diurnal_amplitude)
    full = math.ceil(peak_tok_s / (unit_tok_s * sc.peak_utilization))
    sim_units = max(len(sc.regions), round(full * sc.scale))
    per = apportion(sim_units, {r.name: r.baseline for r in sc.regions})
    return per, full, unit_tok_s


def burst_load(sc: Scenario) -> tuple[float, float]:
    """At the burst's peak demand, as a share of decode capacity: the whole fleet's load if it
    were spread perfectly, and the burst region's pinned traffic alone on its own units. What
    any policy can reach is bounded by these."""
    b0, b1 = sc.window("burst")
    d = max(sc.demand(b0 + (b1 - b0) * i / 20) for i in range(21))
    per_demand = sc.peak_utilization / (1 + sc.diurnal_amplitude)  # utilization at demand 1.0
    bw = sum(r.baseline for r in sc.regions)
    share = next(r.baseline for r in sc.regions if r.name == sc.burst_region) / bw
    fleet = d * per_demand * (1 + (sc.burst_factor - 1) * share)
    pinned = d * per_demand * sc.direct_frac * sc.burst_factor
    return fleet, pinned


@dataclass
class Arrival:
    t: float
    origin: int  # region index the request comes from
    direct: bool  # pinned to its origin region's ingress
    output: int


def draw_traffic(sc: Scenario, seed: int) -> list[Arrival]:
    """Every request of the day, by thinning a Poisson process (identical for every policy)."""
    w = random.Random(seed)
    rate_mean = sc.tokens_per_min / 60 * sc.scale / sc.mean_output_tokens
    bw = sum(r.baseline for r in sc.regions)
    shares = [r.baseline / bw for r in sc.regions]
    b0, b1 = sc.window("burst")
    bi = [r.name for r in sc.regions].index(sc.burst_region)
    rmax = rate_mean * (1 + sc.diurnal_amplitude) * (1 + (sc.burst_factor - 1) * shares[bi])
    out, t = [], 0.0
    while True:
        t += w.expovariate(rmax)
        if t >= sc.day_s:
            break
        per = [s * rate_mean * sc.demand(t) for s in shares]
        if b0 <= t < b1:
            per[bi] *= sc.burst_factor
        u = w.random() * rmax
        if u >= sum(per):
            continue
        origin = 0
        while u >= per[origin]:
            u -= per[origin]
            origin += 1
        direct = w.random() < sc.direct_frac
        long = w.random() < sc.long_frac
        output = max(1, int((sc.long_tokens if long else sc.short_tokens) * w.uniform(0.5, 1.5)))
        out.append(Arrival(t, origin, direct, output))
    return out


class SmoothWRR:
    """HAProxy-like weighted round robin (nginx's smooth variant): deterministic, a share of
    requests proportional to each weight, weight 0 never picked."""

    def __init__(self, n: int) -> None:
        self.current = [0.0] * n

    def pick(self, weights: list[int]) -> int:
        total = sum(weights)
        if total <= 0:
            return -1
        best = -1
        for i, wt in enumerate(weights):
            if wt <= 0:
                continue
            self.current[i] += wt
            if best < 0 or self.current[i] > self.current[best]:
                best = i
        self.current[best] -= total
        return best


class RegionSim(Sim):
    """Three fleets in one event loop: fleet_sim's units, regions on top."""

    def __init__(self, sc: Scenario, policy: str, model: ServiceModel, traffic: list[Arrival],
                 seed: int = 0, policy_cfg: PolicyConfig | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        per, _, _ = fleet_units(sc, model)
        names = [r.name for r in sc.regions]
        spec = WorkloadSpec(duration_s=sc.day_s, warmup_s=0.0, chat_frac=0.0,
                            context_tokens=sc.prompt_tokens, user_tokens=0)
        super().__init__(sum(per.values()), "least_outstanding", model, spec, seed)
        self.sc = sc
        self.mode = policy
        self.names = names
        self.traffic = traffic
        self.ranges: list[tuple[int, int]] = []
        lo = 0
        for n in names:
            self.ranges.append((lo, lo + per[n]))
            lo += per[n]
        self.region_of = np.zeros(self.n, dtype=np.int64)
        for i, (a, b) in enumerate(self.ranges):
            self.region_of[a:b] = i
        self.alive = [True] * len(names)
        self.baselines = {r.name: r.baseline for r in sc.regions}
        self.base = baseline_shares(self.baselines)
        self.shares = dict(self.base)
        self.policy_cfg = policy_cfg or PolicyConfig(sla_ttft_p99_s=sc.sla_ttft_s)
        self.pstate = initial_state(self.baselines)
        self.wrr = SmoothWRR(len(names))
        self.failover_out: set[int] = set()
        n = len(traffic)
        self.outcome = np.full(n, PENDING, dtype=np.int8)
        self.served_in = np.full(n, -1, dtype=np.int64)
        self.ttft = np.full(n, np.nan)
        self.recent: list[list[float]] = [[] for _ in names]  # server-side TTFTs this round
        self.timeline: list[dict[str, Any]] = []
        self._next_uid = -1
        self.policy = lambda sim, req: self._next_uid  # type: ignore[assignment]

    # ---------------------------------------------------------------- traffic
    def _workload(self) -> None:
        for sid, a in enumerate(self.traffic):
            self.sessions[sid] = Session(sid, [a.output], [])
            self._push(a.t, 0, (sid, 0))

    def _weights(self) -> list[int]:
        if self.mode == "orchestrator":
            return [self.shares[n] for n in self.names]
        if self.mode == "fixed_failover" and self.failover_out:
            kept = {n: self.baselines[n] for i, n in enumerate(self.names) if i not in self.failover_out}
            got = apportion(100, kept) if kept else self.base
            return [got.get(n, 0) for n in self.names]
        return [self.base[n] for n in self.names]

    def _arrive(self, sid: int, turn: int) -> None:
        a = self.traffic[sid]
        region = a.origin if a.direct else self.wrr.pick(self._weights())
        if region < 0 or not self.alive[region]:
            self.outcome[sid] = PINNED_FAILED if a.direct else FAILED_REGION
            return
        lo, hi = self.ranges[region]
        uid = lo + _argmin_random(self.out[lo:hi], self.rng)
        if self.out[uid] >= self.sc.max_outstanding:
            self.outcome[sid] = REJECTED
            return
        self.served_in[sid] = region
        self._next_uid = uid
        super()._arrive(sid, turn)

    # ---------------------------------------------------------------- units
    def _rephase(self, uid: int, t: float, steps: int) -> None:
        u = self.units[uid]
        if u.waiting:  # clients give up on requests queued past their deadline
            keep: deque = deque()
            for r in u.waiting:
                if t - r.arrival > self.sc.deadline_s:
                    self.outcome[r.sid] = TIMED_OUT
                    self.out[uid] -= 1
                else:
                    keep.append(r)
            u.waiting = keep
        new = list(u.new) if steps else []
        super()._rephase(uid, t, steps)
        region = int(self.region_of[uid])
        for r in new:
            self.ttft[r.sid] = r.ttft
            self.recent[region].append(r.ttft)

    def _finish(self, uid: int, u: Any, r: Any, t: float) -> None:
        self.outcome[r.sid] = SERVED
        super()._finish(uid, u, r, t)

    def _fail(self, region: int) -> None:
        self.alive[region] = False
        lo, hi = self.ranges[region]
        for uid in range(lo, hi):
            u = self.units[uid]
            for r in [*u.running, *u.waiting]:
                self.outcome[r.sid] = LOST_IN_FLIGHT
            u.running, u.new = [], []
            u.waiting.clear()
            u.cache.clear()
            u.cached = 0
            u.version += 1  # its scheduled phase ends are void
            self.out[uid] = 0

    # ---------------------------------------------------------------- control
    def _signals(self) -> list[RegionSignals]:
        out = []
        for i, n in enumerate(self.names):
            lo, hi = self.ranges[i]
            units = hi - lo
            recent = self.recent[i]
            p50 = float(np.percentile(recent, 50)) if recent else None
            p99 = float(np.percentile(recent, 99)) if recent else None
            alive = self.alive[i]
            load = sum(self.out[lo:hi]) / (units * self.model.max_num_seqs) if alive else None
            out.append(RegionSignals(name=n, baseline=self.baselines[n],
                                     healthy_units=units if alive else 0, total_units=units,
                                     reachable=alive, load=load, ttft_p50_s=p50,
                                     ttft_p99_s=p99, ttft_samples=len(recent),
                                     detail="" if alive else "region down"))
            self.recent[i] = []
        return out

    def _round(self) -> None:
        signals = self._signals()
        if self.mode == "orchestrator":
            d = decide(signals, self.pstate, self.policy_cfg)
            self.pstate = d.state
            self.shares = dict(d.shares)
            if d.changed:
                self.timeline.append({"t": self.now, "shares": dict(d.shares),
                                      "summary": d.summary()})
        if self.now + self.sc.interval_s < self.sc.day_s:
            self._push(self.now + self.sc.interval_s, 2, None)

    def run(self) -> dict[str, Any]:
        self._workload()
        sc = self.sc
        self._push(sc.interval_s, 2, None)
        fi = self.names.index(sc.fail_region)
        f0, f1 = sc.window("fail")
        self._push(f0, 3, fi)
        self._push(f1, 4, fi)
        if self.mode == "fixed_failover":
            self._push(f0 + sc.failover_delay_s, 5, fi)
            self._push(f1 + sc.failover_delay_s, 6, fi)
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            if kind == 0:
                self._arrive(*payload)
            elif kind == 1:
                uid, version, steps = payload
                if version == self.units[uid].version:
                    self._rephase(uid, t, steps)
            elif kind == 2:
                self._round()
            elif kind == 3:
                self._fail(payload)
            elif kind == 4:
                self.alive[payload] = True
            elif kind == 5:
                self.failover_out.add(payload)
            elif kind == 6:
                self.failover_out.discard(payload)
        return self.result()

    # ---------------------------------------------------------------- results
    def result(self) -> dict[str, Any]:
        sc = self.sc
        t = np.array([a.t for a in self.traffic])
        origin = np.array([a.origin for a in self.traffic])
        client_ttft = self.ttft + np.where((self.served_in >= 0) & (self.served_in != origin),
                                           sc.rtt_s, 0.0)
        served = self.outcome == SERVED

        def window(mask: np.ndarray) -> dict[str, Any]:
            ok = mask & served
            vals = client_ttft[ok]
            bad = int((mask & ~served).sum()) + int((vals > sc.sla_ttft_s).sum())
            total = int(mask.sum())
            return {"requests": total,
                    "ttft_p50_s": float(np.percentile(vals, 50)) if len(vals) else math.nan,
                    "ttft_p99_s": float(np.percentile(vals, 99)) if len(vals) else math.nan,
                    "dropped": int((mask & ~served).sum()),
                    "over_sla_or_dropped": bad,
                    "over_sla_or_dropped_frac": bad / total if total else 0.0}

        b0, b1 = sc.window("burst")
        f0, f1 = sc.window("fail")
        drops = {OUTCOMES[k]: int((self.outcome == k).sum()) for k in OUTCOMES}
        remote = served & (self.served_in != origin)
        out = {"policy": self.mode, "requests": len(self.traffic), "served": int(served.sum()),
               "dropped": int((~served).sum()), "drops": drops,
               "all_day": window(np.ones(len(t), dtype=bool)),
               "burst": window((t >= b0) & (t < b1)),
               "failure": window((t >= f0) & (t < f1 + 2 * sc.interval_s)),
               "served_off_origin_frac": float(remote.sum() / max(served.sum(), 1)),
               "timeline": self.timeline}
        if self.mode == "orchestrator":
            fo = next((e["t"] for e in self.timeline if e["t"] >= f0
                       and e["shares"][sc.fail_region] == 0), None)
            out["fail_out_after_s"] = None if fo is None else fo - f0
        return out


@dataclass
class RunResult:
    scenario: dict[str, Any]
    units: dict[str, int]
    full_scale_units: int
    unit_tok_s: float
    chips_per_unit: float
    rows: list[dict[str, Any]] = field(default_factory=list)


def simulate(sc: Scenario, model: ServiceModel, seed: int = 0,
             policies: tuple[str, ...] = POLICIES,
             policy_cfg: PolicyConfig | None = None) -> RunResult:
    per, full, unit_tok_s = fleet_units(sc, model)
    traffic = draw_traffic(sc, seed)
    res = RunResult(scenario=asdict(sc), units=per, full_scale_units=full,
                    unit_tok_s=unit_tok_s, chips_per_unit=sc.chips / full)
    for p in policies:
        res.rows.append(RegionSim(sc, p, model, traffic, seed, policy_cfg).run())
    return res


def markdown(res: RunResult, sc: Scenario) -> str:
    """The comparison table (one row per policy) and what to read in it."""
    b0, b1 = sc.window("burst")
    f0, f1 = sc.window("fail")
    lines = [
        "| policy | requests | dropped | sent to a failed region | lost in flight "
        "| timed out / rejected | TTFT p50 / p99, day | TTFT p99, burst | burst requests > "
        f"{sc.sla_ttft_s:g} s or dropped | served off-origin |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    pinned = 0
    for r in res.rows:
        d, b, a = r["drops"], r["burst"], r["all_day"]
        pinned = d[OUTCOMES[PINNED_FAILED]]
        steerable = r["dropped"] - pinned
        lines.append(
            f"| {r['policy']} | {r['requests']:,} | {steerable:,} ({steerable / r['requests']:.2%}) "
            f"| {d[OUTCOMES[FAILED_REGION]]:,} | {d[OUTCOMES[LOST_IN_FLIGHT]]:,} "
            f"| {d[OUTCOMES[TIMED_OUT]]:,} / {d[OUTCOMES[REJECTED]]:,} "
            f"| {a['ttft_p50_s']:.2f} / {a['ttft_p99_s']:.2f} s | {b['ttft_p99_s']:.2f} s "
            f"| {b['over_sla_or_dropped']:,} of {b['requests']:,} ({b['over_sla_or_dropped_frac']:.1%}) "
            f"| {r['served_off_origin_frac']:.0%} |")
    lines += ["", f"Not counted above, the same for every policy: {pinned:,} requests pinned to "
              f"{sc.fail_region}'s own ingress while it was down (no share moves them)."]
    orch = next((r for r in res.rows if r["policy"] == "orchestrator"), None)
    if orch is not None:
        fo = orch.get("fail_out_after_s")
        lines.append(f"Burst: {sc.burst_region} x{sc.burst_factor:g} from {b0:.0f} s to {b1:.0f} s; "
                     f"failure: {sc.fail_region} from {f0:.0f} s to {f1:.0f} s; orchestrator "
                     f"round every {sc.interval_s:g} s; {sc.fail_region} failed out "
                     f"{f'after {fo:.0f} s' if fo is not None else 'never'}.")
    return "\n".join(lines)


def timeline_text(row: Mapping[str, Any], limit: int = 60) -> str:
    out = []
    for e in row.get("timeline", [])[:limit]:
        shares = " ".join(f"{k}={v}" for k, v in e["shares"].items())
        out.append(f"  t={e['t']:7.1f} s  {shares:32s} {e['summary']}")
    more = len(row.get("timeline", [])) - limit
    if more > 0:
        out.append(f"  ... {more} more changes")
    return "\n".join(out)


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    d = Scenario()
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="environment: none read")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=d.scale,
                    help="fraction of the fleet and of its traffic simulated (default %(default)s)")
    ap.add_argument("--day-s", type=float, default=d.day_s,
                    help="simulated seconds the 24 h diurnal curve is compressed into (default %(default)s)")
    ap.add_argument("--peak-utilization", type=float, default=d.peak_utilization,
                    help="decode utilization of the fleet at the day's peak; sizes the fleet")
    ap.add_argument("--direct-frac", type=float, default=d.direct_frac,
                    help="share of each region's demand pinned to its own ingress")
    ap.add_argument("--burst-factor", type=float, default=d.burst_factor)
    ap.add_argument("--interval", type=float, default=d.interval_s,
                    help="orchestrator round, simulated seconds (default %(default)s)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--timeline", action="store_true", help="print the orchestrator's share changes")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    model = ServiceModel.load(a.calibration) if a.calibration.exists() else ServiceModel()
    try:
        sc = replace(d, scale=a.scale, day_s=a.day_s, peak_utilization=a.peak_utilization,
                     direct_frac=a.direct_frac, burst_factor=a.burst_factor, interval_s=a.interval)
    except ValueError as exc:
        ap.error(str(exc))
    t0 = time.monotonic()
    res = simulate(sc, model, seed=a.seed, policies=tuple(a.policies.split(",")))
    took = time.monotonic() - t0
    units = sum(res.units.values())
    print(f"Prime Day, {len(sc.regions)} regions (baselines "
          f"{', '.join(f'{r.name} {r.baseline:g}' for r in sc.regions)}): "
          f"{sc.tokens_per_min:,.0f} tokens/min on average, diurnal x{1 - sc.diurnal_amplitude:.1f}.."
          f"x{1 + sc.diurnal_amplitude:.1f} over a day compressed into {sc.day_s:.0f} s; "
          f"{sc.direct_frac:.0%} of each region's demand pinned to it, the rest through the global "
          f"ingress; +{sc.rtt_s * 1000:.0f} ms first token when served off-origin.")
    print(f"Fleet: {res.full_scale_units} units of our engine ({res.unit_tok_s:.0f} tok/s each at "
          f"full batch) carry the peak at {sc.peak_utilization:.0%} utilization, so one unit "
          f"stands for {res.chips_per_unit:.0f} of the {sc.chips:,} chips; simulated at scale "
          f"{sc.scale:g}: {units} units ({', '.join(f'{k} {v}' for k, v in res.units.items())}) "
          f"and the same fraction of the traffic. SLA: P99 first token < {sc.sla_ttft_s:g} s; a "
          f"request queued {sc.deadline_s:g} s is given up; a unit admits {sc.max_outstanding}. "
          f"Seed {a.seed}; {took:.0f} s to simulate.\n")
    fleet, pinned = burst_load(sc)
    print(f"At the burst's peak the fleet would run at {fleet:.0%} of its decode capacity if the "
          f"load were spread perfectly; {sc.burst_region}'s pinned traffic alone loads its own "
          f"units to {pinned:.0%}.\n")
    print(markdown(res, sc))
    if a.timeline:
        for r in res.rows:
            if r["policy"] == "orchestrator":
                print("\nOrchestrator share changes (simulated time):")
                print(timeline_text(r))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"seed": a.seed, "units": res.units,
                                      "full_scale_units": res.full_scale_units,
                                      "scenario": res.scenario, "rows": res.rows}, indent=1))
        print(f"\nwritten {a.json}", file=sys.stderr)
    return 0

