"""A short compile warm-up in vLLM's CPU worker (applied by the worker extension,
rufus/vllm_worker/extension.py).

Why: before it sizes the KV cache, vLLM's CPU worker runs ``warming_up_model``, whose only
job on CPU is to make torch.compile trace and compile (or, cached, load) the model's one
generic-shape graph; it does so with a dummy batch of ``max_num_batched_tokens`` tokens
(2,048 for rufus_llm). On a cached start the graph is loaded, not compiled, and that batch is
pure arithmetic: the largest single step of a cached start on a CPU without native bf16
(docs/benchmarks-history.md, "A short compile warm-up, the heap frozen before the fork"). A short
dummy batch traces, compiles or loads the same graph (on CPU vLLM traces once, with the
token dimension dynamic), and the model's own warm-up (rufus/serving/llm.py
``warmup_requests``: a long prompt among them) then runs the real shapes before the model
reports ready.

Only for an engine of one worker with no draft model (no speculative decoding, or n-gram
drafts, which are looked up in the prompt on the CPU: vLLM's dummy run starts no drafter
for them), where the KV cache size is
given (``VLLM_CPU_KVCACHE_SPACE`` or ``kv_cache_memory_bytes``; ``make serve`` and the rigs
set it): without an explicit size vLLM sizes the cache from the process's memory after this
run, which a shorter run would change; and the dummy run also sizes buffers that outlive
it, which with more than one worker a short batch would make too small (a pipeline stage's
intermediate tensors: a two-node unit's first long request failed in CI with a short
batch), and likewise a drafter's.
The batch is ``DEFAULT_TOKENS``; ``RUFUS_LAB_OFF=short_warmup`` keeps vLLM's full run (the
benchmark's baseline).
Guarded: it does nothing if vLLM's CPU runner changed the method it wraps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rufus.env import lab_on

log = logging.getLogger("rufus.vllm_worker.warmup")

DEFAULT_TOKENS = 256


def warmup_tokens(env: Mapping[str, str] | None = None) -> int:
    """The dummy batch's token count (0: vLLM's own, the lab's ``short_warmup`` baseline)."""
    return DEFAULT_TOKENS if lab_on("short_warmup", env) else 0


# speculative methods whose drafts need no model (no drafter buffers sized by the dummy run)
MODEL_FREE_DRAFTS = ("ngram",)


def short_run_is_safe(runner: Any) -> bool:
    """One worker (no pipeline stages, no tensor-parallel peers), no draft model, and an
    explicit KV cache size: nothing that outlives the dummy run is sized by it."""
    world = getattr(getattr(runner, "parallel_config", None), "world_size", None)
    explicit_kv = getattr(getattr(runner, "cache_config", None), "kv_cache_memory_bytes",
                          None) is not None
    spec = getattr(runner, "speculative_config", None)
    model_free = spec is None or getattr(spec, "method", None) in MODEL_FREE_DRAFTS
    return world == 1 and model_free and explicit_kv


def short_warmup(original: Any) -> Any:
    """``warming_up_model`` with ``max_num_tokens`` capped for the dummy run only."""

    def warming_up_model(self: Any) -> None:
        tokens = warmup_tokens()
        full = int(getattr(self, "max_num_tokens", 0) or 0)
        if not 0 < tokens < full or not short_run_is_safe(self):
            return original(self)
        log.info("compile warm-up with %d dummy tokens instead of %d (one worker, explicit "
                 "KV cache size; RUFUS_LAB_OFF=short_warmup runs vLLM's full batch)",
                 tokens, full)
        self.max_num_tokens = tokens
        try:
            return original(self)
        finally:
            self.max_num_tokens = full

    warming_up_model._rufus_original = original  # type: ignore[attr-defined]
    return warming_up_model


def apply() -> bool:
    """Wrap vLLM's CPU ``warming_up_model``; True if wrapped (or already)."""
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # not vLLM's CPU build: nothing to shorten
        return False
    current = vars(CPUModelRunner).get("warming_up_model")
    if current is None:
        return False
    if hasattr(current, "_rufus_original"):  # (vLLM's own decorator sets __wrapped__)
        return True
    CPUModelRunner.warming_up_model = short_warmup(current)
    return True
