"""Admission that knows the SLO: refuse at once what cannot get its first answer text in time.

Past capacity an open queue makes every conversation late (measured: at twice capacity the
first answer token waited 12-50 s and goodput fell to half). A request that cannot meet the
SLO is better refused within milliseconds with a retryable error, so the ingress sends it to a
unit that can, or the client retries, and the requests this unit accepts stay in time.

The estimate comes from the unit's live queue. A new turn's first answer token waits for the
turns ahead of it that have not produced theirs yet (each needs a plan and an answer prefill)
and shares the cores with the turns still decoding, so

    estimate = base + per_waiting * waiting + per_decoding * decoding

with the three coefficients fitted online (recursive least squares with forgetting) to the
first-token latencies this unit measures, starting from priors in :class:`AdmissionSettings`.
Both the estimate and its error (estimate minus measured) are reported, so an operator sees
whether refusals rest on a good prediction. An idle unit never refuses.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rufus.errors import Unavailable


@dataclass(frozen=True)
class AdmissionSettings:
    """Defaults for one unit; each has a ``RUFUS_ASSISTANT_<NAME>`` environment override."""

    slo_s: float = 1.0          # first answer token (RUFUS_ASSISTANT_SLO_S); 0 turns admission off
    margin: float = 1.0         # refuse above margin * slo (RUFUS_ASSISTANT_MARGIN)
    base_s: float = 0.45        # prior: first answer token of a lone turn
    per_waiting_s: float = 0.25  # prior: added per turn ahead still waiting for its first token
    per_decoding_s: float = 0.02  # prior: added per turn decoding its answer
    # recursive least squares: weight of the past per observation, and how many observations
    # the priors count as. Slow on purpose: a just-started unit's first turns are slow (cold
    # prefix cache) and a fast fit then refused what the unit could serve (emulated AVX2,
    # 2/s: 0.98 and 20 gave 46% within the SLO, 0.995 and 50 gave 66%; docs/benchmarks.md)
    forgetting: float = 0.995
    prior_weight: float = 50.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AdmissionSettings:
        env = dict(os.environ if env is None else env)
        kw: dict[str, float] = {}
        for name in cls.__dataclass_fields__:
            raw = env.get(f"RUFUS_ASSISTANT_{name.upper()}")
            if raw is None or raw == "":
                continue
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"RUFUS_ASSISTANT_{name.upper()}={raw[:40]!r}: not a number"
                                 ) from None
            if value < 0 or (name == "forgetting" and not 0 < value <= 1):
                raise ValueError(f"RUFUS_ASSISTANT_{name.upper()}={value}: out of range")
            kw[name] = value
        return cls(**kw)


@dataclass
class _Fit:
    """Recursive least squares over features (1, waiting, decoding)."""

    theta: list[float]
    p: list[list[float]]
    forgetting: float

    @classmethod
    def with_prior(cls, s: AdmissionSettings) -> _Fit:
        w = 1.0 / max(s.prior_weight, 1e-6)
        return cls([s.base_s, s.per_waiting_s, s.per_decoding_s],
                   [[w if i == j else 0.0 for j in range(3)] for i in range(3)], s.forgetting)

    def predict(self, x: tuple[float, float, float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: tuple[float, float, float], y: float) -> None:
        px = [sum(self.p[i][j] * x[j] for j in range(3)) for i in range(3)]
        denom = self.forgetting + sum(x[i] * px[i] for i in range(3))
        k = [v / denom for v in px]
        err = y - self.predict(x)
        self.theta = [self.theta[i] + k[i] * err for i in range(3)]
        self.p = [[(self.p[i][j] - k[i] * px[j]) / self.forgetting for j in range(3)]
                  for i in range(3)]
        # keep the fit physical: a turn never makes another one faster
        self.theta = [max(self.theta[0], 0.0), max(self.theta[1], 0.0), max(self.theta[2], 0.0)]


@dataclass
class Ticket:
    """One admitted turn: tell the admission when its first answer text went out, and when
    it ended (always, from a ``finally``)."""

    owner: SloAdmission
    x: tuple[float, float, float]
    estimate_s: float
    started: float
    first: bool = False
    ended: bool = False

    def first_token(self) -> None:
        if not self.first and not self.ended:
            self.first = True
            self.owner._first(self)

    def done(self) -> None:
        if not self.ended:
            self.ended = True
            self.owner._done(self)


@dataclass
class SloAdmission:
    """The unit's admission for new turns. Thread-safe (the OpenAI frontend and the Triton
    stub call it from their event loops)."""

    settings: AdmissionSettings = field(default_factory=AdmissionSettings)
    clock: Callable[[], float] = time.monotonic
    on_estimate: Callable[[float], None] = lambda s: None      # each new turn's estimate
    on_error: Callable[[float], None] = lambda s: None         # estimate - measured, seconds

    def __post_init__(self) -> None:
        self.fit = _Fit.with_prior(self.settings)
        self.waiting = 0
        self.decoding = 0
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.slo_s > 0

    def _predict_now(self) -> float:
        """What a new turn would get with the queue as it is (caller holds the lock)."""
        return self.fit.predict((1.0, float(self.waiting), float(self.decoding)))

    def estimate(self) -> float:
        with self.lock:
            return self._predict_now()

    def admit(self) -> Ticket:
        """A ticket for a new turn, or :class:`~rufus.errors.Unavailable` (retryable) when
        the estimate says its first answer text would come after the SLO."""
        with self.lock:
            x = (1.0, float(self.waiting), float(self.decoding))
            est = self.fit.predict(x)
            limit = self.settings.margin * self.settings.slo_s
            if self.enabled and self.waiting > 0 and est > limit:
                refused = True
            else:
                refused = False
                self.waiting += 1
        self.on_estimate(est)
        if refused:
            raise Unavailable(
                f"overloaded: first answer text estimated in {est:.2f} s "
                f"({int(x[1])} turns waiting, {int(x[2])} answering), over the "
                f"{self.settings.slo_s:g} s SLO; retry on another unit")
        return Ticket(self, x, est, self.clock())

    def _first(self, t: Ticket) -> None:
        measured = self.clock() - t.started
        with self.lock:
            self.waiting -= 1
            self.decoding += 1
            self.fit.update(t.x, measured)
            now = self._predict_now()
        self.on_error(t.estimate_s - measured)
        self.on_estimate(now)

    def _done(self, t: Ticket) -> None:
        with self.lock:
            if t.first:
                self.decoding -= 1
            else:
                self.waiting -= 1
            now = self._predict_now()
        # the gauge always says what a new turn would get now (the unit agent routes on it),
        # not only what the last arrival was told
        self.on_estimate(now)
