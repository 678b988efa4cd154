"""The planner's fused int8 pass (torch_llama._FusedStack, w8_linear.cpp's w8_forward): every
decoder layer in one call. Against the op-by-op pass of the same int8 weights; bit-identical
rows whatever the pass's other rows or the thread count (what keeps Medusa verification
lossless); Medusa decoding through it equal to plain greedy decoding; where it does not
apply, the op-by-op pass. Each with int16 activations and, where the CPU has AVX-512 VNNI,
int8 ones (W8A8, ``a8``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rufus.machine import int8_kernel
from rufus.qp.decoder import torch_llama
from rufus.qp.decoder.medusa_decode import Decoder, Tree
from rufus.qp.decoder.torch_llama import MedusaHeads, Segment, TorchLlama
from tests.tiny_models import llama_with_heads

pytestmark = pytest.mark.skipif(int8_kernel.load() is None,
                                reason="no int8 kernel on this CPU: no fused pass")


@pytest.fixture(autouse=True)
def threads() -> Iterator[None]:
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=[False, True], ids=["a16", "a8"])
def a8(request: pytest.FixtureRequest) -> bool:
    """int16 activations, and int8 ones where this CPU's kernel has them."""
    if request.param and not int8_kernel.a8_supported():
        pytest.skip("no AVX-512 VNNI: no int8-activation kernel")
    return bool(request.param)


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A random Llama whose widths the kernel takes on AVX2 and AVX-512 (head size 64,
    grouped-query attention), with three Medusa heads."""
    return llama_with_heads(tmp_path_factory.mktemp("tiny64"), hidden=128, heads=2,
                            kv_heads=1, intermediate=256)


def _pair(model_dir: Path, monkeypatch: pytest.MonkeyPatch, slots: int = 1, a8: bool = False
          ) -> tuple[TorchLlama, TorchLlama]:
    monkeypatch.setenv("RUFUS_LAB_OFF", "fused")
    ref = TorchLlama(model_dir, "int8", 256, slots=slots, a8=a8)
    monkeypatch.setenv("RUFUS_LAB_OFF", "")
    fused = TorchLlama(model_dir, "int8", 256, slots=slots, a8=a8)
    assert fused.fused and not ref.fused
    assert fused.a8 == ref.a8 == a8
    return ref, fused


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= 1e-4 * b.abs().max())


def test_fused_pass_matches_the_op_by_op_pass(tiny64, monkeypatch, a8) -> None:
    ref, fused = _pair(tiny64[0], monkeypatch, a8=a8)
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (20,))
    mask = torch.ones(20, 20, dtype=torch.bool).tril()
    passes = [  # prefill, a tree (node 3 sees node 1), a one-row decode
        (ids, torch.arange(20), 0, mask),
        (torch.tensor([4, 9, 11]), torch.tensor([20, 21, 21]), 20,
         torch.cat([torch.ones(3, 20, dtype=torch.bool),
                    torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)], 1)),
        (torch.tensor([7]), torch.tensor([23]), 23, None),
    ]
    for p in passes:
        assert _close(fused.forward(*p), ref.forward(*p))
        assert _close(fused.cache, ref.cache)  # the K/V written for later passes too


def test_a_row_does_not_depend_on_the_pass_or_the_threads(tiny64, monkeypatch, a8) -> None:
    """Bit for bit, as tree verification needs: a token decoded alone (one thread) and the
    same token as a tree node among siblings, at other cache slots (two threads)."""
    _ref, m = _pair(tiny64[0], monkeypatch, a8=a8)
    torch.manual_seed(4)
    m.forward(torch.randint(0, 96, (12,)), torch.arange(12), 0,
              torch.ones(12, 12, dtype=torch.bool).tril())
    torch.set_num_threads(1)
    alone = m.forward(torch.tensor([5]), torch.tensor([12]), 12, None)[0]
    deeper = m.forward(torch.tensor([8]), torch.tensor([13]), 13, None)[0]  # 8 after 5
    torch.set_num_threads(2)
    # nodes: 9, 5, 5 (a second copy), then 8 under the first 5: slots 12..15
    vis = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    tree = m.forward(torch.tensor([9, 5, 5, 8]), torch.tensor([12, 12, 12, 13]), 12,
                     torch.cat([torch.ones(4, 12, dtype=torch.bool), vis], 1))
    assert torch.equal(tree[1], alone) and torch.equal(tree[2], alone)
    assert torch.equal(tree[3], deeper)


def test_wide_trees_reproduce_one_row_passes(tiny64, monkeypatch, a8) -> None:
    """Bit for bit at every width up to a prefill's (the kernel blocks the rows 6 or 12 at a
    time, each linear's input quantized per row): siblings at one position, each row equal to
    its token decoded alone on one thread."""
    monkeypatch.setattr(torch_llama, "FUSED_MAX_ROWS", 64)
    _ref, m = _pair(tiny64[0], monkeypatch, a8=a8)
    torch.manual_seed(6)
    m.forward(torch.randint(0, 96, (12,)), torch.arange(12), 0,
              torch.ones(12, 12, dtype=torch.bool).tril())
    toks = torch.randint(0, 96, (60,))
    torch.set_num_threads(1)
    alone = {t: m.forward(torch.tensor([t]), torch.tensor([12]), 12, None)[0]
             for t in toks.tolist()}
    for threads, rows in ((2, 5), (1, 13), (2, 13), (2, 31), (1, 60), (2, 60)):
        torch.set_num_threads(threads)
        mask = torch.cat([torch.ones(rows, 12, dtype=torch.bool),
                          torch.eye(rows, dtype=torch.bool)], 1)
        tree = m.forward(toks[:rows], torch.full((rows,), 12), 12, mask)
        for i, t in enumerate(toks[:rows].tolist()):
            assert torch.equal(tree[i], alone[t]), (threads, rows, i)


def test_fused_medusa_decoding_equals_greedy(tiny64, monkeypatch, a8) -> None:
    model_dir, heads_dir = tiny64
    _ref, m = _pair(model_dir, monkeypatch, a8=a8)
    ar = Decoder(m, None, None, eos_ids={1})
    md = Decoder(TorchLlama(model_dir, "int8", 256, a8=a8), MedusaHeads(heads_dir, "int8", 3),
                 Tree.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]]), eos_ids={1})
    assert md.model.fused
    for prompt in ([5, 6, 7, 8, 9], [50, 51], [5, 6, 7, 8, 9]):  # the last reuses the cache
        want = [t for s in ar.generate(prompt, 40) for t in s.tokens]
        assert [t for s in md.generate(prompt, 40) for t in s.tokens] == want


def test_two_sequences_in_one_fused_pass(tiny64, monkeypatch, a8) -> None:
    ref, fused = _pair(tiny64[0], monkeypatch, slots=2, a8=a8)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    segs = [Segment(torch.tensor([3, 4, 5]), torch.arange(3), 0, mask, 0),
            Segment(torch.tensor([6]), torch.tensor([0]), 0, None, 1)]
    assert _close(fused.forward_many(segs), ref.forward_many(segs))
    assert _close(fused.cache, ref.cache)


def test_where_the_fused_pass_does_not_apply(tiny64, monkeypatch) -> None:
    model_dir = tiny64[0]
    _ref, m = _pair(model_dir, monkeypatch)
    # longer passes (prefills) run op by op, with the same results
    monkeypatch.setattr(torch_llama, "FUSED_MAX_ROWS", 2)
    ids, mask = torch.tensor([3, 4, 5]), torch.ones(3, 3, dtype=torch.bool).tril()
    monkeypatch.setenv("RUFUS_LAB_OFF", "fused")
    ref = TorchLlama(model_dir, "int8", 256)
    assert torch.equal(m.forward(ids, torch.arange(3), 0, mask),
                       ref.forward(ids, torch.arange(3), 0, mask))
    # fp32 / bf16 weights have no fused pass
    assert not TorchLlama(model_dir, "float32", 64).fused
    # a mask the kernel would read past: refused before the call
    monkeypatch.setattr(torch_llama, "FUSED_MAX_ROWS", 32)
    with pytest.raises(ValueError, match=r"attention mask of shape \(2, 2\), expected \(2, 5\)"):
        m.forward(torch.tensor([1, 2]), torch.tensor([3, 4]), 3,
                  torch.ones(2, 2, dtype=torch.bool))
