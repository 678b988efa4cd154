"""The planner's own int8 weight-only kernel (rufus/machine/int8_kernel.py): built here for
each instruction set this CPU has, its packing, its results against the dequantized weight,
row independence (what keeps Medusa verification lossless) and the fallback where it cannot
be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rufus.machine import cpu as machine
from rufus.machine import int8_kernel
from rufus.qp.decoder import torch_llama
from rufus.qp.decoder.torch_llama import quantize_int8

_FLAGS = machine.cpu_flags()
# variant -> (ATEN_CPU_CAPABILITY, CPU flags hidden from the kernel) that select it here
_SETUPS = {"avx512vnni": ("", set()), "avx512": ("", {"avx512_vnni"}), "avx2": ("avx2", set())}
VARIANTS = [v for v, (cap, hide) in _SETUPS.items()
            if int8_kernel.isa(machine.effective_flags(_FLAGS - hide,
                                                       {"ATEN_CPU_CAPABILITY": cap})) == v]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """An empty kernel cache: each test builds and loads its own."""
    monkeypatch.setattr(int8_kernel, "_loaded", {})
    monkeypatch.setattr(int8_kernel, "_why_not", {})
    monkeypatch.setattr(int8_kernel, "_forward", {})
    monkeypatch.setattr(int8_kernel, "_some", {})
    monkeypatch.setattr(int8_kernel, "_a8", {})
    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RUFUS_COMPILE_CACHE_DIR", raising=False)
    return tmp_path


def _load(variant: str, monkeypatch: pytest.MonkeyPatch):
    cap, hide = _SETUPS[variant]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", cap)
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: _FLAGS - hide)
    kernel = int8_kernel.load()
    assert kernel is not None, int8_kernel.unavailable_reason()
    return kernel


def test_pack_is_a_permutation_with_zero_padding() -> None:
    q = torch.randint(-127, 128, (20, 32), dtype=torch.int8)
    p = int8_kernel.pack(q, 8)  # tiles of 16 weight rows, by pairs of k
    assert p.shape == (2, 16, 16, 2) and p.is_contiguous()
    assert torch.equal(p[0, 3], q[:16, 6:8])  # k = 6, 7 of the first tile's 16 rows, adjacent
    assert torch.equal(p[1, 0, :4], q[16:20, 0:2])
    back = p.permute(0, 2, 1, 3).reshape(32, 32)
    assert torch.equal(back[:20], q) and not back[20:].any()


def _bound(x: torch.Tensor, deq: torch.Tensor) -> torch.Tensor:
    """The worst-case error of the kernel's ``x @ deq.T`` (float64): each activation rounded to
    int16 on its row's scale (at most half a step, max|x_row| / 65534, per element) plus float32
    rounding of the exact integer sums and the scales (a few units of 2^-24 of the sum of
    magnitudes)."""
    x = x.double().reshape(-1, x.shape[-1])
    mag = x.abs() @ deq.abs().T
    return (x.abs().amax(1, keepdim=True) / 65534 * deq.abs().sum(1) + 1e-6 * mag
            ).reshape(-1, deq.shape[0])


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_equals_the_dequantized_weight(variant: str, fresh, monkeypatch) -> None:
    """Within the int16 rounding of the activations, and far closer than the int8 weights'
    own error."""
    kernel = _load(variant, monkeypatch)
    assert kernel[1] == (8 if variant == "avx2" else 16)
    assert list(fresh.rglob(f"w8_linear-{variant}-*.so"))  # cached under the CPU's key
    torch.manual_seed(0)
    # N not a multiple of the tile too; K 1040: two whole int32 blocks and 16 k's
    for n, k in ((10, 64), (96, 576), (7, 1536), (40, 1040)):
        w = torch.randn(n, k) * torch.logspace(-2, 0, n)[:, None]
        q, scale = quantize_int8(w)
        mm = int8_kernel.linear(q, scale, kernel)
        deq = q.double() * scale.double()[:, None]
        for shape in ((1, k), (2, k), (5, k), (13, k), (3, 2, k), (30, k), (50, k)):
            x = torch.randn(shape)
            x[..., 3] *= 40  # an outlier channel, as LLM activations have: a coarser step
            got = mm(x)
            assert got.dtype == torch.float32 and got.shape == (*shape[:-1], n)
            want = F.linear(x.double(), deq)
            err = (got.double() - want).reshape(-1, n).abs()
            assert (err <= _bound(x, deq)).all()
            assert err.max() <= 1e-3 * want.abs().max()
            # the int8 weights' own error, for scale: orders of magnitude larger
            assert err.max() < 0.1 * (F.linear(x.double(), w.double()) - want).abs().max()


# (variant, int8 activations): every build with int16 ones, the VNNI build with int8 ones too
_ROW_CASES = [(v, False) for v in VARIANTS] + [
    ("avx512vnni", True)] * ("avx512vnni" in VARIANTS)


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize(("variant", "a8"), _ROW_CASES)
def test_zero_and_non_finite_rows(variant: str, a8: bool, fresh, monkeypatch) -> None:
    """int16 activations on every build, int8 ones on the VNNI build."""
    kernel = _load(variant, monkeypatch)
    q, scale = quantize_int8(torch.randn(20, 64))
    mm = (int8_kernel.linear_a8 if a8 else int8_kernel.linear)(q, scale, kernel)
    x = torch.randn(5, 64)
    x[1] = 0
    x[2, 5] = float("nan")
    x[3, 7] = float("inf")
    x[4] = 1e-39  # subnormal: 32767 / max|x| would overflow float32
    y = mm(x)
    assert torch.equal(y[1], torch.zeros(20))  # an all-zero row: exact zeros
    assert torch.equal(y[4], torch.zeros(20))
    assert y[2].isnan().all() and y[3].isnan().all()  # as float32 arithmetic would not hide
    assert torch.equal(y[0], mm(x[:1])[0])  # nor does a bad row touch the others


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize(("variant", "a8"), _ROW_CASES)
def test_a_row_does_not_depend_on_the_other_rows_or_threads(variant: str, a8: bool, fresh,
                                                            monkeypatch) -> None:
    """Bit for bit: a tree verification pass must reproduce one-row greedy decoding. Every
    row count from 1 to 60 (a prefill's), so every blocking of the rows, on 1 and 2 threads,
    the rows in another order too, for both input widths of the planner's layers; int16
    activations and, on the VNNI build, int8 ones."""
    kernel = _load(variant, monkeypatch)
    torch.manual_seed(1)
    n = torch.get_num_threads()
    make = int8_kernel.linear_a8 if a8 else int8_kernel.linear
    try:
        for k in (576, 1536):
            q, scale = quantize_int8(torch.randn(52, k))
            mm = make(q, scale, kernel)
            x = torch.randn(60, k)
            x[:, 9] *= 30
            torch.set_num_threads(1)
            alone = torch.cat([mm(x[i:i + 1]) for i in range(60)])
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for m in range(1, 61):
                    assert torch.equal(mm(x[:m]), alone[:m]), (k, threads, m)
                perm = torch.randperm(60)
                assert torch.equal(mm(x[perm]), alone[perm])
                assert torch.equal(mm(x[perm[:7]]), alone[perm[:7]])
    finally:
        torch.set_num_threads(n)


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize("variant", VARIANTS)
def test_selected_outputs_equal_the_full_pass_bit_for_bit(variant: str, fresh,
                                                          monkeypatch) -> None:
    """``some`` (the logits of the few tokens a grammar allows) computes exactly what the
    full pass computes for those outputs: a forced row's choice cannot differ from plain
    decoding's. Both input widths of the planner's layers, a last tile with padding, rows
    repeated and in any order."""
    kernel = _load(variant, monkeypatch)
    torch.manual_seed(2)
    for n, k in ((100, 576), (37, 1536), (9, 64)):
        q, scale = quantize_int8(torch.randn(n, k))
        mm = int8_kernel.linear(q, scale, kernel)
        x = torch.randn(6, k)
        x[:, 5] *= 30
        full = mm(x)
        rows = torch.randint(0, 6, (300,))
        cols = torch.randint(0, n, (300,))
        assert torch.equal(mm.some(x, rows, cols), full[rows, cols])
        assert torch.equal(mm.some(x[2:3], torch.tensor([0, 0]), torch.tensor([n - 1, 0])),
                           full[2, [n - 1, 0]])


@pytest.mark.skipif(len(VARIANTS) < 2, reason="needs a CPU with AVX-512 (two variants)")
def test_the_variants_agree_bit_for_bit(fresh, monkeypatch) -> None:
    """Exact integer sums in the same blocks, the same float32 operations in the same order:
    the vector width (and VNNI's fused multiply-add) changes nothing in the results."""
    torch.manual_seed(5)
    q, scale = quantize_int8(torch.randn(70, 1536))
    x = torch.randn(19, 1536)
    x[:, 100] *= 25
    got = [int8_kernel.linear(q, scale, _load(v, monkeypatch))(x) for v in VARIANTS]
    assert all(torch.equal(g, got[0]) for g in got[1:])


def test_no_compiler_falls_back_to_pytorchs_op(fresh, monkeypatch, tmp_path) -> None:
    if not VARIANTS:
        assert int8_kernel.load() is None and int8_kernel.unavailable_reason()
        return
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert int8_kernel.load() is None
    assert "FileNotFoundError" in (int8_kernel.unavailable_reason() or "")
    assert torch_llama.int8_activations() is torch.bfloat16  # the model then runs PyTorch's op


def test_a_width_the_kernel_cannot_take_uses_the_dequantized_weight(fresh, monkeypatch) -> None:
    if not VARIANTS:
        pytest.skip("no kernel on this CPU")
    torch.manual_seed(2)
    w = torch.randn(8, 36)  # 36: not a multiple of either vector width (8, 16)
    q, scale = quantize_int8(w)
    x = torch.randn(3, 36)
    got = torch_llama._int8_linear(w, torch.float32)(x)
    assert torch.allclose(got, F.linear(x, q.float() * scale[:, None]), atol=1e-5)


# --------------------------------------------------------------- int8 activations (W8A8)


def test_pack_a8_is_an_offset_permutation_with_zero_weight_padding() -> None:
    q = torch.randint(-127, 128, (20, 32), dtype=torch.int8)
    p = int8_kernel.pack_a8(q, 8)  # tiles of 16 weight rows, by quads of k, offset by 128
    assert p.shape == (2, 8, 16, 4) and p.dtype == torch.uint8 and p.is_contiguous()
    w = p.to(torch.int16) - 128
    assert torch.equal(w[0, 3], q[:16, 12:16].to(torch.int16))  # k 12..15 of the first tile
    back = w.permute(0, 2, 1, 3).reshape(32, 32)
    assert torch.equal(back[:20], q.to(torch.int16)) and not back[20:].any()


def test_only_the_vnni_variant_has_int8_activations(fresh, monkeypatch) -> None:
    for v in VARIANTS:
        monkeypatch.setattr(int8_kernel, "_loaded", {})
        _load(v, monkeypatch)
        assert int8_kernel.a8_supported() == (v == "avx512vnni"), v
        assert (int8_kernel.forward_fn(64, a8=True) is not None) == (v == "avx512vnni")


A8 = "avx512vnni" in VARIANTS
needs_a8 = pytest.mark.skipif(not A8, reason="no AVX-512 VNNI: no int8-activation kernel")


def _a8_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: each row rounded to int8 on max|x| / 127, the
    exact integer products, then the two scales."""
    x = x.double().reshape(-1, x.shape[-1])
    s = x.abs().amax(1, keepdim=True) / 127
    xq = torch.round(x / torch.where(s > 0, s, torch.ones_like(s)))
    return (xq @ q.double().T) * s * scale.double()


@needs_a8
def test_a8_equals_the_int8_rounded_rows(fresh, monkeypatch) -> None:
    """Exact integer sums: equal to the float64 reference within float32 rounding."""
    kernel = _load("avx512vnni", monkeypatch)
    torch.manual_seed(7)
    for n, k in ((10, 64), (96, 576), (7, 1536), (40, 1040)):
        q, scale = quantize_int8(torch.randn(n, k))
        mm = int8_kernel.linear_a8(q, scale, kernel)
        for m in (1, 5, 12, 13, 30, 50):
            x = torch.randn(m, k)
            x[:, 3] *= 40
            got, want = mm(x), _a8_reference(x, q, scale)
            assert got.shape == (m, n) and got.dtype == torch.float32
            assert ((got.double() - want).abs() <= 1e-6 * want.abs().max() + 1e-30).all()





def test_a8_asked_for_where_the_kernel_lacks_it_keeps_int16(fresh, monkeypatch, tmp_path) -> None:
    """``a8`` is a request: on a CPU without VNNI (or bf16/fp32 weights) the model says so
    (``a8`` False) and runs int16 activations."""
    from tests.tiny_models import llama_with_heads

    model_dir, _heads = llama_with_heads(tmp_path / "m", hidden=128, heads=2, kv_heads=1,
                                         intermediate=256)
    if VARIANTS:
        _load(VARIANTS[-1], monkeypatch)  # avx2 or avx512 without VNNI where it exists
    m = torch_llama.TorchLlama(model_dir, "int8", 64, a8=True)
    assert m.a8 == (int8_kernel.a8_supported())
    assert not torch_llama.TorchLlama(model_dir, "float32", 64, a8=True).a8
