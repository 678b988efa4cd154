"""The ``rufus_int8`` quantization method for vLLM (rufus/machine/vllm_int8.py): the custom op
against the kernel it wraps, the linear and LM-head methods on vLLM's own layer classes, and a
real vLLM engine serving a tiny model with it (in a subprocess: vLLM's globals stay there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rufus.machine import int8_kernel, vllm_int8
from tests.tiny_models import random_llama

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(int8_kernel.load() is None,
                                reason=f"no int8 kernel here: {int8_kernel.unavailable_reason()}")


def _layer(cls: type, w: torch.Tensor) -> torch.nn.Module:
    """An instance of vLLM's layer class ``cls`` holding only ``weight`` (what the methods
    read), without its constructor's tensor-parallel set-up."""
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    return layer


def test_the_op_is_the_kernel_bit_for_bit() -> None:
    torch.manual_seed(0)
    w, x = torch.randn(40, 64), torch.randn(2, 3, 64)
    q, s = int8_kernel.quantize_int8(w)
    kernel = int8_kernel.load()
    assert kernel is not None
    vllm_int8._KERNEL[:] = [kernel[0]]
    got = torch.ops.rufus.w8_linear(x, int8_kernel.pack(q, kernel[1]), s, 40)
    want = int8_kernel.linear(q, s, kernel)(x)
    assert got.shape == (2, 3, 40) and torch.equal(got, want)
    empty = torch.ops.rufus.w8_linear(x[:0], int8_kernel.pack(q, kernel[1]), s, 40)
    assert empty.shape == (0, 3, 40)


def test_linear_and_lm_head_methods_on_vllms_layers() -> None:
    assert vllm_int8.register() and vllm_int8.register()  # idempotent
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    config = get_quantization_config(vllm_int8.NAME)()
    assert config.get_name() == vllm_int8.NAME
    torch.manual_seed(1)
    w, x, bias = torch.randn(48, 64), torch.randn(5, 64), torch.randn(48)
    deq = (lambda q, s: q.float() * s[:, None])(*int8_kernel.quantize_int8(w))

    lin = _layer(LinearBase, w)
    method = config.get_quant_method(lin, "model.layers.0.mlp.down_proj")
    method.process_weights_after_loading(lin)
    assert not hasattr(lin, "weight") and lin.w8_packed.dtype == torch.int8  # float copy freed
    got = method.apply(lin, x, bias)
    torch.testing.assert_close(got, F.linear(x, deq, bias), rtol=1e-3, atol=1e-3)

    head = _layer(ParallelLMHead, w)
    method = config.get_quant_method(head, "lm_head")
    method.process_weights_after_loading(head)
    assert head.weight.shape == w.shape  # kept: tied embeddings look rows up in it
    torch.testing.assert_close(method.apply(head, x), F.linear(x, deq), rtol=1e-3, atol=1e-3)
    assert config.get_quant_method(_layer(VocabParallelEmbedding, w), "embed") is None


PROMPT = [1, 5, 9, 13, 17, 21]
_ENGINE = """
import json, os, sys
PROMPT = json.loads(sys.argv[2])
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from rufus.machine import vllm_int8
vllm_int8.register()
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", quantization="rufus_int8", enforce_eager=True,
          skip_tokenizer_init=True, max_model_len=128, max_num_seqs=2, seed=0,
          max_num_batched_tokens=128,
          gpu_memory_utilization=0.1, kv_cache_memory_bytes=1 << 26)
got = llm.generate([{"prompt_token_ids": PROMPT}],
                   SamplingParams(max_tokens=4, temperature=0, logprobs=1, detokenize=False),
                   use_tqdm=False)
c = got[0].outputs[0]
print("RESULT " + json.dumps({"tokens": list(c.token_ids),
                              "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]}))
"""


def test_a_real_vllm_engine_serves_a_model_with_it(tmp_path: Path) -> None:
    """vLLM loads the tiny model with ``quantization="rufus_int8"`` and decodes; its first
    token is the float model's (a random model's logits are close: the later ones may part)."""
    # head_dim 64: vLLM's CPU attention has kernels for 32, 64, 80, 96, 112, 128, ...
    model = random_llama(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                 tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "m")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0, -1].float(), -1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", _ENGINE, str(tmp_path / "m"), json.dumps(PROMPT)], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert len(out["tokens"]) == 4
    assert out["tokens"][0] == int(logp.argmax())
    assert abs(out["logprobs"][0] - float(logp.max())) < 0.05
