"""LoRA fine-tune of the default model into the query planner (seeded, CPU-friendly).

Why a LoRA: prompting the 135M default model, even few-shot with the JSON grammar, gets
about a fifth of the intents right (docs/architecture.md, "Query planner"); a rank-8 adapter
on every linear layer is ~2.4M parameters (~5 MB in fp16, committed) and learns the plan
conventions from generated examples (lab/qp/questions.py). The loss covers only
the plan tokens and the end-of-turn token. Forward and backward run under bf16 autocast
(the adapter itself stays fp32): on an AVX-512-bf16 CPU that is much faster than fp32
(docs/benchmarks-history.md, "Query planner training").
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rufus.machine.caches import default_model_dir
from rufus.qp.build import LORA_PATH, LORA_TARGETS
from rufus.qp.plan import build_messages, load_eval, render_plan

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    epochs: float = 1.0
    batch: int = 16
    lr: float = 1e-3
    seed: int = 0
    threads: int = 2
    # 0: no time limit; else the learning rate decays over the budget and training stops
    # (and saves) when it is used up
    max_minutes: float = 0.0
    autocast: bool = True
    # recompute activations in the backward pass: ~4x less memory for ~30% more time (a
    # shared 24 GiB machine OOM-killed the run without it)
    checkpointing: bool = True
    save_every: int = 10  # steps between checkpoints of the adapter (a killed run keeps one)


def encode_examples(tok: Any, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per row: the chat-templated prompt, then the plan + <|im_end|>;
    labels are -100 on the prompt so only the plan is learned."""
    out = []
    for r in rows:
        prompt = tok.apply_chat_template(build_messages(r["question"], r.get("history")),
                                         add_generation_prompt=True, tokenize=False)
        p_ids = tok.encode(prompt, add_special_tokens=False)
        t_ids = tok.encode(render_plan(r["plan"]) + "<|im_end|>", add_special_tokens=False)
        out.append((p_ids + t_ids, [-100] * len(p_ids) + t_ids))
    return out


def lr_lambda(steps: int, warmup: int = 10, progress: Callable[[], float] | None = None
              ) -> Callable[[int], float]:
    """Linear warm-up, then linear decay to 5% of the peak at the last planned step, or
    earlier when ``progress()`` (the share of the time budget used) says the budget will run
    out first: on a shared machine the step time is unknown in advance, and a run cut short
    must still end with a low learning rate."""
    def f(s: int) -> float:
        done = max(s / max(steps, 1), progress() if progress is not None else 0.0)
        return min(1.0, (s + 1) / warmup) * max(0.05, 1 - done)

    return f


def train(base: Path, rows: list[dict[str, Any]], out: Path, cfg: LoraConfig,
          say: Callable[[str], None] = print, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the adapter on ``rows`` (``question``, optional ``history``, ``plan``); writes
    ``out`` (safetensors, fp16) and its ``.json`` metadata; returns the metadata."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.requires_grad_(False)
    if cfg.checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})

    class LoRA(torch.nn.Module):
        def __init__(self, lin: torch.nn.Linear) -> None:
            super().__init__()
            self.lin = lin
            self.A = torch.nn.Parameter(torch.randn(cfg.rank, lin.in_features)
                                        / math.sqrt(lin.in_features))
            self.B = torch.nn.Parameter(torch.zeros(lin.out_features, cfg.rank))
            self.scale = cfg.alpha / cfg.rank

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + (x @ self.A.t() @ self.B.t()) * self.scale

    wrapped: dict[str, LoRA] = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in LORA_TARGETS and isinstance(child, torch.nn.Linear):
                lora = LoRA(child)
                setattr(module, child_name, lora)
                wrapped[f"{name}.{child_name}"] = lora
    params = [p for m in wrapped.values() for p in (m.A, m.B)]
    say(f"{len(wrapped)} LoRA modules, {sum(p.numel() for p in params) / 1e6:.2f}M parameters")

    examples = encode_examples(tok, rows)
    order: list[int] = []
    while len(order) < cfg.epochs * len(examples):  # fractional epochs: a prefix of the next
        perm = list(range(len(examples)))
        random.shuffle(perm)
        order += perm
    order = order[:max(cfg.batch, int(cfg.epochs * len(examples)))]
    steps = math.ceil(len(order) / cfg.batch)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    t0 = time.monotonic()
    budget = cfg.max_minutes * 60

    def used() -> float:
        return (time.monotonic() - t0) / budget if budget else 0.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps, progress=used))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    say(f"{len(examples)} examples, {len(order)} seen, {steps} steps of {cfg.batch}")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(step: int, final: bool) -> dict[str, Any]:
        tensors = {}
        for name, m in wrapped.items():
            tensors[f"{name}.lora_A"] = m.A.detach().to(torch.float16).contiguous()
            tensors[f"{name}.lora_B"] = m.B.detach().to(torch.float16).contiguous()
        tmp = out.with_name(out.name + ".tmp")
        save_file(tensors, str(tmp))
        info = {"rank": cfg.rank, "alpha": cfg.alpha, "targets": list(LORA_TARGETS),
                "num_modules": len(wrapped), "epochs": cfg.epochs, "batch": cfg.batch,
                "lr": cfg.lr, "seed": cfg.seed, "steps": step, "planned_steps": steps,
                "examples": len(examples), "final_loss_avg": round(ema or 0.0, 4),
                "seconds": round(time.monotonic() - t0), "autocast_bf16": cfg.autocast,
                "max_minutes": cfg.max_minutes, "complete": final, **(meta or {})}
        out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
        tmp.replace(out)
        return info

    model.train()
    step, ema = 0, None
    for i in range(0, len(order), cfg.batch):
        batch = [examples[j] for j in order[i:i + cfg.batch]]
        width = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast):
            # logits only where a label is: the vocab projection dominates otherwise
            h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
            y = labels[:, 1:]
            keep = y != -100
            logits = model.lm_head(h[keep])
        loss = torch.nn.functional.cross_entropy(logits.float(), y[keep])
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        lv = float(loss.detach())
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        elapsed = time.monotonic() - t0
        if step % 5 == 0 or step == steps:
            eta = elapsed / step * (steps - step)
            say(f"step {step}/{steps} loss {lv:.4f} (avg {ema:.4f}) "
                f"{elapsed:.0f} s, ~{eta:.0f} s left")
        if cfg.save_every and step % cfg.save_every == 0 and step < steps:
            save(step, final=False)
        if cfg.max_minutes and elapsed > cfg.max_minutes * 60 and step < steps:
            say(f"time budget of {cfg.max_minutes} min reached at step {step}/{steps}: saving")
            break
    info = save(step, final=True)
    say(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - t0:.0f} s")
    return info



def say(msg: str) -> None:
    print(f"[train_qp_lora {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    d = LoraConfig()
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(ROOT / "data/qp/train.jsonl"))
    ap.add_argument("--out", default=str(LORA_PATH))
    ap.add_argument("--rank", type=int, default=d.rank)
    ap.add_argument("--alpha", type=float, default=d.alpha)
    ap.add_argument("--epochs", type=float, default=d.epochs)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=d.threads,
                    help="1 is faster than 2 when the cores are shared with other work")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop and save when reached (0: run every planned step)")
    ap.add_argument("--no-autocast", action="store_true", help="train in float32")
    ap.add_argument("--no-checkpointing", action="store_true",
                    help="keep activations: ~30%% faster, ~4x the memory (an idle machine)")
    a = ap.parse_args(argv)
    cfg = LoraConfig(rank=a.rank, alpha=a.alpha, epochs=a.epochs, batch=a.batch, lr=a.lr,
                     seed=a.seed, threads=a.threads, max_minutes=a.max_minutes,
                     autocast=not a.no_autocast, checkpointing=not a.no_checkpointing)
    train(default_model_dir(), load_eval(a.train), Path(a.out), cfg, say,
          meta={"train": str(Path(a.train).resolve().relative_to(ROOT)),
                "base": "SmolLM2-135M-Instruct (scripts/build_model.py)"})

