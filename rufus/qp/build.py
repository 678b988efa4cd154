"""Artifacts of the query planner that are too big for git, rebuilt from small ones.

Committed (small): the planner's LoRA adapter (``data/qp/lora.safetensors``) and the Medusa
heads' residual blocks (``data/qp/medusa_heads.safetensors``); the tree is committed where
it is served (``model_repository/rufus_qp_medusa/1/medusa_tree.json``), not read here.
Rebuilt here (seconds, ``scripts/setup.sh qp``): the planner model (default model + merged
LoRA, 270 MB) and vLLM's Medusa checkpoint directory (the blocks, the draft vocabulary
``token_map`` and one vocabulary projection copied from the planner's tied embedding), with
the plan skeleton's seed beside them (``plan_seed.jsonl``: training plans, drafts only).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from rufus.machine import fingerprint
from rufus.machine.caches import cache_dir, default_model_dir
from rufus.qp.plan import SEED_FILE, load_eval, render_plan

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "qp"
LORA_PATH = DATA / "lora.safetensors"
HEADS_PATH = DATA / "medusa_heads.safetensors"
# LoRA targets: every linear layer of every decoder block (attention and MLP).
# Draft vocabulary of the heads (vLLM's Medusa ``token_map``): the lowest ids of the BPE
# vocabulary (merged first, i.e. the most frequent pieces) plus every token of the planner's
# training/calibration text. Projecting onto ~7k instead of 49k tokens makes each head ~7x
# cheaper; a token outside the map can never be drafted, which costs acceptance, never
# correctness (verification is by the full model).
TOKEN_MAP_LOW_IDS = 6144
# Plans of the training set written next to the heads as the plan skeleton's seed
# (SEED_FILE; rufus/qp/decoder/medusa_decode.py PlanHistory): a started planner drafts the
# usual plan structure from its first request instead of after a few served plans.
SEED_PLANS = 512
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def qp_model_dir() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct-qp"


def medusa_dir() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct-qp-medusa"


def say(msg: str) -> None:
    print(f"[qp-build {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _digest(*paths: Path) -> str:
    """SHA-256 of the inputs' bytes, end to end; read again only when a file's stat changed
    (rufus/machine/fingerprint.py), so the up-to-date check of a cached build is instant."""
    def compute() -> str:
        h = hashlib.sha256()
        for p in paths:
            fingerprint.feed(h, p)
        return h.hexdigest()[:16]
    return fingerprint.store().digest("qp-inputs", list(paths), compute)


def _stamp_ok(out: Path, want: str) -> bool:
    try:
        return json.loads((out / "rufus-qp-build.json").read_text())["inputs"] == want
    except (OSError, ValueError, KeyError):
        return False


def merge_lora(base: Path | None = None, lora: Path = LORA_PATH, out: Path | None = None,
               force: bool = False) -> Path:
    """Planner model = default model with the LoRA deltas merged (W += B @ A * alpha / r)."""
    base = base or default_model_dir()
    out = out or qp_model_dir()
    want = _digest(lora, base / "model.safetensors")
    if not force and _stamp_ok(out, want):
        say(f"planner model up to date ({out})")
        return out
    # imported only to build: the check above is what a cached start runs
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"merging LoRA {lora.name} into {base.name} -> {out}")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    sd = load_file(str(lora))
    meta = json.loads((lora.with_suffix(".json")).read_text())
    scale = float(meta["alpha"]) / float(meta["rank"])
    merged = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            a = sd.get(f"{name}.lora_A")
            if a is None:
                continue
            b = sd[f"{name}.lora_B"]
            module.weight += (b.float() @ a.float()) * scale
            merged += 1
    if merged != meta["num_modules"]:
        raise RuntimeError(f"merged {merged} LoRA modules, adapter has {meta['num_modules']}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (base / extra).exists() and not (tmp / extra).exists():
            shutil.copy(base / extra, tmp / extra)
    (tmp / "rufus-qp-build.json").write_text(json.dumps({"inputs": want, "lora": str(lora)}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    say(f"planner model written ({merged} modules merged)")
    return out


def draft_token_map(tokenizer_dir: Path) -> list[int]:
    """Sorted token ids the heads may draft (see TOKEN_MAP_LOW_IDS)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = set(range(TOKEN_MAP_LOW_IDS)) | set(tok.all_special_ids)
    for name in ("train.jsonl", "calib.jsonl"):
        for r in load_eval(DATA / name):
            text = r["question"] + " " + render_plan(r.get("plan", {})) + "<|im_end|>"
            ids.update(tok.encode(text, add_special_tokens=False))
    return sorted(i for i in ids if i < tok.vocab_size or i < len(tok))


def build_medusa_dir(model: Path | None = None, heads: Path = HEADS_PATH,
                     out: Path | None = None, force: bool = False) -> Path:
    """vLLM Medusa checkpoint: trained residual blocks + the frozen shared vocab projection."""
    model = model or qp_model_dir()
    out = out or medusa_dir()
    want = _digest(heads, model / "model.safetensors", DATA / "train.jsonl",
                   DATA / "calib.jsonl") + f"-tm{TOKEN_MAP_LOW_IDS}-seed{SEED_PLANS}"
    if not force and _stamp_ok(out, want):
        say(f"Medusa heads up to date ({out})")
        return out
    import torch
    from safetensors.torch import load_file, save_file

    say(f"building vLLM Medusa checkpoint {out}")
    cfg = json.loads((model / "config.json").read_text())
    blocks = load_file(str(heads))
    meta = json.loads(heads.with_suffix(".json").read_text())
    base_sd = load_file(str(model / "model.safetensors"))
    emb = base_sd.get("lm_head.weight", base_sd["model.embed_tokens.weight"])
    tensors: dict[str, Any] = {k: v.to(torch.bfloat16).contiguous() for k, v in blocks.items()}
    # One projection shared by every head (vLLM: original_lm_head=true): the heads were
    # trained against the model's own frozen (tied) embedding, restricted to the draft vocab.
    token_map = torch.tensor(draft_token_map(model), dtype=torch.long)
    tensors["token_map"] = token_map
    tensors["lm_head.weight"] = emb[token_map].to(torch.bfloat16).contiguous()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps({
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "num_heads": meta["num_heads"],
        "num_hidden_layers": meta["num_layers"],
        "original_lm_head": True,
        "truncated_vocab_size": len(token_map),
        "torch_dtype": "bfloat16",
    }, indent=1))
    write_plan_seed(tmp / SEED_FILE)
    (tmp / "rufus-qp-build.json").write_text(json.dumps({"inputs": want}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    say(f"Medusa checkpoint written ({meta['num_heads']} heads, draft vocabulary "
        f"{len(token_map)} of {cfg['vocab_size']} tokens)")
    return out


def write_plan_seed(path: Path, n: int = SEED_PLANS) -> None:
    """The first ``n`` training rows as ``{"question", "history"?, "plan"}`` with the plan in
    its served layout (:func:`rufus.qp.plan.render_plan`)."""
    lines = []
    for line in (DATA / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]:
        r = json.loads(line)
        row = {"question": r["question"], "plan": render_plan(r["plan"])}
        if r.get("history"):
            row["history"] = r["history"]
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    """``scripts/setup.sh qp``: rebuild both directories when their inputs changed."""
    import argparse

    ap = argparse.ArgumentParser(description="build the query planner's model directories")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    merge_lora(force=a.force)
    if HEADS_PATH.exists():
        build_medusa_dir(force=a.force)
    else:
        say(f"{HEADS_PATH} missing: run scripts/train_medusa.py (serving falls back to "
            "autoregressive decoding)")


if __name__ == "__main__":
    main()
