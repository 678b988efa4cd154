"""The query planner's settings: its config.pbtxt parameters (every engine model's), and the
planner's own model.json keys (:class:`DecoderKnobs`) apart from vLLM's engine arguments.

The planner's model.json mixes both, as the official backend's convention has one flat file:
:meth:`PlannerSettings.load` splits it once at load. The knobs mirror NxDI's Medusa settings
(``num_medusa_heads``, ``medusa_speculation_length``, ``medusa_tree``) plus the torch
decoder's drafts and batching (rufus/qp/backends.py says what each backend uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rufus.serving.admission import AdmissionSettings, with_limits
from rufus.serving.model_settings import EngineModelSettings
from rufus.serving.settings import MODEL_JSON, env_var, group, keys, model_json, read, rows

BACKENDS = ("torch_medusa", "torch_autoregressive", "vllm_medusa", "autoregressive", "nxdi")
# draft trie size cap per step (``max_draft_nodes``, ``batch_draft_nodes``)
MAX_DRAFT_NODES = 24


def _threads(value: Any) -> int | str:
    """``torch_threads``: ``"auto"`` or a count (0: every core); resolved by
    rufus/qp/decoder/cores.py ``parse_threads`` when the engine starts."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(value)
    n = int(value)
    if n < 0:
        raise ValueError(value)
    return n


def _tree(value: Any) -> tuple[tuple[int, ...], ...] | str:
    """``medusa_tree``: a list of paths (top-k ranks per head) or a file name / path."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list | tuple):
        raise ValueError(value)
    paths = []
    for p in value:
        if not isinstance(p, list | tuple) or any(
                isinstance(k, bool) or not isinstance(k, int) for k in p):
            raise ValueError(value)
        paths.append(tuple(p))
    return tuple(paths)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(value)
    return tuple(value)


@dataclass(frozen=True)
class DecoderKnobs:
    """The planner's model.json keys; the file's other keys are vLLM's engine arguments."""

    qp_backend: str = model_json("qp_backend", "torch_medusa",
                                 "the planner's execution path (rufus/qp/backends.py)",
                                 choices=BACKENDS)
    structured_output: bool = model_json("structured_output", True,
                                         "constrain decoding to the plan schema's grammar")
    ground_filters: bool = model_json("ground_filters", True, "drop plan filters the "
                                      "customer did not write (rufus/qp/filter_grounding.py)")
    medusa_model: str = model_json("medusa_model", "", "directory of the Medusa heads "
                                   "(missing: the planner is served without them)")
    num_medusa_heads: int = model_json("num_medusa_heads", 4, "Medusa heads used", minimum=1)
    medusa_tree: tuple[tuple[int, ...], ...] | str = model_json(
        "medusa_tree", (), "candidate paths (top-k rank per head), or a JSON file of them "
        "(relative: in the version directory), or \"measured\": the tree grown on this "
        "machine at setup (else medusa_tree.json)", parse=_tree,
        kind="list of paths or string")
    medusa_speculation_length: int | None = model_json(
        "medusa_speculation_length", None, "tokens verified per step: the tree's nodes + 1",
        minimum=1, default_text="tree nodes + 1")
    vllm_num_speculative_tokens: int | None = model_json(
        "vllm_num_speculative_tokens", None, "vllm_medusa: heads drafted as a top-1 chain "
        "(1..num_medusa_heads)", minimum=1, default_text="num_medusa_heads")
    torch_threads: int | str = model_json(
        "torch_threads", 0, "torch decoder threads: a count, 0 for every core this process "
        "may use, or \"auto\": one per core other processes leave idle", parse=_threads,
        kind='int or "auto"')
    int8_activations: bool = model_json(
        "int8_activations", False, "with int8 weights, the decoder layers multiply int8 "
        "activations (W8A8, vpdpbusd) where the CPU has AVX-512 VNNI: twice the arithmetic "
        "of int16 for passes of many rows (batched plans); elsewhere int16 activations")
    torch_max_batch: int = model_json("torch_max_batch", 1, "plans decoded together in one "
                                      "pass when they queue", minimum=1, maximum=64)
    copy_fields: tuple[str, ...] = model_json(
        "copy_fields", (), "plan fields whose text must be copied from the customer's words",
        parse=_strings, kind="list of strings")
    grammar_drafts: int = model_json("grammar_drafts", 0, "grammar-forced tokens drafted "
                                     "per step (0: off)", minimum=0)
    lookup_drafts: int = model_json("lookup_drafts", 0, "prompt-lookup tokens drafted per "
                                    "step where there is no plan skeleton (0: off)", minimum=0)
    history_drafts: int = model_json("history_drafts", 0, "plan-skeleton tokens drafted "
                                     "beyond the forced text, from earlier plans (0: off)",
                                     minimum=0)
    max_draft_nodes: int = model_json("max_draft_nodes", MAX_DRAFT_NODES, "draft trie "
                                      "nodes per step (0: the default)", minimum=1,
                                      unset=(None, 0))
    batch_draft_nodes: int = model_json("batch_draft_nodes", MAX_DRAFT_NODES, "draft trie "
                                        "nodes per plan when plans share a pass (0: the "
                                        "default)", minimum=1, unset=(None, 0))
    nxdi_compiled_path: str = model_json("nxdi_compiled_path", "", "nxdi: the compiled "
                                         "model (default: the model's directory + -neuron)")
    nxdi_max_new_tokens: int = model_json("nxdi_max_new_tokens", 96, "nxdi: tokens "
                                          "generated at most", minimum=1)

    @classmethod
    def from_model_json(cls, values: Mapping[str, Any], model: str = "") -> DecoderKnobs:
        """The knobs in ``values`` (model.json after overrides); other keys are ignored."""
        return read(cls, values=values, env={}, model=model)


# model.json keys that are the planner's, not vLLM's
QP_KEYS = keys(DecoderKnobs, MODEL_JSON)


def engine_arguments(model_json: Mapping[str, Any]) -> dict[str, Any]:
    """model.json without the planner's keys: vLLM's engine arguments."""
    return {k: v for k, v in model_json.items() if k not in QP_KEYS}


# The planner's admission: a plan estimated past its SLO (300 ms, RUFUS_QP_SLO_S; margin
# RUFUS_QP_MARGIN) is refused at once, UNAVAILABLE. The
# estimate is of the whole plan: plans in flight ahead of it share the decoder's passes
# (up to ``torch_max_batch`` per pass, the rest queue: TorchBackend.admission_features).
# A request may state the latency it accepts (request parameter ``slo_ms``): the assistant
# sends its plan time limit, since its own admission already holds the turn's SLO.
# priors: the least-squares fit of plan latency to plans in flight measured at 4-12 plans/s
# on AVX-512 + bf16 + AMX (docs/benchmarks-history.md); the online fit moves from there.
# per_waiting_s is per plan in flight ahead that shares its tree passes (torch backends: up
# to torch_max_batch - 1 of them; other backends: every plan ahead); per_decoding_s (torch
# backends) per plan ahead beyond a full batch of passes, which waits for a slot.
ADMISSION = AdmissionSettings(slo_s=0.3, base_s=0.11, per_waiting_s=0.035, per_decoding_s=0.05)


@dataclass(frozen=True)
class AdmissionLimits:
    """The planner's admission as an operator sets it."""

    slo_s: float = env_var("RUFUS_QP_SLO_S", ADMISSION.slo_s,
                           "plan SLO, seconds; plans estimated past margin x SLO are refused "
                           "UNAVAILABLE (a request's `slo_ms` parameter replaces it for that "
                           "request; 0 turns admission off)", minimum=0)
    margin: float = env_var("RUFUS_QP_MARGIN", ADMISSION.margin,
                            "refuse above this share of the SLO", minimum=0)


def read_admission(env: Mapping[str, str] | None = None) -> AdmissionSettings:
    limits = read(AdmissionLimits, env=env)
    return with_limits(ADMISSION, limits.slo_s, limits.margin)


@dataclass(frozen=True)
class PlannerModelSettings(EngineModelSettings):
    """rufus_qp_medusa's config.pbtxt parameters (rufus_llm's keys) and its admission."""

    admission: AdmissionSettings = group(  # noqa: RUF009 - a default_factory field
        AdmissionSettings, read=read_admission, describe=lambda: rows(AdmissionLimits),
        default=lambda: ADMISSION)


@dataclass(frozen=True)
class PlannerSettings:
    """rufus_qp_medusa: config.pbtxt parameters, the decoder knobs and vLLM's engine
    arguments, each typed apart."""

    parameters: PlannerModelSettings = field(default_factory=PlannerModelSettings)
    knobs: DecoderKnobs = field(default_factory=DecoderKnobs)
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, parameters: PlannerModelSettings, model_json: Mapping[str, Any],
             model: str = "") -> PlannerSettings:
        """Split model.json (overrides applied, ``"measured"`` resolved) once."""
        return cls(parameters, DecoderKnobs.from_model_json(model_json, model),
                   engine_arguments(model_json))
