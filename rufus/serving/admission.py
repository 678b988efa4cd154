"""Admission that knows the SLO: refuse at once what cannot be served in time.

Past capacity an open queue makes every request late (measured: at twice capacity the
assistant's first answer token waited 12-50 s and goodput fell to half). A request that
cannot meet its SLO is better refused within milliseconds with a retryable error, so the
ingress sends it to a unit that can, or the client retries, and the requests this unit
accepts stay in time. Each model that admits this way (the assistant: its first answer
text; the planner: the whole plan) keeps one :class:`SloAdmission` with its own defaults
and two variables, its SLO and margin (its settings module declares them); the fit's
priors are the code's, not an operator's knob.

The estimate comes from the model's live queue. A new request waits for the requests ahead
of it that have not reached the measured point yet, and shares the cores with those past it
(the assistant's turns still decoding their answers), so

    estimate = base + per_waiting * waiting + per_decoding * decoding

with the three coefficients fitted online (recursive least squares with forgetting) to the
latencies this model measures, starting from priors in :class:`AdmissionSettings`. A model
whose requests share its passes (the planner decodes up to a batch of plans per tree pass)
maps its queue to other features (:func:`shared_pass_features`): a plan joining a batch
with room costs little, one queued behind a full batch waits for a slot. Both the
estimate and its error (estimate minus measured) are reported, so an operator sees whether
refusals rest on a good prediction. An idle model never refuses.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rufus.errors import Unavailable

COLD_FACTOR = 1.5  # the limit's factor until ``warm_after`` requests are measured


@dataclass(frozen=True)
class AdmissionSettings:
    """One model's admission. These defaults are the assistant's; the planner's are in
    rufus/qp/settings.py. Operators set ``slo_s`` and ``margin`` only (:func:`with_limits`);
    the priors below are measured starting points the online fit moves from."""

    slo_s: float = 1.0          # the SLO (the assistant: first answer text); 0: admission off
    margin: float = 1.0         # refuse above margin * slo
    base_s: float = 0.45        # prior: latency of a lone request
    per_waiting_s: float = 0.25  # prior: added per request ahead still waiting
    per_decoding_s: float = 0.02  # prior: added per request past the measured point
    # recursive least squares: weight of the past per observation, and how many observations
    # the priors count as. Slow on purpose: a just-started unit's first turns are slow (cold
    # prefix cache) and a fast fit then refused what the unit could serve (measured with
    # AVX2 emulated: docs/benchmarks-history.md, "Answers that say only what the cards say")
    forgetting: float = 0.995
    prior_weight: float = 50.0
    # Until the fit has measured this many requests, refuse only above 1.5 times the limit:
    # the priors are one guess for every CPU class, and on a fast one a fresh unit refused
    # turns at 3 waiting on them (estimated 1.2 s) before it had measured any
    # (docs/benchmarks-history.md, "Repeated questions").
    warm_after: float = 20.0


def with_limits(defaults: AdmissionSettings, slo_s: float, margin: float) -> AdmissionSettings:
    """``defaults`` (a model's fit priors, fixed in its settings module) with the two values
    an operator sets: the SLO and the margin (each model declares their variables)."""
    return dataclasses.replace(defaults, slo_s=slo_s, margin=margin)


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
    """One admitted request: tell the admission when it reached the measured point (the
    assistant: its first answer text went out; the planner: the plan is done), and when it
    ended (always, from a ``finally``)."""

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


Features = Callable[[int, int], tuple[float, float, float]]


def queue_features(waiting: int, decoding: int) -> tuple[float, float, float]:
    """(1, waiting, decoding): each request ahead adds its own time (the assistant)."""
    return (1.0, float(waiting), float(decoding))


def shared_pass_features(batch: int) -> Features:
    """(1, plans sharing the new one's passes, plans queued beyond a full batch): with
    ``batch`` plans decoded per pass, the first ``batch - 1`` ahead share its passes (each
    makes a pass a little slower) and only the rest make it wait for a slot. The planner's
    requests have no second phase, so ``decoding`` counts as ahead too."""
    room = max(int(batch), 1) - 1

    def features(waiting: int, decoding: int) -> tuple[float, float, float]:
        ahead = waiting + decoding
        return (1.0, float(min(ahead, room)), float(max(ahead - room, 0)))

    return features


@dataclass
class SloAdmission:
    """One model's admission for new requests. Thread-safe (the OpenAI frontend, the Triton
    stub's execute thread and its event loops call it)."""

    settings: AdmissionSettings = field(default_factory=AdmissionSettings)
    clock: Callable[[], float] = time.monotonic
    on_estimate: Callable[[float], None] = lambda s: None      # each new request's estimate
    on_error: Callable[[float], None] = lambda s: None         # estimate - measured, seconds
    # the refusal's words: what is estimated, and the queue (``{waiting}``, ``{decoding}``)
    what: str = "first answer text"
    queue: str = "{waiting} turns waiting, {decoding} answering"
    # the queue as the fit's features (queue_features; the planner: shared_pass_features)
    features: Features = queue_features

    def __post_init__(self) -> None:
        self.fit = _Fit.with_prior(self.settings)
        self.waiting = 0
        self.decoding = 0
        self.measured = 0  # requests whose measured point fed the fit
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.slo_s > 0

    def _predict_now(self) -> float:
        """What a new request would get with the queue as it is (caller holds the lock)."""
        return self.fit.predict(self.features(self.waiting, self.decoding))

    def estimate(self) -> float:
        with self.lock:
            return self._predict_now()

    def admit(self, slo_s: float | None = None) -> Ticket:
        """A ticket for a new request, or :class:`~rufus.errors.Unavailable` (retryable) when
        the estimate says it would be served after the SLO: the model's, or ``slo_s``, the
        latency this request says it accepts (the planner's ``slo_ms`` parameter)."""
        slo = self.settings.slo_s if slo_s is None else slo_s
        with self.lock:
            ahead = (self.waiting, self.decoding)
            x = self.features(*ahead)
            est = self.fit.predict(x)
            limit = self.settings.margin * slo
            if self.measured < self.settings.warm_after:  # the estimate is still the priors'
                limit *= COLD_FACTOR
            if self.enabled and self.waiting > 0 and est > limit + 1e-9:  # 0.2 + 0.1 is 0.3
                refused = True
            else:
                refused = False
                self.waiting += 1
        self.on_estimate(est)
        if refused:
            queue = self.queue.format(waiting=ahead[0], decoding=ahead[1])
            raise Unavailable(f"overloaded: {self.what} estimated in {est:.2f} s ({queue}), "
                              f"over the {slo:g} s SLO; retry on another unit")
        return Ticket(self, x, est, self.clock())

    def _first(self, t: Ticket) -> None:
        measured = self.clock() - t.started
        with self.lock:
            self.waiting -= 1
            self.decoding += 1
            self.fit.update(t.x, measured)
            self.measured += 1
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
        # the gauge always says what a new request would get now (the unit agent routes on it),
        # not only what the last arrival was told
        self.on_estimate(now)
