"""INT8 weight-only planner (``dtype: int8``): the per-channel quantizer, the int8 linear layer
against its dequantized weight, the dtype reaching (or refused by) each backend, and
losslessness: Medusa tree decoding with the int8 model emits the int8 model's own greedy
tokens (a tiny random Llama always; the real planner on a few eval questions when built)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rufus.qp import backends
from rufus.qp.decoder import torch_llama
from rufus.qp.decoder.medusa_decode import Decoder, Tree
from rufus.qp.decoder.torch_llama import MedusaHeads, TorchLlama, _int8_linear, quantize_int8
from rufus.serving.config import ConfigError


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Batch-1 decoding as served (one thread), restored after: tiny passes on a busy 2-core
    machine are mostly OpenMP barrier waits with more."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_quantize_round_trip_per_channel() -> None:
    torch.manual_seed(1)
    w = torch.randn(48, 32) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different range
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    err = (q.float() * scale[:, None] - w).abs().amax(1)
    assert bool((err <= scale / 2 * (1 + 1e-5)).all())
    assert torch.isfinite(scale).all() and not q[5].any()  # a zero row stays zero, no NaN
    assert torch.equal(quantize_int8(w.bfloat16())[0][5], q[5])


def test_int8_linear_matches_the_dequantized_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(2)
    w = torch.randn(96, 64)
    q, scale = quantize_int8(w)
    deq = (q.float() * scale[:, None]).bfloat16()

    def close(got: torch.Tensor, want: torch.Tensor) -> bool:  # bf16 output and scales
        return bool((got.float() - want).abs().max() <= 1e-2 * want.abs().max())

    for shape in ((1, 64), (17, 64), (2, 3, 64)):
        x = torch.randn(shape).bfloat16()
        want = F.linear(x.float(), deq.float())
        got = _int8_linear(w, torch.bfloat16)(x)
        assert got.dtype == torch.bfloat16 and got.shape == (*shape[:-1], 96)
        assert close(got, want)
    # the op missing (or failing its probe): the dequantized bf16 weight, same values
    monkeypatch.setattr(torch_llama, "_int8_op_failed", [])

    def broken(*_a: object) -> None:
        raise RuntimeError("no int8 kernel here")

    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", broken)
    x = torch.randn(5, 64).bfloat16()
    got = _int8_linear(w, torch.bfloat16)(x)
    assert torch_llama._int8_op_failed == ["RuntimeError: no int8 kernel here"]
    assert close(got, F.linear(x.float(), deq.float()))


def test_int8_model_and_heads(tiny: tuple[Path, Path]) -> None:
    model_dir, heads_dir = tiny
    m8 = TorchLlama(model_dir, "int8", 64)
    act = torch_llama.int8_activations()  # float32 where our kernel builds, else bf16
    assert m8.dtype is act and m8.weights == "int8"  # activations, KV cache
    assert m8.cache.dtype is act and m8.embed.dtype is act
    ref = TorchLlama(model_dir, "float32", 64)
    ids, pos = torch.tensor([5, 6, 7, 8]), torch.arange(4)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    got = m8.logits(m8.forward(ids, pos, 0, mask))
    want = ref.logits(ref.forward(ids, pos, 0, mask))
    assert got.dtype is torch.float32
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    heads = MedusaHeads(heads_dir, "int8", 3)
    top = heads.topk(m8.forward(ids[:1], pos[:1], 0, None)[0], 2, 2)
    assert len(top) == 2 and all(len(r) == 2 and all(t % 2 == 0 for t in r) for r in top)
    with pytest.raises(ValueError, match="'int4' is not supported by the torch planner"):
        TorchLlama(model_dir, "int4", 64)


def test_int8_medusa_equals_int8_greedy_tiny(tiny: tuple[Path, Path]) -> None:
    model_dir, heads_dir = tiny
    ar = Decoder(TorchLlama(model_dir, "int8", 256), None, None, eos_ids={1})
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    md = Decoder(TorchLlama(model_dir, "int8", 256), MedusaHeads(heads_dir, "int8", 3), tree,
                 eos_ids={1})
    for prompt in ([5, 6, 7, 8, 9], [50, 51], [5, 6, 7, 8, 9]):  # the last reuses the cache
        want = [t for s in ar.generate(prompt, 40) for t in s.tokens]
        assert [t for s in md.generate(prompt, 40) for t in s.tokens] == want


def test_int8_dtype_through_the_backends(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, heads_dir = tiny
    args = {"model": str(model_dir), "dtype": "int8", "medusa_model": str(heads_dir),
            "num_medusa_heads": 3, "medusa_tree": [[0], [0, 0]]}
    for name in ("torch_medusa", "torch_autoregressive", "nxdi"):
        b = backends.create_backend({**args, "qp_backend": name})
        assert b.engine_args(args)["dtype"] == "int8"
        with pytest.raises(ConfigError, match="dtype 'int4' is not supported by qp_backend"):
            b.engine_args({**args, "dtype": "int4"})
    for name in ("vllm_medusa", "autoregressive"):  # vLLM on CPU has no int8 weight-only
        with pytest.raises(ConfigError, match="torch_medusa, torch_autoregressive or nxdi"):
            backends.create_backend({**args, "qp_backend": name}).engine_args(args)


def _planner_or_skip() -> tuple[Path, Path]:
    from rufus.qp.build import medusa_dir, qp_model_dir

    model, heads = qp_model_dir(), medusa_dir()
    if not (model / "config.json").exists() or not (heads / "model.safetensors").exists():
        pytest.skip(f"planner not built at {model} (scripts/setup.sh qp)")
    return model, heads


def test_int8_served_decoding_is_lossless_on_eval_questions() -> None:
    """The served path (tree, grammar, grammar-forced, question-word and skeleton drafts,
    forced rows' allowed-token logits, copied brand) with int8 weights against plain greedy
    decoding of the same int8 model: identical tokens (each row of an int8 pass is computed
    independently of the pass's other rows, by our kernel and by PyTorch's op)."""
    from lab.qp.evaluate import TorchPlanner
    from lab.qp.lossless import compare
    from rufus.launch.server import ROOT
    from rufus.qp.plan import load_eval

    model, heads = _planner_or_skip()
    mj = json.loads((ROOT / "model_repository/rufus_qp_medusa/1/model.json").read_text())
    tree = backends.load_tree(str(ROOT / "model_repository/rufus_qp_medusa/1/medusa_tree.json"))
    cf = tuple(mj.get("copy_fields") or ())
    plain = TorchPlanner(model, "int8", threads=1, copy_fields=cf)
    served = copy.copy(plain)  # the same compiled grammar (seconds to build), its own decoder
    served.decoder = Decoder(TorchLlama(model, "int8", 1024),
                             MedusaHeads(heads, "int8", int(mj["num_medusa_heads"])),
                             Tree.from_paths(tree), plain.decoder.eos_ids,
                             int(mj.get("grammar_drafts", 0)), int(mj.get("lookup_drafts", 0)),
                             history_drafts=int(mj.get("history_drafts", 0)))
    rows = load_eval(ROOT / "data/qp/eval.jsonl")
    # four first turns, so the plan skeleton learnt from earlier plans drafts too, and a
    # follow-up
    rows = [*rows[:4], next(r for r in rows if r.get("history"))]
    steps = tokens = 0
    for r in rows:
        want = plain.plan(r["question"], r.get("history"))
        got = served.plan(r["question"], r.get("history"))
        c = compare(want.token_ids, got.token_ids, None)
        assert c.identical, f"{r['question']!r}: first differs at token {c.first_diff}"
        steps, tokens = steps + got.steps, tokens + len(got.token_ids)
    assert tokens > 1.5 * steps  # the tree did accept drafts
