"""Execution paths of the query planner behind one interface.

``PlannerBackend.engine_args`` turns the planner's model.json (vLLM engine arguments plus the
NxDI-style Medusa knobs) into what the engine needs; ``create_backend`` picks the path:

* ``torch_medusa`` (default off Neuron): the project's own batch-1 decoder
  (rufus/qp/decoder/medusa_decode.py): the ``medusa_tree`` verified in one forward pass with a tree
  attention mask, greedy acceptance under the plan grammar (rufus/qp/decoder/grammar.py);
  the tokens the grammar forces (``grammar_drafts``) and the plan skeleton
  (``history_drafts``: forced text, the question's words and phrase ends, earlier plans'
  usual followers) join the same pass; without a skeleton, prompt-lookup copies
  (``lookup_drafts``) do. The
  fastest correct path measured on the 2-core CPU, where vLLM's speculative step costs more
  than twice its plain step (figures: docs/benchmarks-history.md, "Query planner").
* ``torch_autoregressive``: the same decoder without the heads or any draft (algorithmic
  baseline: one token per forward pass).
* ``vllm_medusa``: vLLM speculative decoding with our Medusa heads as the draft (top-1 chain
  of ``vllm_num_speculative_tokens`` heads); continuous batching, for batch > 1 or GPUs.
* ``autoregressive``: the same model in vLLM without speculation (the serving baseline, and
  the fallback when the heads are missing).
* ``nxdi`` (Trainium/Inferentia): NeuronX Distributed Inference with
  ``NeuronConfig(is_medusa=True, ...)`` and the sparse ``medusa_tree``, served by
  rufus/qp/decoder/nxdi_engine.py. UNTESTED on hardware: the Neuron SDK only exists on Neuron
  hosts; written against NxDI's API and unit-tested against a fake of it.

The knobs mirror NxDI: ``num_medusa_heads`` (trained heads used), ``medusa_speculation_length``
(tokens verified per step = tree nodes + 1 root) and ``medusa_tree`` (candidate paths, each a
list of top-k ranks per head, built by scripts/build_medusa_tree.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rufus.machine import precision
from rufus.qp.settings import QP_KEYS, DecoderKnobs
from rufus.serving.admission import Features, queue_features, shared_pass_features
from rufus.serving.config import ConfigError, expand

log = logging.getLogger("rufus.qp")

# what the torch decoder reads from model.json; the other vLLM engine arguments do not apply
# (``copy_fields`` changes what is decoded, so the plain reference has it too)
TORCH_ARGS = ("model", "dtype", "max_model_len", "torch_threads", "copy_fields",
              "torch_max_batch")
# the speculative torch path's extra drafts (rufus/qp/decoder/medusa_decode.py): verified in
# the same pass as the Medusa tree; ``torch_autoregressive``, the plain reference, has none
DRAFT_ARGS = ("grammar_drafts", "lookup_drafts", "max_draft_nodes", "batch_draft_nodes",
              "history_drafts")


@dataclass
class MedusaSettings:
    """The NxDI-mirroring knobs, validated against each other."""

    num_medusa_heads: int
    medusa_speculation_length: int
    medusa_tree: list[list[int]]
    medusa_model: str
    vllm_num_speculative_tokens: int

    def check(self) -> None:
        if self.num_medusa_heads < 1:
            raise ConfigError("num_medusa_heads must be >= 1")
        paths = {tuple(p) for p in self.medusa_tree}
        for p in self.medusa_tree:
            if not p or len(p) > self.num_medusa_heads or any(int(k) < 0 for k in p):
                raise ConfigError(f"medusa_tree path {p} must have 1..num_medusa_heads "
                                  "non-negative ranks")
            if len(p) > 1 and tuple(p[:-1]) not in paths:
                raise ConfigError(f"medusa_tree path {p}: its parent {p[:-1]} is missing")
        if self.medusa_speculation_length != len(self.medusa_tree) + 1:
            raise ConfigError(f"medusa_speculation_length ({self.medusa_speculation_length}) "
                              f"must be the tree's node count + 1 ({len(self.medusa_tree) + 1})")
        if not 1 <= self.vllm_num_speculative_tokens <= self.num_medusa_heads:
            raise ConfigError("vllm_num_speculative_tokens must be in 1..num_medusa_heads")


def load_tree(value: Any) -> list[list[int]]:
    """``medusa_tree`` is inline (list of paths) or a path to a JSON file with ``tree``."""
    if isinstance(value, list | tuple):
        return [list(map(int, p)) for p in value]
    if isinstance(value, str):
        path = Path(expand(value))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"medusa_tree file {path}: {exc}") from exc
        return load_tree(data["medusa_tree"] if isinstance(data, dict) else data)
    raise ConfigError("medusa_tree must be a list of paths or a JSON file path")


MEASURED = precision.MEASURED  # model.json value resolved on this machine


def measured_tree(args: dict[str, Any]) -> dict[str, Any]:
    """``"medusa_tree": "measured"``: the tree setup grew on this machine's pass costs for the
    served precision (rufus/qp/tree.py ``machine_trees``), else the committed one."""
    rec = precision.stored(str(args["model"])) or {}
    dtype = str(args.get("dtype"))
    grown = (rec.get("planner_trees") or {}).get(dtype)
    if not isinstance(grown, dict) or not grown.get("medusa_tree"):
        log.info("medusa_tree: no tree measured on this CPU for %s (run `scripts/setup.sh "
                 "precision`); serving the committed medusa_tree.json", dtype)
        return {"medusa_tree": "medusa_tree.json"}
    paths = grown["medusa_tree"]
    log.info("medusa_tree: %d nodes grown on this CPU's %s pass costs (modelled %.2fx)",
             len(paths), dtype, float(grown.get("modelled_speedup", 0)))
    return {"medusa_tree": paths, "medusa_speculation_length": len(paths) + 1}


def tree_args(args: dict[str, Any], version_dir: Path) -> dict[str, Any]:
    """``args`` (model.json with ``model`` and ``dtype`` resolved) with ``medusa_tree`` as
    served on this machine: "measured" resolved (:func:`measured_tree`), a relative file
    name made a path in the model's version directory."""
    out = dict(args)
    if out.get("medusa_tree") == MEASURED:
        out.update(measured_tree(out))
    tree = out.get("medusa_tree")
    if isinstance(tree, str) and not tree.startswith("/"):
        out["medusa_tree"] = str(version_dir / tree)
    return out


def served_tree(model_json: dict[str, Any], version_dir: Path, model: str, dtype: str
                ) -> list[list[int]]:
    """The tree the planner serves with ``model_json`` from ``version_dir`` on this machine
    (what tools such as scripts/eval_qp.py must measure)."""
    return load_tree(tree_args({**model_json, "model": model, "dtype": dtype},
                               version_dir)["medusa_tree"])


def _check_dtype(args: dict[str, Any], backend: str, dtypes: Any) -> None:
    """``dtype`` (default bfloat16) is one of the backend's ``dtypes``, else a ConfigError."""
    dtype = str(args.get("dtype", "bfloat16"))
    if dtype not in dtypes:
        raise ConfigError(f"dtype {dtype!r} is not supported by qp_backend {backend}: use one "
                          f"of {', '.join(dtypes)} (int8: int8 weight-only)")


@dataclass
class PlannerBackend:
    """Base: split model.json into engine args and planner settings."""

    name: str
    medusa: MedusaSettings | None = None
    structured_output: bool = True
    # drop plan filters not written in the question/history (rufus/qp/filter_grounding.py)
    ground_filters: bool = True
    knobs: DecoderKnobs = field(default_factory=DecoderKnobs)  # model.json's, typed

    def engine_args(self, args: dict[str, Any]) -> dict[str, Any]:
        if str(args.get("dtype")) == "int8":  # vLLM on CPU has no int8 weight-only kernel
            raise ConfigError(f"dtype 'int8' (int8 weight-only) is served by qp_backend "
                              f"torch_medusa, torch_autoregressive or nxdi, not {self.name}")
        return {k: v for k, v in args.items() if k not in QP_KEYS}

    @property
    def tokens_per_step_max(self) -> int:
        return 1

    def engine_factory(self, on_stats: Any = None) -> Any:
        """None: the engine is vLLM's AsyncLLM built from :meth:`engine_args`."""
        return None

    def admission_features(self) -> Features:
        """How the admission reads the queue: each plan ahead adds its time."""
        return queue_features


class AutoregressiveBackend(PlannerBackend):
    """Plain greedy decoding of the same model in vLLM: one token per forward pass."""


class TorchBackend(PlannerBackend):
    """rufus/qp/decoder/torch_engine.py: batch-1 decoding in PyTorch, Medusa tree or plain."""

    def engine_args(self, args: dict[str, Any]) -> dict[str, Any]:
        from rufus.qp.decoder.torch_llama import DTYPES

        DecoderKnobs.from_model_json(args)  # the knobs it passes on: a bad value fails, named
        _check_dtype(args, self.name, DTYPES)
        keys = TORCH_ARGS + (DRAFT_ARGS if self.medusa is not None else ())
        return {k: args[k] for k in keys if k in args}

    @property
    def tokens_per_step_max(self) -> int:
        return 1 if self.medusa is None else 1 + max(len(p) for p in self.medusa.medusa_tree)

    def engine_factory(self, on_stats: Any = None) -> Any:
        from rufus.qp.decoder.torch_engine import TorchPlannerEngine

        medusa, knobs = self.medusa, self.knobs

        def build(args: dict[str, Any]) -> Any:
            return TorchPlannerEngine(
                args, tree_paths=None if medusa is None else medusa.medusa_tree,
                medusa_dir=None if medusa is None else medusa.medusa_model,
                num_heads=0 if medusa is None else medusa.num_medusa_heads, on_stats=on_stats,
                knobs=knobs)

        return build

    def admission_features(self) -> Features:
        """Up to ``torch_max_batch`` plans share each tree pass: the ones ahead that fit in
        the batch slow a pass a little, only those beyond it make a new plan wait."""
        return shared_pass_features(self.knobs.torch_max_batch)


class VllmMedusaBackend(PlannerBackend):
    """vLLM speculative decoding, method "medusa": chain of the heads' top-1 tokens."""

    def engine_args(self, args: dict[str, Any]) -> dict[str, Any]:
        assert self.medusa is not None
        out = super().engine_args(args)
        out["speculative_config"] = {
            "method": "medusa",
            "model": self.medusa.medusa_model,
            "num_speculative_tokens": self.medusa.vllm_num_speculative_tokens,
        }
        # vLLM 0.32's Medusa creates its ``token_map`` (our truncated draft vocabulary) in
        # load_weights without reporting it as loaded, so the loader's strict "every
        # parameter came from the checkpoint" check fails; it is a check, not a transform.
        extra = dict(out.get("model_loader_extra_config") or {})
        extra.setdefault("enable_weights_track", False)
        out["model_loader_extra_config"] = extra
        return out

    @property
    def tokens_per_step_max(self) -> int:
        assert self.medusa is not None
        return self.medusa.vllm_num_speculative_tokens + 1


class NxdiMedusaBackend(PlannerBackend):
    """NxDI on Trainium/Inferentia (UNTESTED on hardware: needs the Neuron SDK and a device).

    The planner compiled with the Medusa heads and the sparse tree at batch size 1 (what NxDI
    supports for Medusa), served by rufus/qp/decoder/nxdi_engine.py behind the same engine
    interface as the torch decoder.
    """

    ARGS = ("model", "dtype", "max_model_len", "tensor_parallel_size", "nxdi_compiled_path",
            "nxdi_max_new_tokens")

    def engine_args(self, args: dict[str, Any]) -> dict[str, Any]:
        from rufus.qp.decoder.nxdi_engine import DTYPES

        _check_dtype(args, self.name, DTYPES)
        return {k: args[k] for k in self.ARGS if k in args}

    @property
    def tokens_per_step_max(self) -> int:
        assert self.medusa is not None
        return 1 + max(len(p) for p in self.medusa.medusa_tree)

    def engine_factory(self, on_stats: Any = None) -> Any:
        from rufus.qp.decoder.nxdi_engine import NxdiPlannerEngine

        medusa, knobs = self.medusa, self.knobs
        assert medusa is not None

        def build(args: dict[str, Any]) -> Any:
            return NxdiPlannerEngine(args, tree_paths=medusa.medusa_tree,
                                     medusa_dir=medusa.medusa_model,
                                     num_heads=medusa.num_medusa_heads, on_stats=on_stats,
                                     knobs=knobs)

        return build


def create_backend(args: dict[str, Any], knobs: DecoderKnobs | None = None) -> PlannerBackend:
    """Pick and configure the backend named by ``qp_backend`` in model.json (``knobs``: its
    planner keys, when already read)."""
    knobs = DecoderKnobs.from_model_json(args) if knobs is None else knobs
    name = knobs.qp_backend
    structured, ground = knobs.structured_output, knobs.ground_filters
    if name == "autoregressive":
        return AutoregressiveBackend(name, None, structured, ground, knobs)
    if name == "torch_autoregressive":
        return TorchBackend(name, None, structured, ground, knobs)
    tree = load_tree(knobs.medusa_tree)
    heads = knobs.num_medusa_heads
    medusa = MedusaSettings(
        num_medusa_heads=heads,
        medusa_speculation_length=(len(tree) + 1 if knobs.medusa_speculation_length is None
                                   else knobs.medusa_speculation_length),
        medusa_tree=tree,
        medusa_model=knobs.medusa_model,
        vllm_num_speculative_tokens=(heads if knobs.vllm_num_speculative_tokens is None
                                     else knobs.vllm_num_speculative_tokens),
    )
    medusa.check()
    if name != "nxdi" and not (Path(medusa.medusa_model) / "config.json").exists():
        fallback = "torch_autoregressive" if name == "torch_medusa" else "autoregressive"
        log.warning("Medusa heads %s missing (run scripts/setup.sh qp): serving the planner "
                    "without them (%s)", medusa.medusa_model, fallback)
        return create_backend({**args, "qp_backend": fallback},
                              replace(knobs, qp_backend=fallback))
    cls = {"vllm_medusa": VllmMedusaBackend, "torch_medusa": TorchBackend,
           "nxdi": NxdiMedusaBackend}[name]
    return cls(name, medusa, structured, ground, knobs)
