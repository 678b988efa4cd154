"""Discrete-event simulation of a fleet of LLM units behind a router (scripts/fleet_sim.py).

Why simulate: the policies that matter (least outstanding, power of two, prefix affinity)
differ most at fleet scale and under bursts, which two units on a 2-core machine cannot
show. The service model is fitted to times measured from our real engine
(``scripts/fleet.py bench --calibrate`` writes them), so "units needed" is in units of that
engine; the *ratios* between policies are the result to read.

Unit model (vLLM continuous batching, one engine per unit):

- at most ``max_num_seqs`` requests run; others wait FIFO in the unit's queue;
- every step, each running request emits one token; a step lasts
  ``step_base + step_per_seq * batch + prefill_per_token * new_prompt_tokens``: requests
  admitted at a step boundary are prefilled in that step (their first token ends it);
- prefix cache: per unit, an LRU of conversations' last context (prompt + answer), bounded
  in tokens. A chat turn routed to the unit that served the previous turn prefills only the
  new tokens, elsewhere the whole history. A shared system prompt is assumed cached
  everywhere (it is, after the first request), so it is never counted.

The engine is simulated in *phases* (steps of equal length between two changes of the
batch), not step by step, so 100+ units and tens of thousands of requests take about a
second per run.

Routers see the exact number of outstanding requests per unit (as one HAProxy does with
``leastconn``), except ``lor_stale_1s``, which sees a snapshot refreshed every second (what
routing only on an agent's periodic load reports would give).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import random
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

CALIBRATION = Path(__file__).with_name("fleet_sim_calibration.json")


# ----------------------------------------------------------------------- service model
@dataclass(frozen=True)
class ServiceModel:
    step_base_s: float = 0.025
    step_per_seq_s: float = 0.002
    prefill_per_token_s: float = 0.0006
    max_num_seqs: int = 8
    cache_tokens: int = 40_000

    def step(self, batch: int, prefill_tokens: int = 0) -> float:
        return self.step_base_s + self.step_per_seq_s * batch + \
            self.prefill_per_token_s * prefill_tokens

    @classmethod
    def from_calibration(cls, cal: dict[str, Any], **overrides: Any) -> ServiceModel:
        """Least-squares fits: ITL(b) = base + per_seq * b; TTFT(prompt) slope = prefill."""
        pts = sorted((int(b), v / 1000) for b, v in cal["itl_ms"].items())
        base, per_seq = _linfit(pts)
        pf = sorted((int(n), v / 1000) for n, v in cal["ttft_ms_by_prompt_tokens"].items())
        _, per_token = _linfit(pf)
        return cls(step_base_s=max(base, 0.001), step_per_seq_s=max(per_seq, 0.0),
                   prefill_per_token_s=max(per_token, 0.0), **overrides)

    @classmethod
    def load(cls, path: Path = CALIBRATION, **overrides: Any) -> ServiceModel:
        data = json.loads(Path(path).read_text())
        return cls.from_calibration(data["calibration"], **overrides)


def _linfit(pts: list[tuple[int, float]]) -> tuple[float, float]:
    if len(pts) == 1:
        return pts[0][1], 0.0
    xs = np.array([p[0] for p in pts], dtype=float)
    ys = np.array([p[1] for p in pts], dtype=float)
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


# ----------------------------------------------------------------------- workload
@dataclass
class WorkloadSpec:
    """Prime-Day-like traffic: a base rate, a peak hour (x ``peak``), and lightning-deal
    bursts (x ``burst`` for ``burst_s`` seconds, arriving every ``burst_every_s`` on average).
    A share of sessions are multi-turn chats whose next turn follows the previous answer
    after a think time."""

    duration_s: float = 120.0
    warmup_s: float = 10.0
    base_rate: float = 100.0  # new sessions per second across the fleet
    peak: float = 1.3  # middle third of the run
    burst: float = 2.0
    burst_s: float = 8.0
    burst_every_s: float = 30.0
    chat_frac: float = 0.5
    mean_extra_turns: float = 3.0  # follow-up turns of a chat (so chats average 4 turns)
    think_s: float = 6.0
    context_tokens: int = 120  # retrieved product facts added per turn
    max_prompt_tokens: int = 768  # older turns are dropped (the engine runs max_model_len 1024)
    user_tokens: int = 30
    short_tokens: int = 40
    long_tokens: int = 250
    long_frac: float = 0.2

    def rate(self, t: float, bursts: list[tuple[float, float]]) -> float:
        """Arrival rate at ``t``; ``bursts`` sorted by start."""
        r = self.base_rate
        if self.duration_s / 3 <= t < 2 * self.duration_s / 3:
            r *= self.peak
        i = bisect.bisect_right(bursts, (t, math.inf)) - 1
        if i >= 0 and bursts[i][0] <= t < bursts[i][1]:
            r *= self.burst
        return r


@dataclass
class Session:
    """Drawn in full up front, so every policy and fleet size sees the same traffic."""

    sid: int
    outputs: list[int]  # answer length per turn
    thinks: list[float]  # think time before each next turn
    history: int = 0  # tokens of previous turns (prompts + answers)
    home: int = -1  # unit that served the previous turn

    @property
    def turns(self) -> int:
        return len(self.outputs)


@dataclass
class Req:
    sid: int
    turn: int
    arrival: float
    prompt: int
    output: int
    unit: int = -1
    prefill: int = 0
    remaining: int = 0
    ttft: float = math.nan
    done: float = math.nan
    cache_hit: bool = False


# ----------------------------------------------------------------------- routing policies
Policy = Callable[["Sim", Req], int]


def _argmin_random(vals: list[int], rng: random.Random) -> int:
    """Index of a least value; ties broken by scanning from a random offset (HAProxy's
    leastconn likewise does not always favour the first server)."""
    m = min(vals)
    start = rng.randrange(len(vals))
    try:
        return vals.index(m, start)
    except ValueError:
        return vals.index(m)


def p_random(sim: Sim, req: Req) -> int:
    return sim.rng.randrange(sim.n)


def p_round_robin(sim: Sim, req: Req) -> int:
    sim.rr = (sim.rr + 1) % sim.n
    return sim.rr


def p_least_outstanding(sim: Sim, req: Req) -> int:
    return _argmin_random(sim.out, sim.rng)


def p_lor_stale(sim: Sim, req: Req) -> int:
    if sim.now - sim.snap_t >= 1.0:
        sim.snap = list(sim.out)
        sim.snap_t = sim.now
    return _argmin_random(sim.snap, sim.rng)


def p_p2c(sim: Sim, req: Req) -> int:
    a, b = sim.rng.sample(range(sim.n), 2)
    if sim.out[a] == sim.out[b]:
        return a if sim.rng.random() < 0.5 else b
    return a if sim.out[a] < sim.out[b] else b


def p_prefix_affinity(sim: Sim, req: Req) -> int:
    """Least outstanding, but a chat turn goes back to the unit holding its prefix unless
    that unit has more than ``slack`` requests above the least loaded one (bounded load)."""
    home = sim.sessions[req.sid].home
    best = _argmin_random(sim.out, sim.rng)
    if home >= 0 and sim.out[home] <= sim.out[best] + sim.affinity_slack:
        return home
    return best


POLICIES: dict[str, Policy] = {
    "random": p_random,
    "round_robin": p_round_robin,
    "least_outstanding": p_least_outstanding,
    "lor_stale_1s": p_lor_stale,
    "power_of_two": p_p2c,
    "prefix_affinity": p_prefix_affinity,
}


# ----------------------------------------------------------------------- the simulation
@dataclass
class Unit:
    running: list[Req] = field(default_factory=list)
    waiting: deque[Req] = field(default_factory=deque)
    new: list[Req] = field(default_factory=list)  # admitted at phase start (prefilling)
    phase_start: float = 0.0
    d0: float = 0.0  # first step of the phase (includes prefill)
    d: float = 0.0  # every later step
    k_next: int = 0  # steps from phase start to the scheduled event
    version: int = 0
    cache: OrderedDict[int, int] = field(default_factory=OrderedDict)
    cached: int = 0


class Sim:
    def __init__(self, n_units: int, policy: str, model: ServiceModel, spec: WorkloadSpec,
                 seed: int = 0, affinity_slack: int = 2) -> None:
        self.n = n_units
        self.policy = POLICIES[policy]
        self.model = model
        self.spec = spec
        self.rng = random.Random(seed * 7919 + 17)  # routing decisions
        self.wrng = random.Random(seed)  # workload: identical across policies and sizes
        self.units = [Unit() for _ in range(n_units)]
        self.out = [0] * n_units
        self.snap = list(self.out)
        self.snap_t = -1e9
        self.rr = -1
        self.affinity_slack = affinity_slack
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.sessions: dict[int, Session] = {}
        self.done: list[Req] = []

    # ---------------------------------------------------------------- events
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def _workload(self) -> None:
        """Session arrivals by thinning a Poisson process with the time-varying rate."""
        s, w = self.spec, self.wrng
        bursts, t = [], w.expovariate(1 / s.burst_every_s)
        while t < s.duration_s:
            bursts.append((t, t + s.burst_s))
            t += w.expovariate(1 / s.burst_every_s)
        rmax = s.base_rate * s.peak * s.burst
        t, sid = 0.0, 0
        while True:
            t += w.expovariate(rmax)
            if t >= s.duration_s:
                break
            if w.random() * rmax > s.rate(t, bursts):
                continue
            turns = 1
            if w.random() < s.chat_frac:  # a chat: geometric number of follow-up turns
                turns += 1
                while w.random() > 1 / max(s.mean_extra_turns, 1.0):
                    turns += 1
            outputs = [max(1, int((s.long_tokens if w.random() < s.long_frac else s.short_tokens)
                                  * w.uniform(0.5, 1.5))) for _ in range(turns)]
            thinks = [w.expovariate(1 / s.think_s) for _ in range(turns - 1)]
            self.sessions[sid] = Session(sid, outputs, thinks)
            self._push(t, 0, (sid, 0))
            sid += 1
        self.bursts = bursts

    def _make_req(self, sid: int, turn: int, t: float) -> Req:
        sess = self.sessions[sid]
        prompt = min(sess.history + self.spec.context_tokens + self.spec.user_tokens,
                     self.spec.max_prompt_tokens)
        return Req(sid, turn, t, prompt, sess.outputs[turn])

    # ---------------------------------------------------------------- units
    def _admit(self, u: Unit, uid: int, req: Req) -> None:
        hit = min(u.cache.get(req.sid, 0), req.prompt - 1)
        if hit:
            u.cache.move_to_end(req.sid)
        req.cache_hit = hit > 0
        req.prefill = max(req.prompt - hit, 1)
        req.remaining = req.output

    def _rephase(self, uid: int, t: float, steps: int) -> None:
        u = self.units[uid]
        if steps:
            for r in u.new:
                r.ttft = u.phase_start + u.d0 - r.arrival
            u.new = []
            still = []
            for r in u.running:
                r.remaining -= steps
                if r.remaining <= 0:
                    self._finish(uid, u, r, t)
                else:
                    still.append(r)
            u.running = still
        m = self.model
        new = []
        while u.waiting and len(u.running) < m.max_num_seqs:
            r = u.waiting.popleft()
            self._admit(u, uid, r)
            u.running.append(r)
            new.append(r)
        u.version += 1
        if not u.running:
            return
        b = len(u.running)
        u.new = new
        u.phase_start = t
        u.d = m.step(b)
        u.d0 = m.step(b, sum(r.prefill for r in new)) if new else u.d
        u.k_next = min(r.remaining for r in u.running)
        self._push(t + u.d0 + (u.k_next - 1) * u.d, 1, (uid, u.version, u.k_next))

    def _finish(self, uid: int, u: Unit, r: Req, t: float) -> None:
        r.done = t
        self.out[uid] -= 1
        self.done.append(r)
        sess = self.sessions[r.sid]
        sess.history = r.prompt + r.output
        sess.home = uid
        # the unit now caches this conversation's whole context
        u.cached += sess.history - u.cache.pop(r.sid, 0)
        u.cache[r.sid] = sess.history
        while u.cached > self.model.cache_tokens and u.cache:
            _, n = u.cache.popitem(last=False)
            u.cached -= n
        if r.turn + 1 < sess.turns:
            nxt = t + sess.thinks[r.turn]
            if nxt < self.spec.duration_s:
                self._push(nxt, 0, (r.sid, r.turn + 1))

    def _arrive(self, sid: int, turn: int) -> None:
        req = self._make_req(sid, turn, self.now)
        uid = self.policy(self, req)
        req.unit = uid
        self.out[uid] += 1
        u = self.units[uid]
        u.waiting.append(req)
        if not u.running:
            self._rephase(uid, self.now, 0)
        elif len(u.running) < self.model.max_num_seqs:
            # join at the end of the step in progress, if that comes before the next event
            tau = self.now - u.phase_start
            n = 0 if tau < u.d0 else 1 + int((tau - u.d0) / u.d)
            if n + 1 < u.k_next:
                u.version += 1
                u.k_next = n + 1
                self._push(u.phase_start + u.d0 + n * u.d, 1, (uid, u.version, n + 1))

    def run(self) -> dict[str, Any]:
        self._workload()
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            if kind == 0:
                self._arrive(*payload)
            else:
                uid, version, steps = payload
                if version == self.units[uid].version:
                    self._rephase(uid, t, steps)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        reqs = [r for r in self.done if r.arrival >= self.spec.warmup_s]
        ttft = np.array([r.ttft for r in reqs])
        chats = [r for r in reqs if r.turn > 0]
        span = max(r.done for r in self.done) if self.done else 0.0
        return {
            "units": self.n,
            "requests": len(reqs),
            "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else math.nan,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
            "ttft_max_s": float(ttft.max()) if len(ttft) else math.nan,
            "followup_cache_hit": (sum(r.cache_hit for r in chats) / len(chats)) if chats else 0.0,
            "output_tok_s": sum(r.output for r in self.done) / span if span else 0.0,
        }


def offered_rate(model: ServiceModel, spec: WorkloadSpec, units: int, utilization: float) -> float:
    """New sessions per second that load ``units`` units to ``utilization`` of their decode
    capacity at the base rate (before the peak hour and bursts; prefill not counted)."""
    tok_s = model.max_num_seqs / model.step(model.max_num_seqs)
    mean_out = (1 - spec.long_frac) * spec.short_tokens + spec.long_frac * spec.long_tokens
    turns = 1 + spec.chat_frac * spec.mean_extra_turns
    return utilization * units * tok_s / mean_out / turns


def simulate(n_units: int, policy: str, model: ServiceModel, spec: WorkloadSpec,
             seed: int = 0) -> dict[str, Any]:
    return Sim(n_units, policy, model, spec, seed).run()


def units_needed(policy: str, model: ServiceModel, spec: WorkloadSpec, *, target_p99_s: float = 1.0,
                 lo: int = 10, hi: int = 400, seed: int = 0) -> tuple[int | None, int]:
    """Fewest units with p99 TTFT below target (binary search; p99 falls as units grow).
    Returns (units or None if even ``hi`` misses, number of simulations run)."""
    runs = 0

    def ok(n: int) -> bool:
        nonlocal runs
        runs += 1
        return simulate(n, policy, model, spec, seed)["ttft_p99_s"] < target_p99_s

    if not ok(hi):
        return None, runs
    while hi - lo > max(1, lo // 50):  # 2 % resolution
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, runs


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--utilization", type=float, default=0.45,
                    help="base load as a share of the fleet's decode capacity (default %(default)s)")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--target", type=float, default=1.0, help="p99 TTFT target, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    if a.calibration.exists():
        model = ServiceModel.load(a.calibration)
        source = f"{a.calibration.name} (measured on the real engine)"
    else:
        model = ServiceModel()
        source = "built-in defaults (no calibration file)"
    spec = WorkloadSpec(duration_s=a.duration)
    spec = replace(spec, base_rate=offered_rate(model, spec, a.units, a.utilization))
    t0 = time.monotonic()
    rows = []
    for name in a.policies.split(","):
        r = simulate(a.units, name, model, spec, a.seed)
        need, runs = units_needed(name, model, spec, target_p99_s=a.target, lo=a.units // 2,
                                  hi=4 * a.units, seed=a.seed)
        r.update(policy=name, units_needed=need, search_runs=runs)
        rows.append(r)
        print(f"  {name}: p99 {r['ttft_p99_s']:.2f} s at {a.units} units; needs {need} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0

    print(f"Service model: {source}: step = {model.step_base_s * 1000:.1f} ms + "
          f"{model.step_per_seq_s * 1000:.2f} ms x batch + {model.prefill_per_token_s * 1e6:.0f} us x "
          f"new prompt tokens; max_num_seqs {model.max_num_seqs}; prefix cache "
          f"{model.cache_tokens} tokens/unit.")
    print(f"Traffic: {spec.duration_s:.0f} s, {spec.base_rate:.1f} new sessions/s "
          f"(= {a.utilization:.0%} of {a.units} units' decode capacity), x{spec.peak} peak in the "
          f"middle third, x{spec.burst} lightning-deal bursts of {spec.burst_s:.0f} s every "
          f"~{spec.burst_every_s:.0f} s; {spec.chat_frac:.0%} multi-turn chats; answers "
          f"{1 - spec.long_frac:.0%} short (~{spec.short_tokens}) / {spec.long_frac:.0%} long "
          f"(~{spec.long_tokens}) tokens; seed {a.seed}; {elapsed:.0f} s to simulate.\n")
    print(f"| policy | p50 TTFT @{a.units} | p99 TTFT @{a.units} | follow-up prefix-cache hits "
          f"| units for p99 TTFT < {a.target:g} s |")
    print("|---|---|---|---|---|")
    for r in rows:
        need = r["units_needed"] if r["units_needed"] is not None else f"> {4 * a.units}"
        print(f"| {r['policy']} | {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s | "
              f"{r['followup_cache_hit']:.0%} | {need} |")
    if a.json:
        a.json.write_text(json.dumps({"model": asdict(model), "spec": asdict(spec),
                                      "seed": a.seed, "rows": rows}, indent=1))
    return 0

