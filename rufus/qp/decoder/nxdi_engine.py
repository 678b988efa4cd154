"""The planner on Trainium/Inferentia: NxDI Medusa generation behind the torch engine's
interface. UNTESTED ON HARDWARE: the Neuron SDK only exists on Neuron hosts; this module is
written against NeuronX Distributed Inference's API (``NeuronConfig(is_medusa=True, ...)``,
``NeuronLlamaForCausalLM`` compile/load, ``HuggingFaceGenerationAdapter.generate`` with the
model as its own assistant, as NxDI's inference demo does for Medusa) and unit-tested
against a fake of that API (tests/unit/test_qp_nxdi.py).

Why a subclass of :class:`TorchPlannerEngine`: the serving side (EngineHost, admission,
cancellation, metrics, engine-death handling, the one decoding thread) is the same; only
the decoder differs. NxDI's Medusa loop runs a whole generation per call (batch 1, the
shipped ``medusa_tree`` compiled into the graph), so a request is one step, and two things
the torch decoder does are not available: the plan grammar is not applied token by token
(the output is validated after decoding, as for every backend: fallback plan on a schema
violation), and per-step Medusa counters and logprobs are not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rufus.qp.decoder.torch_engine import TorchPlannerEngine
from rufus.qp.settings import DecoderKnobs

log = logging.getLogger("rufus.qp.nxdi")

# the ``dtype`` values this path takes. "int8": NxDI's own int8 weight-only quantization (per
# output channel, symmetric; bf16 activations), the checkpoint quantized once by NxDI into
# NxdiSettings.quantized_path and compiled from there (NxdiRuntime.neuron_config).
DTYPES = ("bfloat16", "float16", "float32", "int8")


def export_nxdi_heads(model_dir: Path, medusa_dir: Path, num_heads: int,
                      out_dir: Path | None = None) -> Path:
    """Our heads in NxDI's layout, as ``<out_dir or model>/medusa_heads.pt`` (NxDI's
    ``get_state_dict`` merges that file into the checkpoint it loads, so a quantized
    checkpoint needs its own copy): ``medusa_head_{i}.0.linear.{weight,bias}`` (the
    residual block) and ``medusa_head_{i}.1.weight`` (the full vocabulary projection: our
    heads project through the model's own tied embedding)."""
    import torch
    from safetensors.torch import load_file

    src = load_file(str(medusa_dir / "model.safetensors"))
    emb_sd = load_file(str(model_dir / "model.safetensors"))
    emb = emb_sd.get("lm_head.weight", emb_sd["model.embed_tokens.weight"])
    out: dict[str, Any] = {}
    for i in range(num_heads):
        w = src[f"blocks.{i}.layers.0.weight"]
        out[f"medusa_head_{i}.0.linear.weight"] = w
        out[f"medusa_head_{i}.0.linear.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
        out[f"medusa_head_{i}.1.weight"] = emb.to(w.dtype)
    path = (out_dir or model_dir) / "medusa_heads.pt"
    torch.save(out, path)
    return path


@dataclass
class NxdiSettings:
    model: str
    compiled_path: str
    medusa_dir: str
    tree: list[list[int]]
    num_heads: int
    tp_degree: int = 1
    dtype: str = "bfloat16"
    max_len: int = 1024
    max_new_tokens: int = 96
    quantized_path: str = ""  # dtype int8: NxDI's quantized checkpoint (a directory)

    @property
    def speculation_length(self) -> int:
        return len(self.tree) + 1


class NxdiRuntime:
    """Every call into NxDI, in one place (what the unit tests replace with a fake)."""

    def __init__(self, s: NxdiSettings) -> None:
        self.s = s
        self.model: Any = None
        self.adapter: Any = None
        self.draft: Any = None

    def neuron_config(self) -> Any:
        import torch
        from neuronx_distributed_inference.models.config import NeuronConfig

        s = self.s
        # int8: the decoder layers' linear weights; the LM head and the Medusa heads stay bf16
        # (their weights reach NxDI in bf16: the tied embedding NxDI copies into lm_head, and
        # medusa_heads.pt), and NxD's convert skips modules whose names contain these keys
        quant: dict[str, Any] = {} if s.dtype != "int8" else {
            "quantized": True, "quantized_checkpoints_path": s.quantized_path,
            "quantization_type": "per_channel_symmetric", "quantization_dtype": "int8",
            "modules_to_not_convert": ["lm_head", "medusa_head"]}
        return NeuronConfig(
            tp_degree=s.tp_degree, batch_size=1, max_context_length=s.max_len - s.max_new_tokens,
            seq_len=s.max_len, max_new_tokens=s.max_new_tokens,
            torch_dtype=torch.bfloat16 if s.dtype == "int8" else getattr(torch, s.dtype),
            is_medusa=True, medusa_speculation_length=s.speculation_length,
            num_medusa_heads=s.num_heads, medusa_tree=s.tree, **quant)

    def load(self) -> None:
        """Compile once into ``compiled_path`` (minutes), then load onto the device."""
        from neuronx_distributed_inference.models.llama.modeling_llama import (
            LlamaInferenceConfig,
            NeuronLlamaForCausalLM,
        )
        from neuronx_distributed_inference.utils.hf_adapter import (
            HuggingFaceGenerationAdapter,
            load_pretrained_config,
        )

        s = self.s
        export_nxdi_heads(Path(s.model), Path(s.medusa_dir), s.num_heads)
        config = LlamaInferenceConfig(self.neuron_config(),
                                      load_config=load_pretrained_config(s.model))
        if s.dtype == "int8":  # quantize once, before compiling (as NxDI's inference demo)
            qdir = Path(s.quantized_path)
            if not any(qdir.glob("*.safetensors")):
                log.info("quantizing the planner to int8 for Neuron into %s (first start "
                         "only)", qdir)
                qdir.mkdir(parents=True, exist_ok=True)  # a directory: saved as safetensors
                NeuronLlamaForCausalLM.save_quantized_state_dict(s.model, config)
            export_nxdi_heads(Path(s.model), Path(s.medusa_dir), s.num_heads, qdir)
        self.model = NeuronLlamaForCausalLM(s.model, config)
        if not (Path(s.compiled_path) / "model.pt").exists():
            log.info("compiling the planner for Neuron into %s (first start only)",
                     s.compiled_path)
            self.model.compile(s.compiled_path)
        self.model.load(s.compiled_path)
        self.adapter = HuggingFaceGenerationAdapter(self.model)
        # NxDI's Medusa usage: the target model is its own assistant (draft) model
        self.draft = HuggingFaceGenerationAdapter(self.model)

    def generate(self, prompt: list[int], max_tokens: int, eos_ids: set[int], pad_id: int
                 ) -> list[int]:
        import torch

        ids = torch.tensor([prompt], dtype=torch.long)
        try:
            out = self.adapter.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=self.draft,
                do_sample=False, max_new_tokens=max_tokens, eos_token_id=sorted(eos_ids),
                pad_token_id=pad_id)
        finally:
            self.model.reset()  # clear the KV cache for the next request
        seq = out.sequences if hasattr(out, "sequences") else out
        return [int(t) for t in seq[0, len(prompt):].tolist()]


@dataclass
class _NxdiRun:
    prompt: list[int]
    max_tokens: int
    slot: int = 0


class NxdiDecoder:
    """The torch decoder's contract (``best_slot``, ``start``, ``step``) over
    one NxDI Medusa generation per request: batch 1, so a step is always one run."""

    def __init__(self, runtime: NxdiRuntime, tree: Any, eos_ids: set[int], pad_id: int) -> None:
        self.runtime = runtime
        self.tree = tree
        self.eos_ids = eos_ids
        self.pad_id = pad_id

    def best_slot(self, prompt: list[int], free: list[int]) -> int:
        return free[0]

    def start(self, prompt: list[int], max_tokens: int, grammar: Any = None,
              logprobs: int = 0, slot: int = 0) -> _NxdiRun:
        if len(prompt) + max_tokens > self.runtime.s.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds "
                             f"the compiled sequence length ({self.runtime.s.max_len})")
        return _NxdiRun(prompt, max_tokens, slot)

    def step(self, runs: list[_NxdiRun]) -> list[Any]:
        from rufus.qp.decoder.medusa_decode import Step

        if len(runs) != 1:
            raise ValueError("NxDI Medusa generation is batch 1 (torch_max_batch must be 1)")
        r = runs[0]
        toks = self.runtime.generate(r.prompt, r.max_tokens, self.eos_ids, self.pad_id)
        # NxDI's loop may run past EOS within a step and past max_new_tokens by a step
        end = next((i + 1 for i, t in enumerate(toks) if t in self.eos_ids), None)
        finish = "stop" if end is not None and end <= r.max_tokens else "length"
        toks = toks[:min(end or len(toks), r.max_tokens)]
        if not toks:
            raise RuntimeError("NxDI returned no tokens")
        return [Step(toks, None, 0, 0, finish)]


class NxdiPlannerEngine(TorchPlannerEngine):
    """:class:`TorchPlannerEngine` with the decoder replaced by NxDI Medusa generation."""

    def __init__(self, args: dict[str, Any], *, tree_paths: list[list[int]],
                 medusa_dir: str, num_heads: int, runtime_cls: type[NxdiRuntime] = NxdiRuntime,
                 on_stats: Callable[[int, int, int], None] | None = None,
                 knobs: DecoderKnobs | None = None) -> None:
        self._runtime_cls = runtime_cls
        self._warned_grammar = False
        super().__init__(args, tree_paths=tree_paths, medusa_dir=medusa_dir,
                         num_heads=num_heads, on_stats=on_stats, knobs=knobs)

    def _load(self, args: dict[str, Any], tree_paths: list[list[int]] | None,
              medusa_dir: str | None, num_heads: int, eos: set[int]) -> Any:
        from rufus.qp.decoder.medusa_decode import Tree

        assert tree_paths is not None and medusa_dir
        model = str(args["model"])
        dtype = str(args.get("dtype", "bfloat16"))  # validated in rufus/qp/backends.py
        int8 = "-int8" if dtype == "int8" else ""  # its own compiled graph and checkpoint
        settings = NxdiSettings(
            model=model, medusa_dir=medusa_dir, tree=tree_paths, num_heads=num_heads,
            compiled_path=self.knobs.nxdi_compiled_path
            or str(Path(model).with_name(Path(model).name + "-neuron" + int8)),
            tp_degree=int(args.get("tensor_parallel_size", 1)), dtype=dtype,
            max_len=self.max_len, max_new_tokens=self.knobs.nxdi_max_new_tokens,
            quantized_path=str(Path(model).with_name(Path(model).name + "-int8")) if int8
            else "")
        runtime = self._runtime_cls(settings)
        runtime.load()
        pad = self.tokenizer.pad_token_id
        return NxdiDecoder(runtime, Tree.from_paths(tree_paths), eos,
                           int(pad if pad is not None else min(eos)))

    def _grammar(self, schema: Any) -> Any:
        if not self._warned_grammar:
            log.warning("qp_backend nxdi: the plan grammar is not applied during NxDI "
                        "generation; outputs are validated after decoding (fallback plan)")
            self._warned_grammar = True
        return None

    def warm_grammar(self, schema: Any) -> None:
        """Nothing to compile: see :meth:`_grammar`."""
