"""A minimal Llama forward pass for batch-1 decoding with tree attention (PyTorch, CPU).

Why not vLLM or transformers here: at batch size 1 on a CPU the planner's cost per step is
framework overhead, not arithmetic. vLLM's speculative-decoding step costs a multiple of its
plain decoding step on this machine, which capped Medusa's speedup there (docs/benchmarks-history.md,
"Query planner"). This module does only what the
planner needs: fused QKV and gate/up projections, one KV-cache tensor for all layers (so
accepted tree nodes are compacted with one indexing op), and an explicit attention mask, so
one forward pass verifies a whole Medusa tree (each node sees the prompt, the accepted tokens
and its own ancestors).

Llama-architecture checkpoints only (``LlamaForCausalLM``: SmolLM2, Llama 2/3 and the like).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from rufus.env import lab_on
from rufus.machine import int8_kernel
from rufus.machine.int8_kernel import quantize_int8

log = logging.getLogger("rufus.qp.torch")

# dtype name -> the activation (and KV-cache) dtype. "int8" is int8 weight-only: every linear
# weight int8 per output channel (:func:`quantize_int8`), activations in float32 through our
# kernel where it builds (:func:`int8_activations`), else bf16 (PyTorch's op).
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
          "int8": torch.bfloat16}
FP32_PACK_ROWS = 8  # oneDNN blocking hint: the few-row verification passes
# Passes of at most this many rows run through the fused int8 stack (:class:`_FusedStack`),
# longer ones op by op, whose attention (PyTorch's fused kernel) catches up with the fused
# pass around this size (measured on both CPU classes: docs/benchmarks-history.md, "Follow-ups").
# So a question's prefill, a follow-up's history included, takes the fused pass.
FUSED_MAX_ROWS = 128
_int8_op_failed: list[str] = []  # why _weight_int8pack_mm is not used (logged once)


def check_dtype(dtype: str) -> str:
    """``dtype`` if the torch planner offers it, else a ValueError naming the choices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported by the torch planner: use one of "
                         f"{', '.join(DTYPES)}")
    return dtype


def _packed_linear(w: torch.Tensor) -> Any:
    """``x -> x @ w.T`` with the weight pre-packed for oneDNN where that measured faster.

    bf16: unpacked ``F.linear`` re-lays the weight out for oneDNN on every call, which made
    the gate/up projection (most of the forward pass here) nearly twice as slow
    (docs/benchmarks.md). This is what inductor's weight freezing does for vLLM on CPU.

    fp32 (the choice where bf16 is emulated): ``F.linear`` goes to MKL, which is fast for one
    row and slow for the few-row passes Medusa verifies (8 rows of the LM head cost ~3x one
    row); oneDNN's pre-packed fp32 matmul is faster for those and slower for one row, so
    one-row calls keep ``F.linear`` and others take the packed copy (the weight is held
    twice: +4 bytes per parameter). ``RUFUS_LAB_OFF=fp32_packed`` turns this off.
    """
    if not torch.backends.mkldnn.is_available():
        return lambda x: F.linear(x, w)
    if w.dtype == torch.bfloat16:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
            probe = torch.zeros(2, w.shape[1], dtype=w.dtype)
            torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
            return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        except (RuntimeError, AttributeError):  # no oneDNN bf16 on this CPU or build
            pass
    elif w.dtype == torch.float32 and lab_on("fp32_packed"):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, FP32_PACK_ROWS)
            probe = torch.zeros(2, w.shape[1], dtype=w.dtype)
            torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
        except (RuntimeError, AttributeError):
            return lambda x: F.linear(x, w)
        inner = w.shape[1]

        def mm(x: torch.Tensor) -> torch.Tensor:
            # hot path: one branch on the row count, no copies
            if x.numel() == inner:
                return F.linear(x, w)
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

        return mm
    return lambda x: F.linear(x, w)


def int8_activations() -> torch.dtype:
    """The activation dtype of ``int8`` on this CPU: float32 through our kernel
    (:mod:`rufus.machine.int8_kernel`) where it builds, else bf16 for PyTorch's op."""
    return torch.float32 if int8_kernel.load() is not None else torch.bfloat16


def _int8_linear(w: torch.Tensor, activations: torch.dtype = torch.bfloat16
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ w.T`` with ``w`` int8 weight-only (:func:`quantize_int8`).

    float32 ``activations``: our kernel (:mod:`rufus.machine.int8_kernel`; each row
    rounded to int16 on its own scale, integer products, nothing emulated). bf16:
    ``aten._weight_int8pack_mm`` (bf16 activations only: with fp32 the op is many times
    slower on CPU), else (op missing, or it fails a probe at build time) the dequantized bf16
    weight through :func:`_packed_linear`: the same values, without the memory or speed
    saving."""
    q, scale = quantize_int8(w)
    if activations == torch.float32:
        kernel = int8_kernel.load()
        if kernel is not None and int8_kernel.supports(q.shape[1], kernel[1]):
            return int8_kernel.linear(q, scale, kernel)
        return lambda x: F.linear(x, q.float() * scale[:, None])  # same values, no saving
    s = scale.to(torch.bfloat16)
    if not _int8_op_failed:
        try:
            torch.ops.aten._weight_int8pack_mm(torch.zeros(2, q.shape[1], dtype=torch.bfloat16),
                                               q, s)

            def mm(x: torch.Tensor) -> torch.Tensor:
                y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, q.shape[1]), q, s)
                return y.view(*x.shape[:-1], q.shape[0])

            return mm
        except (RuntimeError, AttributeError) as exc:  # op missing or this CPU/build lacks it
            _int8_op_failed.append(f"{type(exc).__name__}: {exc}")
            log.warning("int8 weights: aten._weight_int8pack_mm unavailable (%s); using "
                        "dequantized bf16 weights", _int8_op_failed[0])
    return _packed_linear(q.to(torch.bfloat16) * s[:, None])


def _int8_linear_a8(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ w.T``, ``w`` int8 (:func:`quantize_int8`) and each row of ``x`` rounded to
    int8 (:func:`int8_kernel.linear_a8`); only where :func:`int8_kernel.a8_supported`."""
    kernel = int8_kernel.load()
    assert kernel is not None
    q, scale = quantize_int8(w)
    return int8_kernel.linear_a8(q, scale, kernel)


def _linear_for(weights: str) -> Callable[[torch.Tensor], Any]:
    """The linear-layer builder for a dtype name (weights given in any float dtype)."""
    if weights == "int8":
        act = int8_activations()
        return lambda w: _int8_linear(w, act)
    dt = DTYPES[weights]
    return lambda w: _packed_linear(w.to(dt).contiguous())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Segment(NamedTuple):
    """One sequence's part of a packed forward pass: ``ids`` at positions ``pos`` written to
    cache slots ``start .. start+n-1`` of region ``slot``; ``mask`` ``[n, start+n]`` (True =
    may attend) or None (every query sees every slot up to start+n)."""

    ids: torch.Tensor
    pos: torch.Tensor
    start: int
    mask: torch.Tensor | None
    slot: int = 0


class TorchLlama:
    """Weights plus a KV cache of ``slots`` regions of ``max_len`` tokens each
    (``[layers, 2, kv_heads, slots * max_len, head_dim]``): one region per sequence decoded
    in the same pass."""

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", max_len: int = 1024,
                 slots: int = 1, a8: bool = False) -> None:
        """``a8``: with int8 weights, the decoder layers' linears multiply
        int8 activations (W8A8) where the kernel can (:func:`int8_kernel.a8_supported`);
        the LM head keeps int16 activations. :attr:`a8` says whether it applies."""
        from safetensors.torch import load_file

        model_dir = Path(model_dir)
        cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        arch = (cfg.get("architectures") or ["?"])[0]
        if cfg.get("model_type") != "llama":
            raise ValueError(f"{model_dir}: torch planner path supports Llama models, got {arch}")
        # activations, norms, KV cache (int8: float32 where our kernel runs)
        self.dtype = int8_activations() if check_dtype(dtype) == "int8" else DTYPES[dtype]
        self.weights = dtype  # linear weights: "int8" = int8 weight-only
        self.max_len = max_len
        self.hidden = int(cfg["hidden_size"])
        self.inter = int(cfg["intermediate_size"])
        self.n_layers = int(cfg["num_hidden_layers"])
        self.nq = int(cfg["num_attention_heads"])
        self.nkv = int(cfg.get("num_key_value_heads", self.nq))
        self.hd = int(cfg.get("head_dim") or self.hidden // self.nq)
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.vocab_size = int(cfg["vocab_size"])
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if rope.get("rope_type", "default") not in ("default", None):
            raise ValueError(f"{model_dir}: rope type {rope.get('rope_type')} not supported")
        theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)

        sd: dict[str, torch.Tensor] = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            sd.update(load_file(str(f)))

        def w(name: str) -> torch.Tensor:
            return sd[name].to(self.dtype).contiguous()

        linear = _linear_for(dtype)  # from the checkpoint's own precision
        # the layers' linears: W8A8 where asked for and the kernel has it
        kernel = int8_kernel.load() if dtype == "int8" else None
        vnni = kernel is not None and int8_kernel.a8_supported()
        self.a8 = bool(a8 and vnni and kernel is not None and self.dtype == torch.float32
                       and all(int8_kernel.supports(k, kernel[1], a8=True)
                               for k in (self.hidden, self.nq * self.hd, self.inter)))
        if a8 and not self.a8:
            log.info("int8_activations asked for, not applied: it needs int8 weights (here "
                     "%s) and the int8 kernel's AVX-512 VNNI build (here %s); the layers keep "
                     "int16 activations", dtype, "loaded" if vnni else "not this CPU's")
        layer_linear = _int8_linear_a8 if self.a8 else linear
        self.embed = w("model.embed_tokens.weight")
        self.lm_head = linear(sd.get("lm_head.weight", self.embed))  # tied: the embedding
        self.norm = w("model.norm.weight")
        self.layers: list[dict[str, Any]] = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "ln1": w(p + "input_layernorm.weight"),
                "ln2": w(p + "post_attention_layernorm.weight"),
                "qkv": layer_linear(torch.cat([sd[p + "self_attn.q_proj.weight"],
                                               sd[p + "self_attn.k_proj.weight"],
                                               sd[p + "self_attn.v_proj.weight"]])),
                "o": layer_linear(sd[p + "self_attn.o_proj.weight"]),
                "gate_up": layer_linear(torch.cat([sd[p + "mlp.gate_proj.weight"],
                                                   sd[p + "mlp.up_proj.weight"]])),
                "down": layer_linear(sd[p + "mlp.down_proj.weight"]),
            })
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(self.dtype)
        self.sin = emb.sin().to(self.dtype)
        self.slots = slots
        self.cache = torch.zeros(self.n_layers, 2, self.nkv, slots * max_len, self.hd,
                                 dtype=self.dtype)
        self._fused = _FusedStack.of(self) if dtype == "int8" else None

    @property
    def fused(self) -> bool:
        """Whether passes run every layer in one call of our kernel (:class:`_FusedStack`)."""
        return self._fused is not None

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int,
                mask: torch.Tensor | None, slot: int = 0) -> torch.Tensor:
        """Final-norm hidden states ``[n, hidden]`` of one sequence (see :class:`Segment`)."""
        return self.forward_many([Segment(ids, pos, start, mask, slot)])

    @torch.inference_mode()
    def forward_many(self, segs: list[Segment]) -> torch.Tensor:
        """Final-norm hidden states of every segment's tokens, concatenated in order.

        Hot path. The linear layers run once over all rows (on a CPU they cost the weight
        bytes read, so rows of several sequences share that cost); attention runs per
        segment over its own cache region.
        """
        nq, nkv, hd = self.nq, self.nkv, self.hd
        g = nq // nkv
        scale = hd ** -0.5
        spans = []  # (first row, rows, region start, write start, end, bias, sdpa mask)
        row = 0
        stack = (self._fused if self._fused is not None
                 and sum(sg.ids.shape[0] for sg in segs) <= FUSED_MAX_ROWS else None)
        fused = stack is not None
        for sg in segs:
            n = sg.ids.shape[0]
            end = sg.start + n
            if end > self.max_len or not 0 <= sg.slot < self.slots:
                raise ValueError(f"sequence of {end} tokens exceeds the cache ({self.max_len}) "
                                 f"or slot {sg.slot} is not in 0..{self.slots - 1}")
            bias = None if sg.mask is None or fused else torch.zeros(
                sg.mask.shape).masked_fill_(~sg.mask, float("-inf"))
            spans.append((row, n, sg.slot * self.max_len, sg.start, end, bias,
                          None if sg.mask is None else sg.mask[None, None]))
            row += n
        if len(segs) == 1:
            ids, pos = segs[0].ids, segs[0].pos
        else:
            ids, pos = torch.cat([sg.ids for sg in segs]), torch.cat([sg.pos for sg in segs])
        rows = row
        if stack is not None:
            x = stack(self.embed[ids], pos, segs, spans)
            return F.rms_norm(x, (self.hidden,), self.norm, self.eps)
        x = self.embed[ids]
        cos, sin = self.cos[pos], self.sin[pos]
        for i, lw in enumerate(self.layers):
            h = F.rms_norm(x, (self.hidden,), lw["ln1"], self.eps)
            qkv = lw["qkv"](h)
            q = qkv[:, : nq * hd].view(rows, nq, hd).transpose(0, 1)
            k = qkv[:, nq * hd: (nq + nkv) * hd].view(rows, nkv, hd).transpose(0, 1)
            v = qkv[:, (nq + nkv) * hd:].view(rows, nkv, hd).transpose(0, 1)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kv = self.cache[i]
            outs = []
            for r0, n, base, start, end, bias, attn_mask in spans:
                kv[0, :, base + start:base + end] = k[:, r0:r0 + n]
                kv[1, :, base + start:base + end] = v[:, r0:r0 + n]
                ks, vs = kv[0, :, base:base + end], kv[1, :, base:base + end]
                qs = q[:, r0:r0 + n]
                if n <= 64:  # decode / tree verification: two small batched matmuls
                    s_ = torch.matmul(qs.reshape(nkv, g * n, hd), ks.transpose(1, 2))
                    s_ = s_.float().mul_(scale)
                    if bias is not None:
                        s_ = s_.view(nkv, g, n, end).add_(bias).view(nkv, g * n, end)
                    a = torch.matmul(s_.softmax(-1).to(self.dtype), vs)
                    outs.append(a.view(nq, n, hd))
                else:  # prefill: the fused kernel
                    outs.append(F.scaled_dot_product_attention(
                        qs[None], ks[None], vs[None], attn_mask=attn_mask, enable_gqa=True)[0])
            a = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
            x = x + lw["o"](a.transpose(0, 1).reshape(rows, nq * hd))
            h = F.rms_norm(x, (self.hidden,), lw["ln2"], self.eps)
            gate, up = lw["gate_up"](h).chunk(2, dim=-1)
            x = x + lw["down"](F.silu(gate) * up)
        return F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for ``hidden`` rows (computed in the model dtype)."""
        return self.lm_head(hidden).float()

    @property
    def logits_some(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                      torch.Tensor] | None:
        """``(hidden, rows, cols) -> logits(hidden)[rows, cols]``, bit for bit, computing
        only those, where the LM head runs through our int8 kernel; else None."""
        return getattr(self.lm_head, "some", None)

    def compact(self, src: list[int], dst_start: int, slot: int = 0) -> None:
        """Move KV of cache slots ``src`` to ``dst_start, dst_start+1, ...`` (accepted path)
        within region ``slot``."""
        if src == list(range(dst_start, dst_start + len(src))):
            return
        base = slot * self.max_len
        idx = torch.tensor(src) + base
        self.cache[:, :, :, base + dst_start: base + dst_start + len(src)] = \
            self.cache[:, :, :, idx]


class _FusedStack:
    """Every decoder layer of a pass in one call of ``w8_forward`` (rufus/qp/decoder/
    w8_linear.cpp): int8 weights through our kernel, float32 everywhere else.

    Why: at the planner's few rows per pass, PyTorch's ~50 small ops per layer (norms,
    rotary, attention, residuals, each with its dispatch and allocation) cost about as much
    as reading the weights (docs/benchmarks.md). Same contract as the op-by-op pass it
    replaces: each row's result depends only on its own tokens and the keys it may see
    (the kernel sums over the visible keys only, in slot order), so tree verification
    reproduces one-row greedy decoding. Passes of more than :data:`FUSED_MAX_ROWS` rows
    stay op by op; ``RUFUS_LAB_OFF=fused`` keeps every pass op by op.
    """

    FIELDS = ("qkv", "o", "gate_up", "down")

    def __init__(self, fn: Callable[..., None], model: TorchLlama, ptrs: list[int]) -> None:
        self.fn = fn
        self.model = model
        self.ptrs = torch.tensor(ptrs, dtype=torch.int64)
        self.dims = torch.tensor([model.hidden, model.nq, model.nkv, model.hd, model.inter,
                                  model.slots * model.max_len], dtype=torch.int64)

    @classmethod
    def of(cls, model: TorchLlama) -> _FusedStack | None:
        """The fused stack for ``model`` (int8 through our kernel), or None where it does not
        apply: the kernel did not load, a width is not a multiple of its vector width, or
        ``RUFUS_LAB_OFF=fused``."""
        if model.dtype != torch.float32 or not lab_on("fused"):
            return None
        kernel, fn = int8_kernel.load(), int8_kernel.forward_fn(model.hd, a8=model.a8)
        if kernel is None or fn is None or model.nq % model.nkv:
            return None
        if not all(int8_kernel.supports(v, kernel[1]) for v in (model.hidden, model.inter)):
            return None
        ptrs: list[int] = []
        for lw in model.layers:
            for name in cls.FIELDS:
                packed = getattr(lw[name], "keep", None)  # int8_kernel.linear's tensors
                if packed is None:
                    return None
                ptrs += [packed[0].data_ptr(), packed[1].data_ptr()]
            ptrs += [lw["ln1"].data_ptr(), lw["ln2"].data_ptr()]
        log.info("planner passes: every layer in one call of the int8 kernel (%s "
                 "activations)", "int8" if model.a8 else "int16")
        return cls(fn, model, ptrs)

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, segs: list[Segment],
                 spans: list[tuple[Any, ...]]) -> torch.Tensor:
        """Hot path: ``x`` (the rows' embeddings, a fresh tensor) through every layer, in
        place."""
        m = self.model
        sp = torch.tensor([v for r0, n, base, start, end, _b, _m in spans
                           for v in (r0, n, base, start, end)], dtype=torch.int64)
        masks = [None if sg.mask is None else sg.mask.to(torch.bool).contiguous()
                 for sg in segs]
        for k, (_r0, n, _base, _start, end, _b, _m) in zip(masks, spans, strict=True):
            if k is not None and tuple(k.shape) != (n, end):  # the kernel reads n * end
                raise ValueError(f"attention mask of shape {tuple(k.shape)}, expected "
                                 f"({n}, {end})")
        mp = torch.tensor([0 if k is None else k.data_ptr() for k in masks], dtype=torch.int64)
        pos = pos.to(torch.int64).contiguous()
        self.fn(x.data_ptr(), x.shape[0], m.n_layers, self.dims.data_ptr(), m.eps,
                self.ptrs.data_ptr(), m.cache.data_ptr(), sp.data_ptr(), mp.data_ptr(),
                len(segs), pos.data_ptr(), m.cos.data_ptr(), m.sin.data_ptr(),
                torch.get_num_threads())
        return x


class MedusaHeads:
    """Medusa-1 heads as trained by scripts/train_medusa.py (vLLM's checkpoint layout):
    head k is ``z = h + silu(W_k h)`` then a (truncated-vocabulary) LM head mapped back to
    token ids through ``token_map``."""

    def __init__(self, medusa_dir: str | Path, dtype: str | torch.dtype, num_heads: int
                 ) -> None:
        """``dtype``: a :data:`DTYPES` name (the model's ``weights``: "int8" quantizes the
        blocks and the LM head as in the model) or a torch dtype."""
        from safetensors.torch import load_file

        sd = load_file(str(Path(medusa_dir) / "model.safetensors"))
        avail = sum(1 for k in sd if k.startswith("blocks.") and k.endswith(".layers.0.weight"))
        if num_heads > avail:
            raise ValueError(f"num_medusa_heads={num_heads} but {medusa_dir} has {avail} heads")
        self.num_heads = num_heads
        linear = _linear_for(check_dtype(
            dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")))
        # all heads' residual blocks as one [heads * hidden, hidden] linear layer
        self.blocks = linear(torch.cat([sd[f"blocks.{k}.layers.0.weight"]
                                        for k in range(num_heads)]))
        self.lm_head = linear(sd["lm_head.weight"])
        self.token_map = sd.get("token_map")

    @torch.inference_mode()
    def topk(self, hidden: torch.Tensor, k: int, heads: int = 0) -> list[list[int]]:
        """Top-``k`` token ids of the first ``heads`` heads (default all) for one hidden
        state ``[hidden]``."""
        h = self.blocks(hidden[None, :]).view(self.num_heads, -1)[:heads or self.num_heads]
        z = hidden[None, :] + F.silu(h)  # [heads, hidden]
        idx = self.lm_head(z).topk(k, dim=-1).indices
        if self.token_map is not None:
            idx = self.token_map[idx]
        return idx.tolist()
