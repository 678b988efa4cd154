"""Medusa tree search: head accuracies, a measured cost model, and the tree that maximises
expected tokens per unit of verification time (Medusa's sparse-tree recipe).

On calibration questions (disjoint from training and eval) the accuracy ``acc[d][r]`` of
head ``d``'s rank-``r`` candidate is measured; a candidate path ``(r_1..r_d)`` is accepted
with probability ~ ``prod acc[i][r_i]``. Adding nodes in order of that probability keeps the
tree prefix-closed and maximises expected accepted tokens for its size. The size is chosen
with the *measured* time of one forward pass verifying n tokens on the engine that serves
the tree, so on a CPU (where width is not free) the tree stays small, and on a device where
extra nodes are nearly free it grows. The measurements (:func:`head_accuracy`,
:func:`time_forward`) take a model; the search itself is pure functions.
scripts/build_medusa_tree.py runs them.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rufus.qp.decoder.torch_llama import TorchLlama

TOPK = 8


def interpolate_cost(cost: dict[int, float]) -> Callable[[int], float]:
    """Verification time of n tokens, linear between measured points, proportional beyond."""
    pts = sorted(cost.items())

    def step_cost(n: int) -> float:
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, c0), (n1, c1) in itertools.pairwise(pts):
            if n0 <= n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        return pts[-1][1] * n / pts[-1][0]

    return step_cost


def grow_tree(acc: list[list[float]], step_cost: Callable[[int], float], max_nodes: int
              ) -> tuple[list[tuple[int, ...]], float, float]:
    """Greedy growth by path probability; returns (best tree's paths, expected tokens per
    step incl. the verified token, modelled speedup over one-token steps)."""
    heads = len(acc)
    topk = len(acc[0])
    frontier: list[tuple[tuple[int, ...], float]] = [((r,), acc[0][r]) for r in range(topk)]
    tree: list[tuple[tuple[int, ...], float]] = []
    best: list[tuple[tuple[int, ...], float]] = []
    best_speed = 0.0
    while frontier and len(tree) < max_nodes:
        frontier.sort(key=lambda x: -x[1])
        path, p = frontier.pop(0)
        tree.append((path, p))
        if len(path) < heads:
            frontier += [((*path, r), p * acc[len(path)][r]) for r in range(topk)]
        expected = 1 + sum(q for _, q in tree)
        speed = expected / step_cost(len(tree) + 1) * step_cost(1)
        if speed > best_speed:
            best_speed, best = speed, list(tree)
    return [p for p, _ in best], 1 + sum(q for _, q in best), best_speed


def chain_speeds(acc: list[list[float]], step_cost: Callable[[int], float]
                 ) -> tuple[dict[int, float], dict[int, float]]:
    """For vLLM's top-1 chain proposer: expected tokens per step and modelled speedup for
    each chain length k = 1..heads."""
    prob, chain = 1.0, []
    for row in acc:
        prob *= row[0]
        chain.append(prob)
    expected = {k: 1 + sum(chain[:k]) for k in range(1, len(acc) + 1)}
    speed = {k: e / step_cost(k + 1) * step_cost(1) for k, e in expected.items()}
    return expected, speed


def time_forward(model: TorchLlama, n: int, context: int, reps: int = 20, warmup: int = 3
                 ) -> float:
    """Mean seconds of one forward pass of the served engine (:class:`TorchLlama`)
    verifying ``n`` tokens after ``context`` cached ones (the cost model for choosing the
    tree size, and rufus/machine/precision.py's pass costs), after ``warmup`` untimed ones."""
    import torch

    ids = torch.zeros(n, dtype=torch.long)
    pos = torch.arange(context, context + n)
    mask = None if n == 1 else torch.ones(n, context + n, dtype=torch.bool)
    for _ in range(warmup):
        model.logits(model.forward(ids, pos, context, mask))
    t0 = time.perf_counter()
    for _ in range(reps):
        model.logits(model.forward(ids, pos, context, mask))
    return (time.perf_counter() - t0) / reps


def head_accuracy(model: Any, emb: Any, blocks: list[Any], seqs: list[tuple[list[int], int]],
                  topk: int = TOPK) -> list[list[float]]:
    """``acc[k][r]``: how often head k's rank-r token is the token k+2 ahead in the model's
    own greedy outputs ``seqs`` ((prompt + output ids, prompt length) pairs)."""
    import torch
    import torch.nn.functional as F

    k_heads = len(blocks)
    hits = torch.zeros(k_heads, topk)
    count = torch.zeros(k_heads)
    with torch.no_grad():
        for ids, plen in seqs:
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            for k in range(k_heads):
                pos = [t for t in range(plen - 1, len(ids) - 1) if t + k + 2 < len(ids)]
                if not pos:
                    continue
                z = h[pos] + F.silu(h[pos] @ blocks[k].t())
                top = (z @ emb.t()).topk(topk, dim=-1).indices
                tgt = torch.tensor([ids[t + k + 2] for t in pos])
                hits[k] += (top == tgt[:, None]).float().sum(0)
                count[k] += len(pos)
    return (hits / count[:, None].clamp(min=1)).tolist()


def tree_record(tree: list[tuple[int, ...]], heads: int, chain_k: int,
                acc: list[list[float]], expected_tree: float, expected_chain: dict[int, float],
                cost: dict[int, float], questions: int) -> dict[str, Any]:
    """medusa_tree.json: NxDI's ``medusa_tree`` format, the knobs, and the statistics."""
    paths = [list(p) for p in tree]
    return {
        "medusa_tree": paths,
        "num_medusa_heads": heads,
        "medusa_speculation_length": len(paths) + 1,
        "vllm_num_speculative_tokens": chain_k,
        "calibration": {
            "questions": questions,
            "head_topk_accuracy": [[round(x, 4) for x in r] for r in acc],
            "expected_tokens_per_step_tree": round(expected_tree, 3),
            "expected_tokens_per_step_chain": {k: round(v, 3) for k, v in expected_chain.items()},
            "verify_cost_ms": {n: round(c * 1e3, 1) for n, c in cost.items()},
        },
    }


# The tree per machine (``"medusa_tree": "measured"`` in the planner's model.json): the head
# accuracies are a property of the heads (measured once, committed with the tree), the pass
# costs a property of the machine and precision, so setup re-runs only the cost half here.
SERVED_TREE = (Path(__file__).resolve().parents[2] / "model_repository" / "rufus_qp_medusa"
               / "1" / "medusa_tree.json")
TREE_SIZES = (1, 2, 4, 8, 12, 16, 24, 32)


def machine_trees(model_dir: str | Path, costs: dict[str, dict[str, float]], threads: int,
                  progress: Callable[[str], None] = lambda _m: None,
                  calibration: Path = SERVED_TREE, max_nodes: int = 32,
                  ) -> dict[str, Any]:
    """For each precision measured in ``costs``: time verification of n tokens on this
    machine and grow the tree on those costs (:func:`grow_tree`). Returns the
    ``planner_trees`` entry of the precision record (rufus/machine/precision.py)."""
    import torch

    from rufus.qp.decoder.torch_llama import TorchLlama

    served = json.loads(calibration.read_text(encoding="utf-8"))
    acc = served["calibration"]["head_topk_accuracy"][: int(served["num_medusa_heads"])]
    torch.set_num_threads(threads)
    trees: dict[str, Any] = {}
    for dtype in costs:
        model = TorchLlama(model_dir, dtype, max_len=256, a8=dtype == "int8")  # as served
        cost = {n: min(time_forward(model, n, 100, 3) for _ in range(2))
                for n in TREE_SIZES if n <= max_nodes + 1}
        del model
        tree, expected, speed = grow_tree(acc, interpolate_cost(cost), max_nodes)
        trees[dtype] = {"medusa_tree": [list(p) for p in tree],
                        "expected_tokens_per_step": round(expected, 3),
                        "modelled_speedup": round(speed, 3),
                        "verify_cost_ms": {n: round(c * 1e3, 2) for n, c in cost.items()}}
        progress(f"{Path(model_dir).name} {dtype}: tree of {len(tree)} nodes, "
                 f"{expected:.2f} tokens/step, modelled {speed:.2f}x (verify ms "
                 + ", ".join(f"{n}: {c * 1e3:.0f}" for n, c in cost.items()) + ")")
    return {"planner_trees": trees, "tree_calibration": str(calibration)}
