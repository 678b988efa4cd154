"""The planner's measurement at setup, and the forward pass that times both models' passes
(``python -m rufus.launch.setup_precision`` passes them to rufus/machine/precision.py, which knows
no model).

Both models' passes are timed with the planner's own Llama forward (:class:`TorchLlama`:
bf16, fp32 and int8 weight-only on any Llama weights; for the answer model it stands in for
vLLM's CPU pass). The planner adds its Medusa tree grown per dtype on this machine's costs
(:func:`rufus.qp.tree.machine_trees`), and its choice is the dtype with the lowest
modelled time per plan with that dtype's own tree (:func:`planner_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rufus.machine import precision
from rufus.qp.build import qp_model_dir
from rufus.qp.tree import interpolate_cost, machine_trees, time_forward


def time_passes(model_dir: Path, dtype: str, threads: int
                ) -> Callable[[int, int, int], float] | None:
    """The model in ``dtype`` and a timer of its passes, or None where the forward pass does
    not offer ``dtype``."""
    import torch

    from rufus.qp.decoder.torch_llama import DTYPES, TorchLlama

    if dtype not in DTYPES:
        return None
    torch.set_num_threads(threads)
    # int8 as served by default: int8 activations where the kernel has them
    # (``int8_activations``, rufus/qp/settings.py)
    model = TorchLlama(model_dir, dtype, max_len=256, a8=dtype == "int8")
    # one untimed pass first (allocation): a multi-row pass in emulated bf16 takes seconds,
    # so the tree search's three would slow setup for nothing
    return lambda n, context, reps: time_forward(model, n, context, reps, warmup=1)


# The planner's choice, once its trees are grown on this machine's pass costs: the dtype with
# the lowest modelled time per plan (a question's prefill after the reused prompt prefix, about
# a quarter of the 128-token pass, plus a mean plan's tree steps): a dtype whose passes are
# cheap but whose tree stays short can lose to one with a wider tree, and the other way round.
PLAN_TOKENS = 38  # the mean plan on the 263-question eval set
PLAN_PREFILL_SHARE = 0.25


def planner_choice(costs: Mapping[str, Mapping[str, float]],
                   trees: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, float]]:
    """(dtype, modelled ms per plan for each dtype) from pass costs and grown trees."""
    modelled = {}
    for dt, t in trees.items():
        step = interpolate_cost({int(n): ms / 1e3 for n, ms in t["verify_cost_ms"].items()})
        per_step = step(len(t["medusa_tree"]) + 1)
        modelled[dt] = round(1e3 * (PLAN_PREFILL_SHARE * costs[dt]["prefill"] + PLAN_TOKENS
                                    / float(t["expected_tokens_per_step"]) * per_step), 1)
    return min(modelled, key=modelled.__getitem__), modelled


def planner_extra(result: dict[str, Any], model_dir: Path, threads: int,
                  progress: precision.Progress) -> dict[str, Any]:
    """The planner's part of its record: its trees per dtype and the choice they give."""
    trees = machine_trees(model_dir, result["seconds_per_pass"], threads, progress)
    best, modelled = planner_choice(result["seconds_per_pass"], trees["planner_trees"])
    progress(f"{model_dir.name}: modelled ms per plan {modelled}")
    return {**trees, "planner_modelled_ms_per_plan": modelled,
            "choice": {**result["choice"], "planner": best}}


PLANNER = precision.Measurement("planner", qp_model_dir, planner_extra)
