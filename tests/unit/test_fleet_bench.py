"""The fleet benchmark's pieces that need no fleet: the seeded mixed workload, the stream
that sends each prompt's answer length, and pooling phases into the LOR-vs-RR bar."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest

import lab.fleet_bench as fb
from rufus.client import Chunk


def test_mixed_workload_is_seeded_and_mixed():
    a = fb.mixed_workload(64, 16, 160, 0.2, seed=1)
    assert a == fb.mixed_workload(64, 16, 160, 0.2, seed=1)
    assert a != fb.mixed_workload(64, 16, 160, 0.2, seed=2)
    assert len(a) == 64 and set(a.values()) == {16, 160}
    assert 0.05 < sum(v == 160 for v in a.values()) / 64 < 0.4


def test_mixed_stream_sends_each_prompts_length_with_retries(monkeypatch):
    calls = []

    async def fake_agenerate(url, model, prompt=None, messages=None, **kw):
        calls.append((url, model, messages, kw))
        for i in (1, 2):
            yield Chunk("x", {"num_output_tokens": np.array([i])}, float(i))

    monkeypatch.setattr(fb, "agenerate", fake_agenerate)
    stream = fb.mixed_stream("u:1", {"p": 7}, retries=3)

    async def collect():
        return [x async for x in stream("p", 999)]

    assert asyncio.run(collect()) == [(1, 1.0), (2, 2.0)]
    (url, model, messages, kw), = calls
    assert (url, model) == ("u:1", "rufus_llm")
    assert messages == [{"role": "user", "content": "p"}]
    assert kw["sampling"]["max_tokens"] == 7 and kw["sampling"]["ignore_eos"] is True
    assert kw["retries"] == 3


def _phase(policy, tok_s, wall, p99, errors=0, requests=10):
    return {"policy": policy, "output_tok_s": tok_s, "wall_s": wall, "ttft_p50_ms": p99 / 2,
            "ttft_p99_ms": p99, "errors": errors, "requests": requests}


def test_summarize_pools_by_wall_time_and_applies_the_bar():
    s = fb.summarize_policies([_phase("lor", 100, 1, 400), _phase("rr", 100, 1, 1000),
                               _phase("rr", 40, 3, 1000, errors=1), _phase("lor", 100, 1, 600)])
    assert s["lor"]["output_tok_s"] == pytest.approx(100)
    assert s["rr"]["output_tok_s"] == pytest.approx((100 + 120) / 4)
    assert s["rr"]["errors"] == 1 and s["lor"]["ttft_p99_ms"] == pytest.approx(500)
    assert s["p99_ttft_ratio_lor_over_rr"] == pytest.approx(0.5)
    assert s["bar_met"] is True
    even = fb.summarize_policies([_phase("lor", 100, 1, 1000), _phase("rr", 100, 1, 1000)])
    assert even["bar_met"] is False


def test_summarize_one_policy_has_no_ratio():
    s = fb.summarize_policies([_phase("lor", 100, 1, 400)])
    assert "lor" in s and "bar_met" not in s


def test_affinity_difference_interval_brackets_a_real_shift_and_zero_without_one():
    from lab.affinity_bench import Arm, TurnResult, compare_arms, difference_ci

    base = [1.0 + 0.01 * i for i in range(60)]
    shifted = difference_ci([v - 0.5 for v in base], base, 0.5)
    assert shifted["diff"] == -0.5 and shifted["lo"] <= -0.5 <= shifted["hi"] < 0
    same = difference_ci(base, list(reversed(base)), 0.5)
    assert same["diff"] == 0 and same["lo"] <= 0 <= same["hi"]
    assert difference_ci(base, base, 0.5, seed=1) == difference_ci(base, base, 0.5, seed=1)

    def arm(offset: float) -> Arm:
        return Arm(turns=[TurnResult("x", t % 4, first_token_s=v + offset, answer_ttft_s=v,
                                     plan_s=v) for t, v in enumerate(base)]
                   + [TurnResult("x", 1, error="failed")])

    out = compare_arms({"affinity": arm(-0.2), "lor": arm(0.0)})
    assert out["follow_up_first_token_s_p50"]["diff"] == -0.2  # first turns and errors left out
    assert out["follow_up_answer_ttft_s_p50"]["diff"] == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_single_node_units_each_get_one_core_and_their_children_inherit_it(tmp_path):
    """A local fleet's single-node units are pinned one core each (the planner too), as
    hosts of their own; multi-node units keep their per-node vLLM binding; a started child
    (what tritonserver's stubs and engine cores are) runs on the pinned core only."""
    from rufus.launch.children import child_setup
    from rufus.launch.fleet import Fleet

    cpus = sorted(os.sched_getaffinity(0))
    one = Fleet(n_units=2, nnodes=1, log_dir=tmp_path)
    assert [one._unit_cpus(i) for i in range(3)] == [(cpus[0],), (cpus[1],), (cpus[2 % len(cpus)],)]
    # one-unit fleets side by side (lab.regions: a region each) take turns
    assert Fleet(n_units=1, nnodes=1, log_dir=tmp_path, first_core=1)._unit_cpus(0) == (cpus[1],)
    assert Fleet(n_units=2, nnodes=2, log_dir=tmp_path)._unit_cpus(0) is None
    assert Fleet(n_units=2, nnodes=1, log_dir=tmp_path, pin_units=False)._unit_cpus(1) is None
    out = subprocess.run(
        [sys.executable, "-c", "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)));"
         "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
         " capture_output=True, text=True).stdout.strip())"],
        preexec_fn=child_setup((cpus[1],)), capture_output=True, text=True, check=True)
    assert out.stdout.split() == [f"[{cpus[1]}]", f"[{cpus[1]}]"]
