"""int8 weight-only linear layers for vLLM on CPUs with neither native bf16 nor int8 dot
products (AVX2): the answer model's linear layers through rufus's own kernel.

Why: there vLLM serves the answer model in fp32 (bf16 arithmetic is emulated, oneDNN's s8s8
path is slow and saturates), so every decode step reads four bytes per weight, and decode
steps are most of the answer engine's work under load. The planner's int8 kernel
(:mod:`rufus.machine.int8_kernel`: int8 weights read as one stream, each activation row
rounded to int16 on its own scale, exact integer sums) runs a decode step several times
faster than fp32 on such a CPU (the precision record: ``python -m rufus.launch.setup_precision``).

How: a vLLM quantization method, ``"quantization": "rufus_int8"``, registered when this module
is imported (it imports vLLM): by rufus.serving.config where a model's settings choose it
(rufus_llm's stub, a follower; every engine's arguments come from there), and by the worker
extension in every vLLM worker (a follower's spawned workers unpickle the config object). Its linear
method loads the checkpoint's weights as they are, then quantizes each layer and the LM head
per output channel (:func:`int8_kernel.quantize_int8`, as the planner), packs them for the
kernel and frees the linear layers' float weights; ``apply`` calls the kernel through a
PyTorch custom op (``torch.ops.rufus.w8_linear``), which vLLM's ``torch.compile`` keeps as
one opaque call. The input embedding keeps its float table (tied: the LM head's too).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import (
    QUANTIZATION_METHODS,
    register_quantization_config,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
)

from rufus.machine import int8_kernel
from rufus.machine.int8_kernel import quantize_int8
from rufus.machine.precision import INT8_WEIGHT_ONLY

log = logging.getLogger("rufus.machine.vllm_int8")

NAME = INT8_WEIGHT_ONLY  # the name precision.resolve_quantization chooses
_KERNEL: list = []  # the loaded kernel's w8_linear, once a layer is packed


@torch.library.custom_op("rufus::w8_linear", mutates_args=())
def w8_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
    """``x @ (q * scale[:, None]).T`` for float32 ``x [..., K]``, ``packed`` from
    :func:`int8_kernel.pack` (hot path: every linear layer of every step)."""
    fn = _KERNEL[0]  # set when the layers were packed (loading it reads /proc: not per call)
    k = x.shape[-1]
    if x.dtype is not torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
    rows = x.numel() // k if k else 0
    if rows:
        fn(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), y.data_ptr(), rows, n, k,
           torch.get_num_threads())
    return y


@w8_linear.register_fake
def _w8_linear_fake(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int
                    ) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], n, dtype=torch.float32)


def _pack(layer: torch.nn.Module, w: torch.Tensor) -> bool:
    """Give ``layer`` the kernel's int8 copy of ``w [N, K]`` (``w8_packed``, ``w8_scale``,
    ``w8_n``); False, with the reason logged, where the kernel cannot take it."""
    kernel = int8_kernel.load()
    if kernel is None or not int8_kernel.supports(w.shape[1], kernel[1]):
        why = int8_kernel.unavailable_reason() or f"input width {w.shape[1]}"
        log.warning("rufus_int8: %s kept in float (%s)", type(layer).__name__, why)
        return False
    if not _KERNEL:
        _KERNEL.append(kernel[0])
    q, scale = quantize_int8(w)
    layer.w8_packed = torch.nn.Parameter(int8_kernel.pack(q, kernel[1]), requires_grad=False)
    layer.w8_scale = torch.nn.Parameter(scale.float().contiguous(), requires_grad=False)
    layer.w8_n = int(w.shape[0])
    return True


class _Int8Apply:
    """``apply`` of both methods: the kernel where the layer was packed, else the float
    method next in the MRO."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if not getattr(layer, "rufus_int8", False):
            return super().apply(layer, x, bias)  # type: ignore[misc]
        y = torch.ops.rufus.w8_linear(x, layer.w8_packed, layer.w8_scale, layer.w8_n)
        return y if bias is None else y + bias


def register() -> bool:
    """Register ``rufus_int8`` with vLLM (idempotent; importing this module does it too)."""
    if NAME not in QUANTIZATION_METHODS:
        register_quantization_config(NAME)(Int8Config)
    return True


class Int8LinearMethod(_Int8Apply, UnquantizedLinearMethod):
    """The checkpoint's float weights loaded as usual, then int8 for the kernel."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if _pack(layer, layer.weight.data):
            layer.rufus_int8 = True
            del layer.weight  # the float copy: four bytes per weight no pass reads
        else:
            super().process_weights_after_loading(layer)
            layer.rufus_int8 = False


class Int8HeadMethod(_Int8Apply, UnquantizedEmbeddingMethod):
    """The LM head: an int8 copy for the logits, the float weight kept (with tied
    embeddings it is also the input embedding, looked up by row)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        layer.rufus_int8 = _pack(layer, layer.weight.data)


class Int8Config(QuantizationConfig):
    """``rufus_int8``: int8 weight-only linear layers and LM head (float activations). At
    module level: vLLM pickles its config, this object included, to a follower's workers."""

    def get_name(self) -> Any:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Int8Config:
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, LinearBase):
            return Int8LinearMethod()
        return Int8HeadMethod() if isinstance(layer, ParallelLMHead) else None


register()
