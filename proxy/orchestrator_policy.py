"""The multi-region traffic policy: per-region signals in, each region's share of global traffic out.

Pure (no I/O, no clock, no randomness): the orchestrator process (proxy/orchestrator.py),
the Prime Day simulation (lab/region_sim.py) and the unit tests run the very same
decisions, so what the simulation shows is what production does.

One round, :func:`decide`:

1. **Fail-out at once.** A region that is not *up* (its ingress or every agent unreachable, or
   no healthy unit) drops to share 0 in this round, whatever the step bound: every request
   sent there would fail. Its share goes to the regions with headroom (or, if none has any,
   by baseline: it has to go somewhere).
2. **Shed under pressure.** A region whose first-token p99 is above the SLA or whose load
   (outstanding / (healthy units x slots)) is above ``load_high`` gives up ``max_step`` points
   per round to regions with headroom, once the signal has held ``persist_rounds`` rounds
   or exceeds its threshold by a jump band (hysteresis: one noisy round moves nothing). A
   receiver takes at most what keeps its load in the middle of the band (taking load to
   grow with share), so it does not shed the points straight back; a shed no region can
   take is not made (moving load onto full regions only spreads the damage).
3. **Come back gradually.** A failed region must be up ``return_after_rounds`` rounds before it
   gets traffic, then gains at most ``return_step`` points a round; a region that shed and has
   since been *cool* (load below ``load_low`` and p99 well under the SLA) for
   ``restore_after_rounds`` rounds takes back up to ``max_step`` points a round (no more than
   its room, as a receiver), both from regions holding more than their baseline. Slower up
   than down, on purpose: a region whose own pinned traffic is still high must not be handed
   back the share it just shed. A region between ``load_low`` and ``load_high`` holds:
   that band is the hysteresis that keeps shares from flapping.

The resting point is the operator's baseline, scaled by each region's healthy fraction
(a region with half its units down is worth half its baseline). Shares are integers that
always sum to 100 (HAProxy weights 0..256 take them as they are); every region gets a
reason string every round, and every change has a ``kind`` for metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

TOTAL = 100


# ----------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class RegionSignals:
    """What monitoring says about one region this round (``None``: not known this round)."""

    name: str
    baseline: float  # operator-set share; any positive scale, normalized over regions
    healthy_units: int
    total_units: int
    reachable: bool = True  # its ingress / agents answered
    load: float | None = None  # outstanding / (healthy units x slots per unit); > 1 queues
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_samples: float | None = None  # first tokens behind p50/p99 (None: not known)
    detail: str = ""  # why it is unreachable or unhealthy, for the reason string

    @property
    def up(self) -> bool:
        return self.reachable and self.healthy_units > 0

    def down_reason(self) -> str:
        if not self.reachable:
            return f"unreachable ({self.detail})" if self.detail else "unreachable"
        why = f"no healthy unit (0/{self.total_units})"
        return f"{why}: {self.detail}" if self.detail else why


@dataclass(frozen=True)
class PolicyConfig:
    """Thresholds and step bounds; the defaults are the orchestrator's."""

    sla_ttft_p99_s: float = 1.0
    load_high: float = 0.85  # above: the region sheds
    load_low: float = 0.6  # below (and p99 well under the SLA): the region is cool
    cool_ttft_fraction: float = 0.8  # cool needs p99 below this fraction of the SLA
    persist_rounds: int = 2  # a signal must hold this many rounds before it moves share...
    jump_load: float = 0.15  # ...unless load exceeds load_high by this much (past 1: a queue)
    jump_ttft: float = 1.5  # ...or p99 exceeds this multiple of the SLA
    max_step: int = 10  # points a region gains or loses per round (fail-out excepted)
    return_step: int = 5  # points a failed region gains per round once back
    return_after_rounds: int = 3  # rounds a failed region must be up before traffic returns
    restore_after_rounds: int = 3  # rounds a region that shed must be cool before it takes back
    dead_band: int = 3  # a region within this many points of its baseline is not restored
    min_ttft_samples: int = 20  # a p99 over fewer first tokens is one slow request: not a signal

    def __post_init__(self) -> None:
        problems = []
        if not self.sla_ttft_p99_s > 0:
            problems.append("sla_ttft_p99_s must be > 0")
        if not 0 < self.load_low < self.load_high:
            problems.append("need 0 < load_low < load_high (the band between is the hysteresis)")
        if not 0 < self.cool_ttft_fraction <= 1:
            problems.append("cool_ttft_fraction must be in (0, 1]")
        if self.persist_rounds < 1 or self.restore_after_rounds < 1 or self.return_after_rounds < 0:
            problems.append("persist_rounds >= 1, restore_after_rounds >= 1, return_after_rounds >= 0")
        if not 1 <= self.max_step <= TOTAL or not 1 <= self.return_step <= TOTAL:
            problems.append(f"max_step and return_step must be in 1..{TOTAL}")
        if not 0 <= self.dead_band < TOTAL:
            problems.append(f"dead_band must be in 0..{TOTAL - 1}")
        if self.min_ttft_samples < 0:
            problems.append("min_ttft_samples must be >= 0")
        if self.jump_load < 0 or self.jump_ttft < 1:
            problems.append("jump_load >= 0 and jump_ttft >= 1")
        if problems:
            raise ValueError("policy: " + "; ".join(problems))


# ----------------------------------------------------------------------- state and outputs
@dataclass(frozen=True)
class RegionState:
    hot_rounds: int = 0  # consecutive rounds with p99 over the SLA or load over load_high
    cool_rounds: int = 0  # consecutive rounds cool
    up_rounds: int = 0  # consecutive rounds up
    returning: bool = False  # failed out and not yet back near its baseline


@dataclass(frozen=True)
class PolicyState:
    shares: dict[str, int]
    regions: dict[str, RegionState] = field(default_factory=dict)
    rounds: int = 0


@dataclass(frozen=True)
class Change:
    region: str
    before: int
    after: int
    kind: str
    reason: str


@dataclass(frozen=True)
class Decision:
    """One round's outcome: new shares, and for every region what it did and why."""

    before: dict[str, int]
    shares: dict[str, int]
    kinds: dict[str, str]
    reasons: dict[str, str]
    state: PolicyState

    @property
    def changed(self) -> bool:
        return self.shares != self.before

    def changes(self) -> list[Change]:
        return [Change(n, self.before[n], self.shares[n], self.kinds[n], self.reasons[n])
                for n in self.shares if self.shares[n] != self.before[n]]

    def summary(self) -> str:
        """One line an operator can act on: every change with its reason, or why nothing moved."""
        ch = self.changes()
        if ch:
            return "; ".join(f"{c.region} {c.before}->{c.after} {c.reason}" for c in ch)
        return "hold: " + "; ".join(f"{n} {self.shares[n]} {self.reasons[n]}" for n in self.shares)


# ----------------------------------------------------------------------- integer shares
def apportion(total: int, weights: Mapping[str, float],
              caps: Mapping[str, int] | None = None) -> dict[str, int]:
    """``total`` points split in proportion to ``weights`` (Sainte-Laguë: one point at a time
    to the highest weight / (2 x points + 1)), no key above its cap; keys with weight 0 get
    nothing. The sum is ``total`` unless the caps leave less room. Ties go by key, so the
    result is deterministic."""
    alloc = {k: 0 for k in weights}
    caps = caps or {}
    for _ in range(max(total, 0)):
        best, best_q = None, 0.0
        for k in sorted(weights):
            w = weights[k]
            if w <= 0 or alloc[k] >= caps.get(k, TOTAL * 1000):
                continue
            q = w / (2 * alloc[k] + 1)
            if q > best_q:
                best, best_q = k, q
        if best is None:
            break
        alloc[best] += 1
    return alloc


def baseline_shares(baselines: Mapping[str, float]) -> dict[str, int]:
    return apportion(TOTAL, baselines)


def initial_state(baselines: Mapping[str, float], shares: Mapping[str, int] | None = None
                  ) -> PolicyState:
    """Start from ``shares`` (e.g. the weights the global ingress has now, after a restart
    of the orchestrator) when they cover the regions and sum to something, else from the
    baselines."""
    if shares and set(shares) == set(baselines) and sum(shares.values()) > 0:
        start = apportion(TOTAL, {k: float(v) for k, v in shares.items()})
    else:
        start = baseline_shares(baselines)
    return PolicyState(shares=start, regions={k: RegionState() for k in baselines})


# ----------------------------------------------------------------------- signals
def _pressure(s: RegionSignals, cfg: PolicyConfig) -> tuple[str, str, bool] | None:
    """(kind, reason, severe) when the region is over the SLA or over ``load_high`` now;
    severe when either signal is beyond its jump band."""
    ttft_hot = s.ttft_p99_s is not None and s.ttft_p99_s > cfg.sla_ttft_p99_s
    load_hot = s.load is not None and s.load > cfg.load_high
    if not ttft_hot and not load_hot:
        return None
    severe = (s.ttft_p99_s is not None and s.ttft_p99_s > cfg.jump_ttft * cfg.sla_ttft_p99_s) or \
        (s.load is not None and s.load > cfg.load_high + cfg.jump_load)
    if ttft_hot:
        extra = f", load {s.load:.2f}" if s.load is not None else ""
        return ("shed_ttft", f"ttft p99 {s.ttft_p99_s:.2f} s > SLA {cfg.sla_ttft_p99_s:.2f} s"
                f"{extra}", severe)
    return "shed_load", f"load {s.load:.2f} > {cfg.load_high:.2f}", severe


def _cool(s: RegionSignals, cfg: PolicyConfig) -> bool:
    """Clearly below capacity: needs at least one known signal, and none that disagrees."""
    if s.load is None and s.ttft_p99_s is None:
        return False
    load_ok = s.load is None or s.load < cfg.load_low
    ttft_ok = s.ttft_p99_s is None or s.ttft_p99_s < cfg.cool_ttft_fraction * cfg.sla_ttft_p99_s
    return load_ok and ttft_ok


def _signals_text(s: RegionSignals) -> str:
    parts = [f"{s.healthy_units}/{s.total_units} units"]
    if s.load is not None:
        parts.append(f"load {s.load:.2f}")
    if s.ttft_p99_s is not None:
        parts.append(f"ttft p99 {s.ttft_p99_s:.2f} s")
    return ", ".join(parts)


def _room(s: RegionSignals, share: int, cfg: PolicyConfig) -> int:
    """Points a region can take without leaving the hysteresis band: its load is taken to
    grow in proportion to its share (conservative: pinned traffic does not grow) up to the
    middle of the band, so a receiver is not pushed to the edge where it would shed the
    points straight back. Unknown load or a p99 already near the SLA: no room."""
    if s.load is None:
        return 0
    if s.ttft_p99_s is not None and s.ttft_p99_s >= cfg.cool_ttft_fraction * cfg.sla_ttft_p99_s:
        return 0
    target = (cfg.load_low + cfg.load_high) / 2
    if s.load >= target:
        return 0
    if s.load < 0.05:
        return TOTAL
    if share <= 0:  # its load is all pinned traffic: no way to tell what a point adds; probe
        return cfg.return_step if s.load < cfg.load_low else 0
    return int(share * (target - s.load) / s.load)


def _headroom(s: RegionSignals, cfg: PolicyConfig) -> float:
    """Room to take more traffic, in units of capacity: healthy units x (load_high - load).
    Unknown load counts as half-way between the band edges."""
    load = s.load if s.load is not None else (cfg.load_low + cfg.load_high) / 2
    return s.healthy_units * max(cfg.load_high - load, 0.0)


# ----------------------------------------------------------------------- the round
def decide(signals: Sequence[RegionSignals], state: PolicyState,
           cfg: PolicyConfig = PolicyConfig()) -> Decision:
    """One round: new shares (integers summing to 100) with a kind and a reason per region."""
    # a p99 over a handful of first tokens is the slowest one of them: not acted on
    signals = [replace(s, ttft_p50_s=None, ttft_p99_s=None)
               if s.ttft_samples is not None and s.ttft_samples < cfg.min_ttft_samples else s
               for s in signals]
    names = [s.name for s in signals]
    if len({s.name for s in signals}) != len(names):
        raise ValueError(f"region names must be unique: {names}")
    before = {n: int(state.shares.get(n, 0)) for n in names}
    if sum(before.values()) != TOTAL:  # a region added or removed: start from what is known
        before = apportion(TOTAL, {n: float(before[n]) or 1e-9 for n in names})
    r = _Round(cfg, signals, state, before)
    if not r.up:
        r.hold_all_down()
        return _done(before, r.shares, r.kinds, r.reasons, r.regions, state)
    r.wait_for_return()
    failed, failed_from = r.fail_out()
    shed = r.sheds()
    r.find_receivers()
    if failed:
        r.place_failed(failed, failed_from)
    if shed:
        r.place_sheds(shed)
    if not failed and not any(shed.values()):
        r.restore()
    r.name_receivers()
    r.hold_the_rest()
    return _done(before, r.shares, r.kinds, r.reasons, r.regions, state)


class _Round:
    """One round of :func:`decide` as it goes: the region streaks, the shares as they move,
    and for every region what it did (``kinds``) and why (``reasons``). Each method is one
    step of the module docstring's rules, run in that order."""

    def __init__(self, cfg: PolicyConfig, signals: Sequence[RegionSignals], state: PolicyState,
                 before: dict[str, int]) -> None:
        self.cfg = cfg
        self.by_name = {s.name: s for s in signals}
        self.names = [s.name for s in signals]
        self.shares = dict(before)
        self.kinds: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.up = [n for n in self.names if self.by_name[n].up]
        # 1. streaks
        self.regions: dict[str, RegionState] = {}
        self.pressure: dict[str, tuple[str, str, bool] | None] = {}
        for s in signals:
            rs = state.regions.get(s.name, RegionState())
            p = _pressure(s, cfg) if s.up else None
            self.pressure[s.name] = p
            self.regions[s.name] = RegionState(
                hot_rounds=rs.hot_rounds + 1 if p else 0,
                cool_rounds=rs.cool_rounds + 1 if s.up and _cool(s, cfg) else 0,
                up_rounds=rs.up_rounds + 1 if s.up else 0,
                returning=rs.returning or not s.up,
            )
        self.waiting: set[str] = set()
        self.base: dict[str, int] = {}
        self.receivers: list[str] = []
        self.headroom: dict[str, float] = {}
        self.gain_cap: dict[str, int] = {}
        self.gained: dict[str, int] = {}
        self.sources: dict[str, list[str]] = {}

    def hold_all_down(self) -> None:
        for n in self.names:
            self.kinds[n] = "hold_all_down"
            self.reasons[n] = (f"every region is down, holding the last shares "
                               f"({self.by_name[n].down_reason()})")

    def wait_for_return(self) -> None:
        """The resting point (baseline x healthy fraction); a failed region waits, at 0,
        until it has been up long enough."""
        cfg, by_name, regions = self.cfg, self.by_name, self.regions
        base_w = {n: by_name[n].baseline * by_name[n].healthy_units / max(by_name[n].total_units, 1)
                  for n in self.up}
        self.base = apportion(TOTAL, base_w) if sum(base_w.values()) > 0 else apportion(
            TOTAL, {n: 1.0 for n in self.up})
        self.waiting = {n for n in self.up if regions[n].returning and self.shares[n] == 0
                        and regions[n].up_rounds <= cfg.return_after_rounds}
        for n in self.waiting:
            self.kinds[n] = "waiting_return"
            self.reasons[n] = (f"back up {regions[n].up_rounds}/{cfg.return_after_rounds + 1} "
                               f"rounds before traffic returns ({_signals_text(by_name[n])})")

    def fail_out(self) -> tuple[int, list[str]]:
        """2. Every point of a region that is not up moves now: (points, from where)."""
        failed = 0
        failed_from = []
        for n in self.names:
            s = self.by_name[n]
            if s.up:
                continue
            if self.shares[n] > 0:
                failed += self.shares[n]
                failed_from.append(f"{n} (fail-out)")
                self.kinds[n] = "fail_out"
                self.reasons[n] = f"fail-out: {s.down_reason()}"
                self.shares[n] = 0
            else:
                self.kinds[n] = "out"
                self.reasons[n] = f"out: {s.down_reason()}"
        return failed, failed_from

    def sheds(self) -> dict[str, int]:
        """3. Confirmed pressure gives up to ``max_step`` points: points per shedder."""
        cfg = self.cfg
        shed: dict[str, int] = {}
        for n in self.up:
            p = self.pressure[n]
            if p is None or n in self.waiting:
                continue
            kind, why, severe = p
            rounds = self.regions[n].hot_rounds
            if rounds < cfg.persist_rounds and not severe:
                self.kinds[n] = "hold_unconfirmed"
                self.reasons[n] = f"{why}, {rounds}/{cfg.persist_rounds} rounds: not yet acting"
                continue
            when = ("at once (beyond the jump band)" if rounds < cfg.persist_rounds
                    else f"for {rounds} rounds")
            self.kinds[n] = kind
            if self.shares[n] == 0:
                self.reasons[n] = f"{why} {when}, share already 0"
                continue
            shed[n] = min(cfg.max_step, self.shares[n])
            self.reasons[n] = f"shed: {why} {when}"
        return shed

    def find_receivers(self) -> None:
        """The regions that may take points: up, under no pressure, not waiting."""
        self.receivers = [n for n in self.up if self.pressure[n] is None and n not in self.waiting]
        self.headroom = {n: _headroom(self.by_name[n], self.cfg) for n in self.receivers}
        # a region coming back takes at most return_step a round, whatever the source
        self.gain_cap = {n: (self.cfg.return_step if self.regions[n].returning
                             else self.cfg.max_step) for n in self.receivers}
        self.gained = dict.fromkeys(self.up, 0)
        self.sources = {n: [] for n in self.up}

    def _give(self, got: Mapping[str, int], sources: list[str]) -> None:
        for n, g in got.items():
            if g:
                self.shares[n] += g
                self.gained[n] += g
                self.sources[n].extend(sources)

    def place_failed(self, failed: int, failed_from: list[str]) -> None:
        """4a. A failed region's share goes now, by headroom (by baseline if nobody has room)."""
        receivers, base = self.receivers, self.base
        w = (self.headroom if sum(self.headroom.values()) > 0
             else {n: float(base[n]) for n in receivers})
        if not receivers:  # every up region is under pressure or waiting: still must go
            w = {n: float(base[n]) for n in self.up}
        self._give(apportion(failed, w), failed_from)

    def place_sheds(self, shed: dict[str, int]) -> None:
        """4b. Sheds go to regions with headroom, at most max_step each; what finds no room
        stays with its shedder."""
        total_shed = sum(shed.values())
        room = {n: min(max(self.gain_cap[n] - self.gained[n], 0),
                       _room(self.by_name[n], self.shares[n], self.cfg))
                for n in self.receivers if self.headroom[n] > 0}
        room = {n: v for n, v in room.items() if v > 0}
        got = apportion(total_shed, {n: self.headroom[n] for n in room}, room)
        placed = sum(got.values())
        if placed < total_shed:  # give the unplaced points back to the shedders
            back = apportion(total_shed - placed, {n: float(v) for n, v in shed.items()}, shed)
            for n in shed:
                shed[n] -= back[n]
        shed_names = [f"{n} ({self.kinds[n].removeprefix('shed_')})" for n in shed if shed[n] > 0]
        for n, v in shed.items():
            self.shares[n] -= v
            if v == 0:
                self.kinds[n] = "hold_no_headroom"
                self.reasons[n] = (self.reasons[n].replace("shed: ", "")
                                   + ": no region has headroom, holding")
        self._give(got, shed_names)

    def restore(self) -> None:
        """4c. Returning or cooled-down regions below baseline take points back from regions
        above theirs (only in rounds without a fail-out or a shed: one move at a time)."""
        cfg, base, shares, regions = self.cfg, self.base, self.shares, self.regions
        want: dict[str, int] = {}
        for n in self.receivers:
            rs = regions[n]
            gap = base[n] - shares[n]
            if rs.returning and gap > 0:
                want[n] = min(cfg.return_step, gap)
            elif gap > cfg.dead_band and rs.cool_rounds >= cfg.restore_after_rounds:
                want[n] = min(cfg.max_step, gap, _room(self.by_name[n], shares[n], cfg))
        want = {n: v for n, v in want.items() if v > 0}
        excess = {n: min(shares[n] - base[n], cfg.max_step) for n in self.up
                  if n not in want and shares[n] > base[n]}
        need = sum(want.values())
        if not (need and excess):
            return
        take = apportion(min(need, sum(excess.values())),
                         {n: float(v) for n, v in excess.items()}, excess)
        give = apportion(sum(take.values()), {n: float(v) for n, v in want.items()}, want)
        donors = [n for n, v in take.items() if v]
        for n, v in take.items():
            if v:
                shares[n] -= v
                self.kinds[n] = "donate"
                self.reasons[n] = (f"gives {v} back (above its baseline {base[n]}; "
                                   f"{_signals_text(self.by_name[n])})")
        for n, v in give.items():
            if v:
                shares[n] += v
                kind = self.kinds[n] = "return" if regions[n].returning else "restore"
                what = ("back after fail-out" if regions[n].returning
                        else f"cool for {regions[n].cool_rounds} rounds")
                self.reasons[n] = (f"{kind}: +{v} toward baseline {base[n]} ({what}; "
                                   f"{_signals_text(self.by_name[n])}; from {', '.join(donors)})")

    def name_receivers(self) -> None:
        """Every region that gained says from where; a returning region is back once it is
        near its baseline."""
        for n in self.up:
            if self.gained.get(n):
                self.kinds[n] = "receive"
                self.reasons[n] = (f"receive +{self.gained[n]} from "
                                   f"{', '.join(dict.fromkeys(self.sources[n]))}: "
                                   f"headroom ({_signals_text(self.by_name[n])})")
        for n in self.up:
            rs = self.regions[n]
            if rs.returning and self.shares[n] >= self.base[n] - self.cfg.dead_band \
                    and n not in self.waiting:
                self.regions[n] = replace(rs, returning=False)

    def hold_the_rest(self) -> None:
        """Every region nothing above moved holds, with why."""
        for n in self.names:
            if n in self.kinds:
                continue
            s = self.by_name[n]
            self.kinds[n] = "hold"
            if s.up and self.shares[n] < self.base[n] - self.cfg.dead_band:
                base, cool = self.base[n], self.regions[n].cool_rounds
                self.reasons[n] = (f"hold below baseline {base}: cool {cool}/"
                                   f"{self.cfg.restore_after_rounds} rounds ({_signals_text(s)})"
                                   if cool else
                                   f"hold below baseline {base} until cool ({_signals_text(s)})")
            else:
                self.reasons[n] = f"hold ({_signals_text(s)})" if s.up else self.reasons.get(n, "out")


def _done(before: dict[str, int], shares: dict[str, int], kinds: dict[str, str],
          reasons: dict[str, str], regions: dict[str, RegionState], state: PolicyState) -> Decision:
    total = sum(shares.values())
    if total != TOTAL or any(v < 0 for v in shares.values()):  # an invariant, not an input error
        raise AssertionError(f"shares must be >= 0 and sum to {TOTAL}: {shares}")
    return Decision(before=before, shares=shares, kinds=kinds, reasons=reasons,
                    state=PolicyState(shares=dict(shares), regions=regions,
                                      rounds=state.rounds + 1))


def ttft_quantile(buckets: Sequence[tuple[float, float]], q: float,
                  floor: float = 0.0) -> float | None:
    """Quantile from cumulative histogram buckets ``[(le, count), ...]`` (Prometheus's
    ``histogram_quantile``: linear within the bucket; the +Inf bucket answers with the
    highest finite bound). ``floor``: the lowest bucket's lower bound (0 for latencies; a
    histogram of signed values passes its lowest bound). None without observations."""
    pts = sorted(buckets)
    if not pts or pts[-1][1] <= 0:
        return None
    total = pts[-1][1]
    rank = q * total
    prev_le, prev_c = floor, 0.0
    for le, c in pts:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le
