"""The planner's own int8 weight-only kernel (rufus/qp/decoder/int8_kernel.py): built here for
each instruction set this CPU has, its packing, its results against the dequantized weight,
row independence (what keeps Medusa verification lossless) and the fallback where it cannot
be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rufus.qp.decoder import int8_kernel, torch_llama
from rufus.qp.decoder.torch_llama import quantize_int8
from rufus.serving import machine

VARIANTS = [v for v, cap in (("avx512", ""), ("avx2", "avx2"))
            if int8_kernel.isa(machine.effective_flags(machine.cpu_flags(),
                                                       {"ATEN_CPU_CAPABILITY": cap})) == v]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """An empty kernel cache: each test builds and loads its own."""
    monkeypatch.setattr(int8_kernel, "_loaded", {})
    monkeypatch.setattr(int8_kernel, "_why_not", {})
    monkeypatch.setattr(int8_kernel, "_forward", {})
    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RUFUS_COMPILE_CACHE_DIR", raising=False)
    return tmp_path


def _load(variant: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2" if variant == "avx2" else "")
    kernel = int8_kernel.load()
    assert kernel is not None, int8_kernel.unavailable_reason()
    return kernel


def test_pack_is_a_permutation_with_zero_padding() -> None:
    q = torch.randint(-127, 128, (20, 32), dtype=torch.int8)
    p = int8_kernel.pack(q, 8)  # tiles of 16 weight rows, k-major
    assert p.shape == (2, 32, 16) and p.is_contiguous()
    assert torch.equal(p[0, 3], q[:16, 3])  # k = 3 of the first tile's 16 rows
    back = p.transpose(1, 2).reshape(32, 32)
    assert torch.equal(back[:20], q) and not back[20:].any()


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_equals_the_dequantized_weight(variant: str, fresh, monkeypatch) -> None:
    kernel = _load(variant, monkeypatch)
    assert kernel[1] == (16 if variant == "avx512" else 8)
    assert list(fresh.rglob(f"w8_linear-{variant}-*.so"))  # cached under the CPU's key
    torch.manual_seed(0)
    for n, k in ((10, 64), (96, 576), (7, 1536)):  # N not a multiple of the tile too
        w = torch.randn(n, k) * torch.logspace(-2, 0, n)[:, None]
        q, scale = quantize_int8(w)
        mm = int8_kernel.linear(q, scale, kernel)
        deq = q.double() * scale.double()[:, None]
        # a pass of 50 rows converts each tile once into a buffer (the prefill path)
        for shape in ((1, k), (2, k), (5, k), (13, k), (3, 2, k), (30, k), (50, k)):
            x = torch.randn(shape)
            got = mm(x)
            assert got.dtype == torch.float32 and got.shape == (*shape[:-1], n)
            want = F.linear(x.double(), deq)
            assert (got.double() - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.skipif(not VARIANTS, reason="no AVX2/AVX-512 on this CPU: the kernel is not built")
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_row_does_not_depend_on_the_other_rows_or_threads(variant: str, fresh,
                                                            monkeypatch) -> None:
    """Bit for bit: a tree verification pass must reproduce one-row greedy decoding."""
    kernel = _load(variant, monkeypatch)
    torch.manual_seed(1)
    q, scale = quantize_int8(torch.randn(52, 576))
    mm = int8_kernel.linear(q, scale, kernel)
    x = torch.randn(60, 576)  # up to a prefill's row count (the buffered path)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([mm(x[i:i + 1]) for i in range(60)])
        torch.set_num_threads(2)
        for m in (2, 3, 7, 16, 25, 60):
            assert torch.equal(mm(x[:m]), alone[:m])
    finally:
        torch.set_num_threads(n)


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
    w = torch.randn(8, 40)  # 40: not a multiple of the vector width
    q, scale = quantize_int8(w)
    x = torch.randn(3, 40)
    got = torch_llama._int8_linear(w, torch.float32)(x)
    assert torch.allclose(got, F.linear(x, q.float() * scale[:, None]), atol=1e-5)
