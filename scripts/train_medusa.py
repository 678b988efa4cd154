"""Train Medusa-1 heads for the query planner by self-distillation on the frozen model.

1. The planner model (scripts/setup.sh qp) writes its own greedy plans for the training
   questions (data/qp/train.jsonl): the heads learn to predict *this model's* output, which
   is what decides acceptance; no external labels are needed.
2. One forward pass gives the final (post-norm) hidden state at every plan position.
3. Head k (k = 0..K-1) is a residual SiLU block ``x + silu(W_k x)`` followed by the model's
   frozen tied embedding as vocabulary projection; it is trained with cross-entropy to
   predict the token k+2 positions ahead (head 0: the token after the next one). W_k starts
   at zero, so an untrained head equals the model's own next-token head.

Training uses a sampled softmax (data tokens + random negatives) because the 49k-token
projection dominates CPU time; accuracy is reported over the full vocabulary. Only the
blocks are saved (K x 576 x 576, ~4.0 MB in fp16 for 6 heads): rufus/qp/tooling/build.py adds the
shared projection when it builds vLLM's Medusa checkpoint. Seeded; progress on stdout.

    .venv/bin/python scripts/train_medusa.py [--heads 6 --epochs 6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rufus.qp.plan import build_messages, load_eval  # noqa: E402
from rufus.qp.tooling.build import HEADS_PATH, qp_model_dir  # noqa: E402


def say(msg: str) -> None:
    print(f"[train_medusa {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def self_distill_data(model, tok, questions: list[str], max_new: int, batch: int):  # type: ignore[no-untyped-def]
    """Greedy outputs of the model, then (hidden state, future tokens) per plan position."""
    import torch

    seqs: list[tuple[list[int], int]] = []  # (prompt + output ids, prompt length)
    tok.padding_side = "left"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for i in range(0, len(questions), batch):
        prompts = [tok.apply_chat_template(build_messages(q),
                                           add_generation_prompt=True, tokenize=False)
                   for q in questions[i:i + batch]]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=eos, pad_token_id=tok.pad_token_id or 0)
        for row, mask in zip(out, enc["attention_mask"], strict=True):
            plen = int(mask.sum())
            prompt_ids = row[: enc["input_ids"].shape[1]][mask.bool()].tolist()
            gen = row[enc["input_ids"].shape[1]:].tolist()
            if eos in gen:
                gen = gen[: gen.index(eos) + 1]
            seqs.append((prompt_ids + gen, plen))
        say(f"generated {len(seqs)}/{len(questions)} plans")
    return seqs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--train", default=str(ROOT / "data/qp/train.jsonl"))
    ap.add_argument("--model", default="", help="planner model dir (default: setup's)")
    ap.add_argument("--out", default=str(HEADS_PATH))
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256, help="positions per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    t0 = time.monotonic()
    mdir = Path(a.model) if a.model else qp_model_dir()
    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    questions = [r["question"] for r in load_eval(a.train)]
    seqs = self_distill_data(model, tok, questions, a.max_new, 28)

    K = a.heads
    hs_list, tgt_list = [], []
    with torch.no_grad():
        for n, (ids, plen) in enumerate(seqs):
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            # positions t = plen-1 .. len-2 produce the plan; head k targets ids[t + k + 2]
            for t in range(plen - 1, len(ids) - 1):
                tg = [ids[t + k + 2] if t + k + 2 < len(ids) else -100 for k in range(K)]
                hs_list.append(h[t])
                tgt_list.append(tg)
            if (n + 1) % 70 == 0:
                say(f"hidden states {n + 1}/{len(seqs)}")
    hs = torch.stack(hs_list)
    tg = torch.tensor(tgt_list)
    emb = model.get_output_embeddings().weight.detach()
    say(f"{hs.shape[0]} positions, {K} heads, {time.monotonic() - t0:.0f} s so far")

    H = hs.shape[1]
    V = emb.shape[0]
    # Sampled softmax: the vocabulary projection over all 49k tokens dominates the cost on
    # CPU. Each step scores every token seen in the distillation data plus --negatives
    # random others; accuracy below is measured over the full vocabulary.
    seen = torch.unique(torch.tensor([t for ids, _ in seqs for t in ids]))
    remap = torch.full((V,), -1, dtype=torch.long)
    say(f"sampled softmax over {len(seen)} data tokens + {a.negatives} random per step")
    Ws = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(H, H)) for _ in range(K)])
    opt = torch.optim.Adam(Ws.parameters(), lr=a.lr)
    for epoch in range(a.epochs):
        perm = torch.randperm(hs.shape[0])
        tot, correct, count = 0.0, torch.zeros(K), torch.zeros(K)
        for i in range(0, len(perm), a.batch):
            idx = perm[i:i + a.batch]
            x, y = hs[idx], tg[idx]
            cand = torch.unique(torch.cat([seen, torch.randint(0, V, (a.negatives,))]))
            remap[cand] = torch.arange(len(cand))
            sub = emb[cand]
            loss = torch.zeros(())
            for k in range(K):
                z = x + F.silu(x @ Ws[k].t())
                valid = y[:, k] >= 0
                if valid.any():
                    logits = z[valid] @ sub.t()
                    yk = remap[y[valid, k]]
                    # later heads are harder and matter less (acceptance is a prefix)
                    loss = loss + (0.8 ** k) * F.cross_entropy(logits, yk)
                    if epoch == a.epochs - 1:  # full-vocabulary top-1, last epoch only
                        with torch.no_grad():
                            full = (z[valid] @ emb.t()).argmax(-1)
                        correct[k] += (full == y[valid, k]).sum()
                    count[k] += valid.sum()
            remap[cand] = -1
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss) * len(idx)
        acc = " / ".join(f"{float(c / max(n, 1)):.3f}"
                         for c, n in zip(correct, count, strict=True))
        say(f"epoch {epoch + 1}/{a.epochs} loss {tot / len(perm):.4f} full-vocab top-1 {acc} "
            f"({time.monotonic() - t0:.0f} s)")
    out = Path(a.out)
    save_file({f"blocks.{k}.layers.0.weight": Ws[k].detach().to(torch.float16).contiguous()
               for k in range(K)}, str(out))
    out.with_suffix(".json").write_text(json.dumps({
        "num_heads": K, "num_layers": 1, "epochs": a.epochs, "lr": a.lr, "seed": a.seed,
        "batch": a.batch, "train": str(Path(a.train).relative_to(ROOT)),
        "positions": int(hs.shape[0]), "train_top1": acc,
    }, indent=1))
    say(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
