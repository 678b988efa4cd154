"""Build the Medusa tree (``medusa_tree``) and pick the speculation lengths from a calibration set.

Medusa's sparse-tree recipe: on calibration questions (data/qp/calib.jsonl, disjoint from the
training and eval sets) measure, for each head d and rank r, how often the head's r-th choice
is the model's actual token (acc[d][r]). A candidate path (r_1..r_d) is accepted with
probability ~ prod acc[i][r_i]; adding nodes in order of that probability keeps the tree
prefix-closed and maximises expected accepted tokens per step for its size. The size is
chosen with a *measured* cost model: the time of one forward pass verifying n tokens on this
machine with the engine that serves the tree (rufus/qp/decoder/torch_llama.py, bf16, batch 1), so the
tree stays as small as CPU verification needs.
The same figures give the best top-1 chain length for vLLM's chain-only Medusa proposer.

Writes model_repository/rufus_qp_medusa/1/medusa_tree.json (NxDI's medusa_tree format plus
our statistics) and updates the knobs in 1/model.json.

    .venv/bin/python scripts/build_medusa_tree.py [--max-nodes 32]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rufus.qp.plan import load_eval  # noqa: E402
from rufus.qp.tooling.build import HEADS_PATH, qp_model_dir  # noqa: E402

MODEL_DIR = ROOT / "model_repository" / "rufus_qp_medusa" / "1"
TOPK = 8


def say(msg: str) -> None:
    print(f"[build_medusa_tree {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calib", default=str(ROOT / "data/qp/calib.jsonl"))
    ap.add_argument("--max-nodes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="dtype of the served model (cost model)")
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "scripts"))
    from train_medusa import self_distill_data

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    mdir = qp_model_dir()
    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    blocks = load_file(str(HEADS_PATH))
    K = len(blocks)
    Ws = [blocks[f"blocks.{k}.layers.0.weight"].float() for k in range(K)]
    emb = model.get_output_embeddings().weight.detach()
    seqs = self_distill_data(model, tok, [r["question"] for r in load_eval(a.calib)], 64, 20)

    hits = torch.zeros(K, TOPK)
    count = torch.zeros(K)
    with torch.no_grad():
        for ids, plen in seqs:
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            for k in range(K):
                pos = [t for t in range(plen - 1, len(ids) - 1) if t + k + 2 < len(ids)]
                if not pos:
                    continue
                z = h[pos] + F.silu(h[pos] @ Ws[k].t())
                top = (z @ emb.t()).topk(TOPK, dim=-1).indices
                tgt = torch.tensor([ids[t + k + 2] for t in pos])
                hits[k] += (top == tgt[:, None]).float().sum(0)
                count[k] += len(pos)
    acc = (hits / count[:, None].clamp(min=1)).tolist()
    for k in range(K):
        say(f"head {k}: top-1 {acc[k][0]:.3f}, top-{TOPK} {sum(acc[k]):.3f}")

    # measured verification cost: one forward of n new tokens after a 100-token context, on
    # the engine that serves the tree (rufus/qp/decoder/torch_llama.py, the served dtype)
    from rufus.qp.decoder.medusa_decode import time_forward
    from rufus.qp.decoder.torch_llama import TinyLlama

    served = TinyLlama(mdir, a.dtype, 512)
    cost: dict[int, float] = {}
    for n in (1, 2, 4, 6, 8, 12, 16, 24, 32, 64):
        if n <= a.max_nodes + 1:
            cost[n] = min(time_forward(served, n, 100, 10) for _ in range(3))
    say("verify cost (ms) by tokens: " + ", ".join(f"{n}: {c * 1e3:.1f}" for n, c in cost.items()))

    def step_cost(n: int) -> float:  # linear interpolation over the measured points
        pts = sorted(cost.items())
        for (n0, c0), (n1, c1) in itertools.pairwise(pts):
            if n0 <= n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        return pts[-1][1] * n / pts[-1][0]

    # greedy tree growth by path probability
    frontier = [((r,), acc[0][r]) for r in range(TOPK)]
    tree: list[tuple[tuple[int, ...], float]] = []
    best_tree, best_speed = [], 0.0
    while frontier and len(tree) < a.max_nodes:
        frontier.sort(key=lambda x: -x[1])
        path, p = frontier.pop(0)
        tree.append((path, p))
        if len(path) < K:
            frontier += [((*path, r), p * acc[len(path)][r]) for r in range(TOPK)]
        expected = 1 + sum(q for _, q in tree)
        speed = expected / step_cost(len(tree) + 1) * step_cost(1)
        if speed > best_speed:
            best_speed, best_tree = speed, list(tree)
    expected_tree = 1 + sum(q for _, q in best_tree)
    chain = []
    prob = 1.0
    for k in range(K):
        prob *= acc[k][0]
        chain.append(prob)
    chain_speed = {k + 1: (1 + sum(chain[:k + 1])) / step_cost(k + 2) * step_cost(1)
                   for k in range(K)}
    best_chain = max(chain_speed, key=lambda k: chain_speed[k])
    say(f"tree: {len(best_tree)} nodes, expected {expected_tree:.2f} tokens/step, "
        f"modelled speedup {best_speed:.2f}x")
    say("vLLM chain: " + ", ".join(f"k={k}: {1 + sum(chain[:k]):.2f} tok/step, "
                                   f"{s:.2f}x" for k, s in chain_speed.items()))
    tree_paths = [list(p) for p, _ in best_tree]
    out = {
        "medusa_tree": tree_paths,
        "num_medusa_heads": K,
        "medusa_speculation_length": len(tree_paths) + 1,
        "vllm_num_speculative_tokens": best_chain,
        "calibration": {"questions": len(seqs), "head_topk_accuracy": [[round(x, 4) for x in r]
                                                                       for r in acc],
                        "expected_tokens_per_step_tree": round(expected_tree, 3),
                        "expected_tokens_per_step_chain": {k: round(1 + sum(chain[:k]), 3)
                                                           for k in chain_speed},
                        "verify_cost_ms": {n: round(c * 1e3, 1) for n, c in cost.items()}},
    }
    (MODEL_DIR / "medusa_tree.json").write_text(json.dumps(out, indent=1) + "\n")
    mj = json.loads((MODEL_DIR / "model.json").read_text())
    mj.update({k: out[k] for k in ("num_medusa_heads", "medusa_speculation_length",
                                   "vllm_num_speculative_tokens")})
    mj["medusa_tree"] = "medusa_tree.json"
    (MODEL_DIR / "model.json").write_text(json.dumps(mj, indent=2) + "\n")
    say(f"wrote {MODEL_DIR / 'medusa_tree.json'} and updated model.json")


if __name__ == "__main__":
    main()
