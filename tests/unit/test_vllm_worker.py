"""rufus's vLLM worker extension: the short compile warm-up (against a fake CPU runner) and
that model.json names an extension that applies both patches to the installed vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rufus.vllm_worker import warmup as vllm_warmup

ROOT = Path(__file__).resolve().parents[2]


class FakeRunner:
    """What vLLM's CPUModelRunner.warming_up_model reads: the dummy batch is max_num_tokens."""

    def __init__(self, max_num_tokens: int, kv_bytes: int | None, world_size: int = 1,
                 speculative: str | None = None) -> None:
        self.max_num_tokens = max_num_tokens
        self.cache_config = SimpleNamespace(kv_cache_memory_bytes=kv_bytes)
        self.parallel_config = SimpleNamespace(world_size=world_size)
        self.speculative_config = SimpleNamespace(method=speculative) if speculative else None
        self.seen: list[int] = []

    def warming_up_model(self) -> None:  # vLLM's: profile_run() -> _dummy_run(max_num_tokens)
        self.seen.append(self.max_num_tokens)


def run(runner: FakeRunner, monkeypatch: pytest.MonkeyPatch, env: str | None) -> list[int]:
    """``env``: None the default, "0" the lab's baseline (RUFUS_LAB_OFF=short_warmup), a
    number another short batch (the module's constant), anything else a bad lab switch."""
    monkeypatch.delenv("RUFUS_LAB_OFF", raising=False)
    if env == "0":
        monkeypatch.setenv("RUFUS_LAB_OFF", "short_warmup")
    elif env is not None and env.isdigit():
        monkeypatch.setattr(vllm_warmup, "DEFAULT_TOKENS", int(env))
    elif env is not None:
        monkeypatch.setenv("RUFUS_LAB_OFF", env)
    vllm_warmup.short_warmup(FakeRunner.warming_up_model)(runner)
    return runner.seen


def test_explicit_kv_cache_gets_the_short_batch_and_the_budget_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner(2048, 2 << 30)
    assert run(runner, monkeypatch, None) == [vllm_warmup.DEFAULT_TOKENS]
    assert runner.max_num_tokens == 2048  # the scheduler's budget is untouched afterwards


def test_auto_kv_cache_keeps_vllms_full_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # without an explicit size vLLM sizes the KV cache from memory used after this run
    assert run(FakeRunner(2048, None), monkeypatch, None) == [2048]


@pytest.mark.parametrize("runner", [
    FakeRunner(2048, 1 << 30, world_size=2),  # a pipeline stage sizes its intermediate
                                              # tensors in this run (the CI failure)
    FakeRunner(2048, 1 << 30, speculative="medusa"),  # a drafter's buffers, likewise
    FakeRunner(2048, 1 << 30, speculative="eagle"),
], ids=["two workers", "medusa drafts", "eagle drafts"])
def test_engines_whose_buffers_the_run_sizes_keep_vllms_full_run(
        monkeypatch: pytest.MonkeyPatch, runner: FakeRunner) -> None:
    assert run(runner, monkeypatch, None) == [2048]


def test_ngram_drafts_need_no_drafter_so_the_short_run_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """rufus_llm drafts n-grams from the prompt: vLLM's dummy run starts no drafter for them,
    so nothing the run sizes outlives it (a restart spends less on the 2,048-token batch)."""
    runner = FakeRunner(2048, 1 << 30, speculative="ngram")
    assert run(runner, monkeypatch, None) == [vllm_warmup.DEFAULT_TOKENS]


@pytest.mark.parametrize(("env", "budget", "expected"), [
    ("0", 2048, 2048),      # off: vLLM's own run
    ("512", 2048, 512),
    ("4096", 2048, 2048),   # never more than the budget
    ("256", 128, 128),      # a budget smaller than the short batch
])
def test_the_setting(monkeypatch: pytest.MonkeyPatch, env: str, budget: int,
                     expected: int) -> None:
    assert run(FakeRunner(budget, 1 << 30), monkeypatch, env) == [expected]


@pytest.mark.parametrize("bad", ["many", "-5", "1.5"])
def test_a_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    with pytest.raises(ValueError, match="RUFUS_LAB_OFF"):
        run(FakeRunner(2048, 1 << 30), monkeypatch, bad)


def test_the_budget_is_restored_when_the_run_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(FakeRunner):
        def warming_up_model(self) -> None:
            raise RuntimeError("compile failed")

    runner = Failing(2048, 1 << 30)
    monkeypatch.delenv("RUFUS_LAB_OFF", raising=False)
    with pytest.raises(RuntimeError):
        vllm_warmup.short_warmup(Failing.warming_up_model)(runner)
    assert runner.max_num_tokens == 2048


def test_model_json_names_the_extension_and_it_patches_the_installed_vllm() -> None:
    pytest.importorskip("vllm")
    for model in ("rufus_llm", "rufus_qp_medusa"):
        cfg = json.loads((ROOT / f"model_repository/{model}/1/model.json").read_text())
        assert cfg["worker_extension_cls"] == "rufus.vllm_worker.extension.WorkerExtension"
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from rufus.vllm_worker import extension as vllm_worker

    assert vllm_worker.APPLIED == {"aot_cache_fix": True, "short_warmup": True, "rufus_int8": True}
    method: Any = vars(CPUModelRunner)["warming_up_model"]
    assert hasattr(method, "_rufus_original")
    assert vllm_warmup.apply()  # applying twice wraps once
    assert vars(CPUModelRunner)["warming_up_model"] is method
