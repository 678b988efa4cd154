"""Medusa-1 heads for the planner, trained by self-distillation on the frozen model.

1. The planner writes its own greedy plans for the training questions: the heads learn to
   predict *this model's* output, which is what decides acceptance; no labels needed.
2. One forward pass gives the final (post-norm) hidden state at every plan position.
3. Head k is a residual SiLU block ``x + silu(W_k x)`` followed by the model's frozen tied
   embedding; it is trained with cross-entropy to predict the token k+2 positions ahead.
   W_k starts at zero, so an untrained head equals the model's own next-token head.

A sampled softmax (every token seen in the data + random negatives) replaces the 49k-token
projection during training, which dominates CPU time; accuracy is measured over the full
vocabulary. Only the blocks are saved; rufus/qp/build.py adds the shared projection.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rufus.qp.build import HEADS_PATH, qp_model_dir
from rufus.qp.plan import build_messages, load_eval

ROOT = Path(__file__).resolve().parents[2]


def self_distill_data(model: Any, tok: Any, rows: list[dict[str, Any]], max_new: int,
                      batch: int, say: Callable[[str], None] = print
                      ) -> list[tuple[list[int], int]]:
    """Greedy outputs of the model for ``rows`` (question + optional history):
    (prompt + output ids, prompt length) per row."""
    import torch

    seqs: list[tuple[list[int], int]] = []
    tok.padding_side = "left"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for i in range(0, len(rows), batch):
        prompts = [tok.apply_chat_template(build_messages(r["question"], r.get("history")),
                                           add_generation_prompt=True, tokenize=False)
                   for r in rows[i:i + batch]]
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
        say(f"generated {len(seqs)}/{len(rows)} plans")
    return seqs


def head_targets(hidden: Any, ids: list[int], plen: int, heads: int
                 ) -> tuple[list[Any], list[list[int]]]:
    """Positions plen-1 .. len-2 produce the plan; head k's target there is ids[t + k + 2]
    (-100 past the end)."""
    hs, tg = [], []
    for t in range(plen - 1, len(ids) - 1):
        tg.append([ids[t + k + 2] if t + k + 2 < len(ids) else -100 for k in range(heads)])
        hs.append(hidden[t])
    return hs, tg


@dataclass
class HeadsConfig:
    heads: int = 6
    epochs: int = 6
    batch: int = 256
    lr: float = 1e-3
    negatives: int = 2048
    seed: int = 0


def train_heads(hs: Any, tg: Any, emb: Any, seen: Any, cfg: HeadsConfig,
                say: Callable[[str], None] = print) -> tuple[list[Any], list[float]]:
    """Blocks W_k ([hidden, hidden] each) and the last epoch's full-vocabulary top-1 accuracy
    per head. ``seen``: token ids that always get a logit in the sampled softmax."""
    import torch
    import torch.nn.functional as F

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    K, H, V = cfg.heads, hs.shape[1], emb.shape[0]
    remap = torch.full((V,), -1, dtype=torch.long)
    Ws = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(H, H)) for _ in range(K)])
    opt = torch.optim.Adam(Ws.parameters(), lr=cfg.lr)
    t0 = time.monotonic()
    acc = [0.0] * K
    for epoch in range(cfg.epochs):
        perm = torch.randperm(hs.shape[0])
        tot, correct, count = 0.0, torch.zeros(K), torch.zeros(K)
        last = epoch == cfg.epochs - 1
        for i in range(0, len(perm), cfg.batch):
            idx = perm[i:i + cfg.batch]
            x, y = hs[idx], tg[idx]
            cand = torch.unique(torch.cat([seen, torch.randint(0, V, (cfg.negatives,))]))
            remap[cand] = torch.arange(len(cand))
            sub = emb[cand]
            loss = torch.zeros(())
            for k in range(K):
                z = x + F.silu(x @ Ws[k].t())
                valid = y[:, k] >= 0
                if valid.any():
                    logits = z[valid] @ sub.t()
                    # later heads are harder and matter less (acceptance is a prefix)
                    loss = loss + (0.8 ** k) * F.cross_entropy(logits, remap[y[valid, k]])
                    if last:  # full-vocabulary top-1, last epoch only
                        with torch.no_grad():
                            full = (z[valid] @ emb.t()).argmax(-1)
                        correct[k] += (full == y[valid, k]).sum()
                    count[k] += valid.sum()
            remap[cand] = -1
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        msg = f"epoch {epoch + 1}/{cfg.epochs} loss {tot / len(perm):.4f}"
        if last:
            acc = [float(c / max(n, 1)) for c, n in zip(correct, count, strict=True)]
            msg += " full-vocab top-1 " + " / ".join(f"{a:.3f}" for a in acc)
        say(f"{msg} ({time.monotonic() - t0:.0f} s)")
    return [w.detach() for w in Ws], acc


def train(model_dir: Path, rows: list[dict[str, Any]], out: Path, cfg: HeadsConfig,
          max_new: int = 64, threads: int = 2, say: Callable[[str], None] = print,
          meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Self-distil, collect hidden states, train, save ``out`` (fp16 blocks) + ``.json``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(threads)
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = self_distill_data(model, tok, rows, max_new, 32, say)
    hs_list, tgt_list = [], []
    with torch.no_grad():
        for n, (ids, plen) in enumerate(seqs):
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            hs, tg = head_targets(h, ids, plen, cfg.heads)
            hs_list += hs
            tgt_list += tg
            if (n + 1) % 100 == 0:
                say(f"hidden states {n + 1}/{len(seqs)}")
    hs_t = torch.stack(hs_list)
    tg_t = torch.tensor(tgt_list)
    emb = model.get_output_embeddings().weight.detach()
    seen = torch.unique(torch.tensor([t for ids, _ in seqs for t in ids]))
    say(f"{hs_t.shape[0]} positions, {cfg.heads} heads, sampled softmax over {len(seen)} data "
        f"tokens + {cfg.negatives} random ({time.monotonic() - t0:.0f} s so far)")
    Ws, acc = train_heads(hs_t, tg_t, emb, seen, cfg, say)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({f"blocks.{k}.layers.0.weight": Ws[k].to(torch.float16).contiguous()
               for k in range(cfg.heads)}, str(out))
    info = {"num_heads": cfg.heads, "num_layers": 1, "epochs": cfg.epochs, "lr": cfg.lr,
            "seed": cfg.seed, "batch": cfg.batch, "questions": len(rows),
            "positions": int(hs_t.shape[0]), "train_top1": [round(a, 3) for a in acc],
            "seconds": round(time.monotonic() - t0), **(meta or {})}
    out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    say(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - t0:.0f} s")
    return info



def say(msg: str) -> None:
    print(f"[train_medusa {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    d = HeadsConfig()
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(ROOT / "data/qp/train.jsonl"))
    ap.add_argument("--questions", type=int, default=800,
                    help="seeded subset of the training questions to self-distil")
    ap.add_argument("--model", default="", help="planner model dir (default: setup's)")
    ap.add_argument("--out", default=str(HEADS_PATH))
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--batch", type=int, default=d.batch, help="positions per optimizer step")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=d.negatives)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    rows = load_eval(a.train)
    if 0 < a.questions < len(rows):
        rows = random.Random(a.seed).sample(rows, a.questions)
    cfg = HeadsConfig(heads=a.heads, epochs=a.epochs, batch=a.batch, lr=a.lr,
                      negatives=a.negatives, seed=a.seed)
    train(Path(a.model) if a.model else qp_model_dir(), rows, Path(a.out), cfg, a.max_new,
          a.threads, say, meta={"train": str(Path(a.train).resolve().relative_to(ROOT))})

