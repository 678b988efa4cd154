"""The int8 weight-only matmul on CPUs without native bf16: our own small kernel, for the
planner's passes and (through rufus/machine/vllm_int8.py) the answer model's on AVX2.

Why our own: PyTorch's CPU int8 weight-only op (``aten._weight_int8pack_mm``) takes bf16
activations (with fp32 ones it is many times slower), and bf16 arithmetic is emulated on CPUs
without ``avx512_bf16``; oneDNN's fp32 matmul reads four bytes per weight. The planner's passes
are one row (decode) or a few rows (Medusa verification) at batch 1, so ``w8_linear.cpp``
reads int8 weights packed as one sequential stream (what bounds a one-row pass), and does the
arithmetic in integers (what bounds a pass of several rows on AVX2): each activation row
quantized to int16 with its own scale, the weights sign-extended to int16 in registers, exact
int32 sums of ``vpmaddwd`` (twice the multiply-adds per instruction of a float32 FMA), added
in float32 per block of k's and scaled by the row's and the channel's scales. A row's result
depends on that row alone, bit for bit, whatever the pass's other rows or the thread count
(docs/benchmarks.md has the measurements against fp32, bf16 and PyTorch's op per CPU class).

It is compiled here, once per CPU class, with the machine's C++ compiler (the same ``g++``
torch's inductor needs), into ``$RUFUS_COMPILE_CACHE_DIR/<cpu key>/kernels/`` next to the
other compiled caches, and loaded with ctypes (no torch headers, so a build is quick).
The instruction set follows :func:`rufus.machine.cpu.this_cpu`, so
``ATEN_CPU_CAPABILITY=avx2`` builds the AVX2 variant on a bigger CPU; AVX-512 CPUs with
``avx512_vnni`` get a variant whose multiply and add are one ``vpdpwssd`` (the same integer
sums: every variant gives the same bits), and that variant alone also multiplies int8
activations (:func:`linear_a8`, W8A8: ``vpdpbusd``, twice the multiply-adds per instruction;
the planner's ``int8_activations`` uses it for the decoder layers, whose passes of many rows
are bound by this arithmetic). Where it cannot be
built (no compiler, no AVX2, not x86) :func:`load` returns None with the reason logged, and
the planner's ``int8`` keeps PyTorch's op.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from rufus.env import env_opt
from rufus.machine import caches
from rufus.machine import cpu as machine

log = logging.getLogger("rufus.machine.int8_kernel")

SOURCE = Path(__file__).with_name("w8_linear.cpp")
ISA_FLAGS = {  # avx512vnni: the same integer sums, multiply and add in one vpdpwssd
    "avx512vnni": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}
_loaded: dict[str, tuple[Callable[..., None], int] | None] = {}
_forward: dict[str, tuple[Callable[..., None], Callable[[int], int]]] = {}  # w8_forward,
# w8_head_supported per variant
_why_not: dict[str, str] = {}
_some: dict[int, Callable[..., None]] = {}  # id(w8_linear) -> its library's w8_linear_some
# id(w8_linear) -> its library's (w8a8_linear, w8a8_forward) where it has them (VNNI)
_a8: dict[int, tuple[Callable[..., None], Callable[..., None]]] = {}


def isa(flags: set[str]) -> str | None:
    """The kernel variant for these (effective) CPU flags, or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512vnni" if "avx512_vnni" in flags else "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return None


def library_path(variant: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the compiled kernel for ``variant`` lives (keyed by CPU and source)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(ISA_FLAGS[variant]).encode()
                            ).hexdigest()[:12]
    return caches.compile_base(env) / "kernels" / f"w8_linear-{variant}-{digest}.so"


def build(variant: str, out: Path) -> None:
    """Compile ``w8_linear.cpp`` for ``variant`` into ``out`` (atomically: a concurrent
    start never loads a half-written library)."""
    cxx = env_opt("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, "-std=c++17", "-O3", "-fopenmp", "-shared", "-fPIC", *ISA_FLAGS[variant],
           str(SOURCE), "-o", tmp]
    try:
        res = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace",
                             timeout=120, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {res.stderr.strip()[-300:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(env: Mapping[str, str] | None = None) -> tuple[Callable[..., None], int] | None:
    """``(w8_linear, vector width)`` for this CPU, built on first use; None (reason logged
    once, :func:`unavailable_reason`) where it cannot be built or loaded."""
    flags = machine.this_cpu(env)
    variant = isa(flags)
    key = variant or "none"
    if key in _loaded:
        return _loaded[key]
    _loaded[key] = None
    if variant is None:
        _why_not[key] = f"no kernel for this CPU ({machine.cpu_class(flags)})"
        return None
    path = library_path(variant, env)
    try:
        if not path.is_file():
            log.info("building the int8 kernel (%s) into %s", variant, path)
            build(variant, path)
        lib = ctypes.CDLL(str(path))
        fn = lib.w8_linear
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        width = int(lib.w8_vector_width())
        fwd = lib.w8_forward
        fwd.restype = None
        fwd.argtypes = ([ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p]
                        + [ctypes.c_float] + [ctypes.c_void_p] * 4
                        + [ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int])
        some = lib.w8_linear_some
        some.restype = None
        some.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2
                         + [ctypes.c_int64, ctypes.c_void_p])
        head_ok = lib.w8_head_supported
        head_ok.restype = ctypes.c_int
        head_ok.argtypes = [ctypes.c_int64]
        a8_ok = lib.w8a8_supported
        a8_ok.restype = ctypes.c_int
        a8 = None
        if a8_ok():
            a8_lin, a8_fwd = lib.w8a8_linear, lib.w8a8_forward
            a8_lin.restype = a8_fwd.restype = None
            a8_lin.argtypes = fn.argtypes
            a8_fwd.argtypes = fwd.argtypes
            a8 = (a8_lin, a8_fwd)
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        _why_not[key] = f"{type(exc).__name__}: {exc}"
        log.warning("int8 kernel unavailable (%s): the planner's int8 uses PyTorch's op",
                    _why_not[key])
        return None
    _loaded[key] = (fn, width)
    _forward[key] = (fwd, head_ok)
    _some[id(fn)] = some
    if a8 is not None:
        _a8[id(fn)] = a8
    log.info("int8 weight-only matmul: rufus's %s kernel (%s)", variant, path)
    return _loaded[key]


def forward_fn(head_dim: int, env: Mapping[str, str] | None = None, *, a8: bool = False
               ) -> Callable[..., None] | None:
    """The loaded library's ``w8_forward`` (every decoder layer of a pass in one call; see
    ``w8_linear.cpp``), or with ``a8`` its ``w8a8_forward`` (layers packed by
    :func:`linear_a8`), if it takes heads of ``head_dim``, else None (also where
    :func:`load` returns None, or ``a8`` where :func:`a8_supported` is False)."""
    kernel = load(env)
    if kernel is None:
        return None
    fwd = _forward.get(isa(machine.this_cpu(env)) or "none")
    if fwd is None or not fwd[1](head_dim):
        return None
    if a8:
        pair = _a8.get(id(kernel[0]))
        return pair[1] if pair is not None else None
    return fwd[0]


def a8_supported(env: Mapping[str, str] | None = None) -> bool:
    """Whether this CPU's kernel multiplies int8 activations (W8A8: ``vpdpbusd``, AVX-512
    VNNI), :func:`linear_a8`."""
    kernel = load(env)
    return kernel is not None and id(kernel[0]) in _a8


def unavailable_reason(env: Mapping[str, str] | None = None) -> str | None:
    """Why :func:`load` returned None, or None if it loaded (or was not tried)."""
    return _why_not.get(isa(machine.this_cpu(env)) or "none")


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: ``(q [out, in] int8, scale [out] float32)`` with
    ``w ~= q * scale[:, None]`` (an all-zero row gets scale 1 and q 0)."""
    w = w.float()
    scale = w.abs().amax(1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def pack(q: torch.Tensor, width: int) -> torch.Tensor:
    """``q [N, K]`` int8 as the kernel reads it: tiles of ``2 * width`` weight rows, each
    stored by pairs of k with a row's two k's adjacent (``[ceil(N / 2w), K / 2, 2w, 2]``; rows
    padded with zeros to whole tiles), so a pass reads the weights as one sequential stream,
    and one sign-extending load of a pair's ``2 * width`` bytes gives each 32-bit lane a row's
    ``(q[n, k], q[n, k + 1])``, the operand ``vpmaddwd`` multiplies by the activations'
    ``(x[k], x[k + 1])``. ``K`` is even (:func:`supports`)."""
    n, k = q.shape
    nt = 2 * width
    pad = (-n) % nt
    if pad:
        q = torch.cat([q, q.new_zeros(pad, k)])
    return q.view(-1, nt, k // 2, 2).transpose(1, 2).contiguous()


def pack_a8(q: torch.Tensor, width: int) -> torch.Tensor:
    """``q [N, K]`` int8 as the int8-activation kernel reads it: offset by 128 to unsigned
    bytes (``vpdpbusd``'s unsigned operand; the kernel subtracts 128 x the row's sum), in
    tiles of ``2 * width`` weight rows stored by quads of k with a row's four k's adjacent
    (``[ceil(N / 2w), K / 4, 2w, 4]``; padding rows are zero weights, 128). ``K`` is a
    multiple of 4 (:func:`supports`)."""
    n, k = q.shape
    nt = 2 * width
    pad = (-n) % nt
    if pad:
        q = torch.cat([q, q.new_zeros(pad, k)])
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    return u.view(-1, nt, k // 4, 4).transpose(1, 2).contiguous()


def supports(k: int, width: int, a8: bool = False) -> bool:
    """Whether the kernel takes input width ``k``: a multiple of its vector width (so whole
    pairs of k, and whole vectors for the activations' quantization), the widths it is tested
    with (every planner layer's is); with ``a8`` also at most :data:`A8_MAX_K`."""
    return k % width == 0 and (not a8 or k <= A8_MAX_K)


# K up to which the int8-activation kernel's int32 sums are exact (K * 255 * 127 < 2^31)
A8_MAX_K = 65536


def _matmul(fn: Callable[..., None], packed: torch.Tensor, s: torch.Tensor, n: int, k: int
            ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> y`` through the library function ``fn`` (``w8_linear`` or ``w8a8_linear``)
    over weights ``packed`` for it and channel scales ``s``; keeps both alive."""
    qp, sp = packed.data_ptr(), s.data_ptr()

    def mm(x: torch.Tensor) -> torch.Tensor:
        # hot path (every linear layer of every pass): no checks beyond what keeps the raw
        # pointers safe; the planner's activations are float32 and contiguous
        if x.dtype is not torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        fn(x.data_ptr(), qp, sp, y.data_ptr(), x.numel() // k, n, k, torch.get_num_threads())
        return y

    mm.keep = (packed, s)  # type: ignore[attr-defined]  # the pointers' owners
    return mm


def linear(q: torch.Tensor, scale: torch.Tensor, kernel: tuple[Callable[..., None], int]
           ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ (q * scale[:, None]).T`` for float32 ``x [..., K]`` through the kernel
    (each row of ``x`` rounded to int16 on its own scale, see ``w8_linear.cpp``)."""
    fn, width = kernel
    n, k = q.shape
    packed = pack(q, width)
    s = scale.float().contiguous()
    mm = _matmul(fn, packed, s, n, k)
    qp, sp = packed.data_ptr(), s.data_ptr()
    some_fn = _some.get(id(fn))

    def some(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``mm(x)[rows, cols]`` (int64 index tensors), bit for bit, computing only those
        outputs (``w8_linear_some``)."""
        assert some_fn is not None
        x = x.float().contiguous()
        y = torch.empty(rows.numel(), dtype=torch.float32)
        some_fn(x.data_ptr(), qp, sp, x.numel() // k, k, rows.data_ptr(), cols.data_ptr(),
                rows.numel(), y.data_ptr())
        return y

    if some_fn is not None:
        mm.some = some  # type: ignore[attr-defined]
    return mm


def linear_a8(q: torch.Tensor, scale: torch.Tensor, kernel: tuple[Callable[..., None], int]
              ) -> Callable[[torch.Tensor], torch.Tensor]:
    """As :func:`linear`, with each row of ``x`` rounded to int8 on its own scale (W8A8,
    ``w8a8_linear``): twice the multiply-adds per instruction, for the passes of many rows.
    Only where :func:`a8_supported`; no ``some`` (the LM head keeps :func:`linear`)."""
    fn, width = kernel
    n, k = q.shape
    return _matmul(_a8[id(fn)][0], pack_a8(q, width), scale.float().contiguous(), n, k)
