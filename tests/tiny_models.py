"""Tiny random Llama checkpoints with Medusa heads, shared by the planner's unit tests (the torch
decoder, int8 and the fused int8 pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_VOCAB = 96  # llama_with_heads' default vocabulary


def random_llama(**config: Any) -> Any:
    """A random ``LlamaForCausalLM`` (seed 0) of these ``LlamaConfig`` fields, not saved."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config))


def llama_with_heads(d: Path, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                     intermediate: int = 128, vocab: int = TINY_VOCAB) -> tuple[Path, Path]:
    """A 2-layer random Llama (seed 0, tied embeddings) in ``d / "model"`` and three Medusa
    heads in ``d / "heads"`` (vLLM's layout: residual blocks, a 40-token LM head mapped to the
    even token ids), as scripts/train_medusa.py writes them."""
    from safetensors.torch import save_file

    random_llama(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                 num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                 max_position_embeddings=256, tie_word_embeddings=True,
                 rope_theta=10000.0).save_pretrained(d / "model")
    (d / "heads").mkdir()
    # small perturbations of "repeat the model's own next-token guess": random but
    # deterministic drafts, some accepted and some rejected
    sd = {f"blocks.{k}.layers.0.weight": torch.randn(hidden, hidden) * 0.05 for k in range(3)}
    sd["lm_head.weight"] = torch.randn(40, hidden)
    sd["token_map"] = torch.arange(0, 80, 2)
    save_file(sd, str(d / "heads" / "model.safetensors"))
    (d / "heads" / "config.json").write_text("{}")
    return d / "model", d / "heads"
