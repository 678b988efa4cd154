"""The Medusa tree calibrated on this machine, behind scripts/build_medusa_tree.py: head
accuracies on the calibration questions, the verification cost of the served engine, the
grown tree written to the model repository. The search itself is product code
(rufus/qp/tree.py), run again at setup on each machine's costs."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from lab.qp.medusa_train import self_distill_data
from rufus.qp.build import HEADS_PATH, qp_model_dir
from rufus.qp.plan import load_eval
from rufus.qp.tree import (
    chain_speeds,
    grow_tree,
    head_accuracy,
    interpolate_cost,
    tree_record,
)

ROOT = Path(__file__).resolve().parents[2]

MODEL_DIR = ROOT / "model_repository" / "rufus_qp_medusa" / "1"


def say(msg: str) -> None:
    print(f"[build_medusa_tree {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calib", default=str(ROOT / "data/qp/calib.jsonl"))
    ap.add_argument("--questions", type=int, default=120, help="seeded calibration subset")
    ap.add_argument("--max-nodes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="dtype of the served model (cost model)")
    ap.add_argument("--cost-from", default="",
                    help="reuse verify_cost_ms from this medusa_tree.json instead of timing "
                         "(the cost depends on the architecture, not the weights: timings "
                         "taken on a loaded machine are noise)")
    a = ap.parse_args(argv)

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rufus.qp.decoder.torch_llama import TorchLlama
    from rufus.qp.tree import time_forward

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    mdir = qp_model_dir()
    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    blocks = load_file(str(HEADS_PATH))
    heads = len(blocks)
    ws = [blocks[f"blocks.{k}.layers.0.weight"].float() for k in range(heads)]
    emb = model.get_output_embeddings().weight.detach()
    rows = load_eval(a.calib)
    if 0 < a.questions < len(rows):
        rows = random.Random(0).sample(rows, a.questions)
    seqs = self_distill_data(model, tok, rows, 64, 24, say)
    acc = head_accuracy(model, emb, ws, seqs)
    for k in range(heads):
        say(f"head {k}: top-1 {acc[k][0]:.3f}, top-{len(acc[k])} {sum(acc[k]):.3f}")

    cost: dict[int, float] = {}
    if a.cost_from:
        measured = json.loads(Path(a.cost_from).read_text())["calibration"]["verify_cost_ms"]
        cost = {int(n): float(ms) / 1e3 for n, ms in measured.items()}
        say(f"verify cost reused from {a.cost_from}")
    else:
        served = TorchLlama(mdir, a.dtype, 512)
        for n in (1, 2, 4, 6, 8, 12, 16, 24, 32, 64):
            if n <= a.max_nodes + 1:
                cost[n] = min(time_forward(served, n, 100, 10) for _ in range(3))
    say("verify cost (ms) by tokens: " + ", ".join(f"{n}: {c * 1e3:.1f}" for n, c in cost.items()))
    step_cost = interpolate_cost(cost)
    tree, expected, speed = grow_tree(acc, step_cost, a.max_nodes)
    chain_expected, chain_speed = chain_speeds(acc, step_cost)
    best_chain = max(chain_speed, key=lambda k: chain_speed[k])
    say(f"tree: {len(tree)} nodes, expected {expected:.2f} tokens/step, modelled speedup "
        f"{speed:.2f}x")
    say("vLLM chain: " + ", ".join(f"k={k}: {chain_expected[k]:.2f} tok/step, {s:.2f}x"
                                   for k, s in chain_speed.items()))
    out = tree_record(tree, heads, best_chain, acc, expected, chain_expected, cost, len(seqs))
    (MODEL_DIR / "medusa_tree.json").write_text(json.dumps(out, indent=1) + "\n")
    mj = json.loads((MODEL_DIR / "model.json").read_text())
    mj.update({k: out[k] for k in ("num_medusa_heads", "medusa_speculation_length",
                                   "vllm_num_speculative_tokens")})
    mj["medusa_tree"] = "medusa_tree.json"
    (MODEL_DIR / "model.json").write_text(json.dumps(mj, indent=2) + "\n")
    say(f"wrote {MODEL_DIR / 'medusa_tree.json'} and updated model.json")

