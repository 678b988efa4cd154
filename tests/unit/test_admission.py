"""SLO-aware admission (rufus/serving/admission.py) against fake queues and a fake clock: the
assistant's and the planner's."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rufus.errors import Unavailable
from rufus.serving.admission import AdmissionSettings, SloAdmission


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_idle_unit_always_admits_and_a_queue_is_refused_by_its_estimate():
    s = AdmissionSettings(slo_s=1.0, margin=0.9, base_s=0.4, per_waiting_s=0.3, per_decoding_s=0.0,
                          warm_after=0)
    estimates: list[float] = []
    adm = SloAdmission(s, clock=Clock(), on_estimate=estimates.append)
    tickets = [adm.admit()]                      # 0 waiting: 0.4 s
    tickets.append(adm.admit())                  # 1 waiting: 0.7 s
    with pytest.raises(Unavailable) as err:      # 2 waiting: 1.0 s > 0.9 s
        adm.admit()
    assert err.value.retryable and "1.00 s" in err.value.message and "2 turns waiting" in err.value.message
    assert estimates == pytest.approx([0.4, 0.7, 1.0])
    assert adm.waiting == 2
    tickets[0].first_token()
    assert (adm.waiting, adm.decoding) == (1, 1)
    adm.admit().done()                           # room again: admitted, then ended unanswered
    for t in tickets:
        t.done()
        t.done()                                 # idempotent
    assert (adm.waiting, adm.decoding) == (0, 0)


def test_the_gauge_follows_the_queue_as_turns_progress_not_only_arrivals():
    """The unit agent routes on the estimate gauge: after a burst drains it must fall back
    to what a new turn would get now, without waiting for the next arrival."""
    s = AdmissionSettings(slo_s=1.0, base_s=0.4, per_waiting_s=0.3, per_decoding_s=0.1,
                          prior_weight=1e9)  # the priors stay put: the queue alone moves it
    seen: list[float] = []
    adm = SloAdmission(s, clock=Clock(), on_estimate=seen.append)
    a, b = adm.admit(), adm.admit()             # told 0.4, 0.7
    a.first_token()                             # 1 waiting, 1 decoding: 0.8
    a.done()                                    # 1 waiting: 0.7
    b.done()                                    # idle: 0.4
    assert seen == pytest.approx([0.4, 0.7, 0.8, 0.7, 0.4], abs=1e-6)


def test_until_the_fit_has_measured_enough_turns_it_refuses_only_at_the_cold_limit():
    """The priors are one guess for every CPU class: a fresh unit refuses on them only what
    is estimated past 1.5 x the SLO, until ``warm_after`` turns have been measured."""
    clock = Clock()
    s = AdmissionSettings(slo_s=1.0, base_s=0.4, per_waiting_s=0.35, per_decoding_s=0.0,
                          prior_weight=1e9, warm_after=2)
    adm = SloAdmission(s, clock=clock)
    held = [adm.admit() for _ in range(4)]       # 0.4 ... 1.45 s: all under 1.5 x 1.0 s
    with pytest.raises(Unavailable):             # 4 waiting: 1.8 s
        adm.admit()
    for t in held[:2]:                           # two turns measured: warm
        t.first_token()
        t.done()
    with pytest.raises(Unavailable):             # 2 waiting: 1.1 s > 1.0 s
        adm.admit()
    for t in held[2:]:
        t.done()


def test_even_a_slow_lone_turn_is_admitted():
    adm = SloAdmission(AdmissionSettings(base_s=5.0), clock=Clock())
    adm.admit()  # nothing ahead: refusing would only send it to a unit no faster


def test_the_estimate_learns_the_unit_it_measures_and_reports_its_error():
    """A unit twice as slow per queued turn as the prior: after some turns the estimate
    follows the measured latencies and its error shrinks."""
    clock = Clock()
    errors: list[float] = []
    adm = SloAdmission(AdmissionSettings(slo_s=100.0, base_s=0.2, per_waiting_s=0.1,
                                         per_decoding_s=0.0, prior_weight=2),
                       clock=clock, on_error=errors.append)
    for _ in range(60):
        held = [adm.admit() for _ in range(3)]   # 0, 1, 2 waiting ahead
        for k, t in enumerate(held):             # the truth: 0.5 s + 0.4 s per turn ahead
            clock.t += 0.5 if k == 0 else 0.4
            t.first_token()
        for t in held:
            t.done()
    base, per_waiting, _ = adm.fit.theta
    assert base == pytest.approx(0.5, abs=0.05) and per_waiting == pytest.approx(0.4, abs=0.05)
    assert abs(errors[0]) > 0.2 and max(abs(e) for e in errors[-9:]) < 0.05


def test_off_when_the_slo_is_zero():
    adm = SloAdmission(AdmissionSettings(slo_s=0.0, base_s=9.0), clock=Clock())
    for _ in range(10):
        adm.admit()


def test_settings_from_the_environment_name_the_variable():
    from rufus.assistant.settings import read_admission as read_assistant

    s = read_assistant({"RUFUS_ASSISTANT_SLO_S": "0.8", "RUFUS_ASSISTANT_MARGIN": "1"})
    assert s.slo_s == 0.8 and s.margin == 1.0 and s.base_s == AdmissionSettings().base_s
    with pytest.raises(ValueError, match="RUFUS_ASSISTANT_SLO_S"):
        read_assistant({"RUFUS_ASSISTANT_SLO_S": "fast"})
    with pytest.raises(ValueError, match="RUFUS_ASSISTANT_MARGIN"):
        read_assistant({"RUFUS_ASSISTANT_MARGIN": "-0.5"})
    # the fit's priors are no operator's knob (retired variables): ignored
    assert read_assistant({"RUFUS_ASSISTANT_FORGETTING": "0"}) == AdmissionSettings()


def test_the_pipeline_refuses_before_any_model_call():
    """Through the library: a refused turn raises Unavailable at its first step, calls no
    model, and is counted; an admitted turn's ticket is returned when it ends."""
    from rufus.assistant.pipeline import Assistant, NullMetrics
    from rufus.retrieval.catalog_data import default_catalog
    from rufus.retrieval.sqlite_fts import SqliteFtsRetriever

    class Streams:
        calls: list[str] = []

        async def stream(self, model, tensors, conversation=None, parameters=None, trace=None):
            self.calls.append(model)
            await asyncio.sleep(3600)
            yield {}

    counted: list[tuple[str, str]] = []
    metrics = NullMetrics()
    metrics.count = lambda outcome, path: counted.append((outcome, path))  # type: ignore[method-assign]
    adm = SloAdmission(AdmissionSettings(base_s=0.5, per_waiting_s=1.0, warm_after=0),
                       clock=Clock())
    a = Assistant("x", SqliteFtsRetriever.build(list(default_catalog())), metrics=metrics,
                  admission=adm)
    streams = Streams()
    a.streams = lambda: streams  # type: ignore[method-assign]

    async def go() -> None:
        first = a.stream("running shoes")
        task = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0.01)                 # the first turn is planning (hangs)
        assert adm.waiting == 1
        with pytest.raises(Unavailable):
            await a.stream("tv").__anext__()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await first.aclose()

    asyncio.run(go())
    assert streams.calls == ["rufus_qp_medusa"]
    assert ("unavailable", "none") in counted
    assert (adm.waiting, adm.decoding) == (0, 0)


def test_a_request_may_accept_a_longer_latency_than_the_slo():
    """The planner's ``slo_ms``: the assistant's plans (admitted by the turn's own admission)
    are not refused by the planner's 300 ms SLO; a stricter one is refused earlier."""
    s = AdmissionSettings(slo_s=0.3, base_s=0.2, per_waiting_s=0.1, per_decoding_s=0.0,
                          warm_after=0)
    adm = SloAdmission(s, clock=Clock(), what="plan", queue="{waiting} plans in flight")
    held = [adm.admit(), adm.admit()]            # 0.2 s, 0.3 s: within 0.3 s
    with pytest.raises(Unavailable) as err:      # 0.4 s
        adm.admit()
    assert err.value.message.startswith("overloaded: plan estimated in 0.40 s (2 plans in flight")
    assert "over the 0.3 s SLO" in err.value.message
    held.append(adm.admit(slo_s=10.0))           # accepts 10 s: admitted
    with pytest.raises(Unavailable, match=r"over the 0\.25 s SLO"):
        adm.admit(slo_s=0.25)
    for t in held:
        t.first_token()                          # the plan is done
        t.done()
    assert (adm.waiting, adm.decoding) == (0, 0)
    off = SloAdmission(AdmissionSettings(slo_s=0.0, base_s=5.0))
    for _ in range(3):
        off.admit(slo_s=0.001)                   # admission off: a request cannot turn it on


def test_admission_settings_read_their_prefix_and_keep_their_defaults():
    from rufus.qp.settings import ADMISSION, PlannerModelSettings, read_admission

    assert PlannerModelSettings().admission == ADMISSION and ADMISSION.slo_s == 0.3
    got = read_admission({"RUFUS_QP_SLO_S": "0.5", "RUFUS_ASSISTANT_SLO_S": "9"})
    assert (got.slo_s, got.base_s) == (0.5, ADMISSION.base_s)
    from rufus.assistant.settings import read_admission as read_assistant

    assert read_assistant({"RUFUS_QP_SLO_S": "0.5"}).slo_s == 1.0  # the assistant's
    with pytest.raises(ValueError, match="RUFUS_QP_MARGIN"):
        read_admission({"RUFUS_QP_MARGIN": "-1"})


def test_plans_that_share_a_pass_are_not_counted_as_a_queue():
    """The planner decodes up to a batch of plans per tree pass: three plans ahead in a
    batch of four cost a little each, a fifth plan waits for a slot (issue 60: a linear
    estimate said 0.33 s for 3 plans in flight whose p90 was 183 ms)."""
    from rufus.serving.admission import shared_pass_features

    f = shared_pass_features(4)
    assert [f(w, 0) for w in (0, 3, 4, 6)] == [(1.0, 0.0, 0.0), (1.0, 3.0, 0.0), (1.0, 3.0, 1.0),
                                              (1.0, 3.0, 3.0)]
    assert f(2, 1) == (1.0, 3.0, 0.0)   # a plan done but not yet ended is still ahead
    assert shared_pass_features(1)(2, 0) == (1.0, 0.0, 2.0)
    s = AdmissionSettings(slo_s=0.3, base_s=0.12, per_waiting_s=0.02, per_decoding_s=0.06,
                          warm_after=0)
    adm = SloAdmission(s, clock=Clock(), what="plan", queue="{waiting} plans in flight",
                       features=f)
    held = [adm.admit() for _ in range(4)]        # 3 ahead of the last: 0.18 s, admitted
    assert adm.estimate() == pytest.approx(0.12 + 3 * 0.02 + 0.06)
    held += [adm.admit() for _ in range(2)]       # 4 and 5 ahead: 0.24 s, 0.30 s
    with pytest.raises(Unavailable) as err:       # 6 ahead: 0.36 s
        adm.admit()
    assert "6 plans in flight" in err.value.message
    for t in held:
        t.first_token()
        t.done()


def test_the_shared_pass_fit_learns_a_batched_planner():
    """Plans ahead inside the batch add 10 ms each, each beyond it 40 ms: the fit finds both."""
    clock = Clock()
    from rufus.serving.admission import shared_pass_features

    adm = SloAdmission(AdmissionSettings(slo_s=100.0, base_s=0.2, per_waiting_s=0.05,
                                         per_decoding_s=0.1, prior_weight=2),
                       clock=clock, features=shared_pass_features(4))
    for _ in range(80):
        held = [adm.admit() for _ in range(7)]
        for k, t in enumerate(held):              # truth: 0.1 + 0.01 * sharing + 0.04 * queued
            clock.t += 0.1 + 0.01 * min(k, 3) + 0.04 * max(k - 3, 0) - (clock.t - t.started)
            t.first_token()
        for t in held:
            t.done()
    base, per_sharing, per_queued = adm.fit.theta
    assert base == pytest.approx(0.1, abs=0.01)
    assert per_sharing == pytest.approx(0.01, abs=0.005)
    assert per_queued == pytest.approx(0.04, abs=0.005)
