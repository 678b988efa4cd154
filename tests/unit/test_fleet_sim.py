"""The fleet simulator: the engine model behaves like continuous batching, runs are seeded,
and the policy ordering the benchmark reports holds on a small fleet."""

from __future__ import annotations

import math

import pytest

from lab.fleet_sim import (
    POLICIES,
    ServiceModel,
    Session,
    Sim,
    WorkloadSpec,
    simulate,
    units_needed,
)

MODEL = ServiceModel(step_base_s=0.02, step_per_seq_s=0.002, prefill_per_token_s=0.0005,
                     max_num_seqs=4, cache_tokens=5000)
SMALL = WorkloadSpec(duration_s=40, warmup_s=5, base_rate=6, burst_every_s=15)


def test_single_request_timing_matches_the_step_model():
    spec = WorkloadSpec(duration_s=1, warmup_s=0, base_rate=1e-9, chat_frac=0)
    sim = Sim(1, "least_outstanding", MODEL, spec)
    sim.sessions[0] = Session(0, [10], [])
    sim._push(0.0, 0, (0, 0))
    while sim.events:
        t, _, kind, payload = __import__("heapq").heappop(sim.events)
        sim.now = t
        if kind == 0:
            sim._arrive(*payload)
        elif payload[1] == sim.units[payload[0]].version:
            sim._rephase(payload[0], t, payload[2])
    (r,) = sim.done
    prompt = spec.context_tokens + spec.user_tokens
    first = MODEL.step(1, prompt)
    assert r.ttft == pytest.approx(first)
    assert r.done == pytest.approx(first + 9 * MODEL.step(1))


def test_batch_limit_queues_and_prefix_cache_hits():
    spec = WorkloadSpec(duration_s=30, warmup_s=0, base_rate=3, chat_frac=1.0, burst=1.0, peak=1.0)
    big_cache = ServiceModel(**{**MODEL.__dict__, "cache_tokens": 10**6})
    r = simulate(1, "least_outstanding", big_cache, spec)
    assert r["requests"] > 50
    # one unit with room for every conversation: every follow-up turn hits the cache
    assert r["followup_cache_hit"] == 1.0
    assert simulate(1, "least_outstanding", MODEL, spec)["followup_cache_hit"] < 0.5  # LRU
    sim = Sim(1, "least_outstanding", MODEL, spec)
    sim.run()
    assert all(r.ttft > 0 and r.done >= r.arrival + r.ttft for r in sim.done)


def test_seeded_and_identical_workload_across_policies():
    a = simulate(6, "power_of_two", MODEL, SMALL, seed=3)
    b = simulate(6, "power_of_two", MODEL, SMALL, seed=3)
    assert a == b
    counts = {p: simulate(6, p, MODEL, SMALL, seed=3)["requests"] for p in POLICIES}
    # same sessions and turns for every policy (turns after the horizon may differ slightly)
    assert max(counts.values()) - min(counts.values()) <= 0.03 * max(counts.values())


def test_least_outstanding_beats_round_robin_and_random_under_bursts():
    res = {p: simulate(8, p, MODEL, SMALL, seed=1)["ttft_p99_s"]
           for p in ("random", "round_robin", "least_outstanding", "prefix_affinity")}
    assert res["least_outstanding"] < res["round_robin"] < res["random"] * 1.1
    assert res["prefix_affinity"] < res["random"]


def test_units_needed_is_monotone_search():
    n, runs = units_needed("least_outstanding", MODEL, SMALL, lo=2, hi=40)
    assert n is not None and 2 < n <= 40 and runs < 12
    assert simulate(n, "least_outstanding", MODEL, SMALL)["ttft_p99_s"] < 1.0
    assert units_needed("random", MODEL, SMALL, lo=1, hi=2)[0] is None


def test_calibration_fit():
    cal = {"itl_ms": {"1": 30.0, "4": 36.0, "8": 44.0},
           "ttft_ms_by_prompt_tokens": {"50": 80.0, "300": 230.0, "700": 470.0}}
    m = ServiceModel.from_calibration(cal)
    assert m.step_per_seq_s == pytest.approx(0.002, rel=0.05)
    assert m.step_base_s == pytest.approx(0.028, rel=0.05)
    assert m.prefill_per_token_s == pytest.approx(0.0006, rel=0.05)
    assert not math.isnan(m.step(8, 100))


def test_offered_rate_scales_with_units_and_utilization():
    from lab.fleet_sim import offered_rate

    spec = WorkloadSpec(chat_frac=0.0, long_frac=0.0, short_tokens=10)
    full = offered_rate(MODEL, spec, 1, 1.0)
    # one unit at full decode capacity: max_num_seqs sequences per step, 10 tokens each
    assert full == pytest.approx(MODEL.max_num_seqs / MODEL.step(MODEL.max_num_seqs) / 10)
    assert offered_rate(MODEL, spec, 4, 0.5) == pytest.approx(2 * full)
