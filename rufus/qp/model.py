"""rufus_qp_medusa: the query planner as a Triton model (decoupled Python backend).

Input: ``question`` (+ optional ``history``: previous chat turns as JSON). Output: the raw
generated text, the parsed plan as JSON (``plan``), and ``fallback`` / ``fallback_reason``
when the text did not validate against rufus/qp/plan_schema.json (the plan then passes the
question through as the search query). Decoding is greedy, constrained to the plan schema
(an xgrammar JSON-schema grammar, passed as vLLM structured outputs) and, by default,
accelerated by Medusa heads verified as a tree by the torch decoder (rufus/qp/backends.py).

Generation, admission, cancellation, metrics and error mapping are rufus_llm's own
(:func:`rufus.serving.generation.run_generate`); this module only builds the request and turns the
final text into a plan on its way out. On top, the planner admits against its SLO
(rufus/serving/admission.py, settings in rufus/qp/settings.py): a plan estimated past 300 ms
is refused at once, UNAVAILABLE, unless the request's ``slo_ms`` parameter accepts more.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rufus.errors import InvalidInput, RufusError
from rufus.qp.backends import PlannerBackend, create_backend, tree_args
from rufus.qp.filter_grounding import ground_plan
from rufus.qp.plan import HISTORY_TURNS_USED, build_messages, parse_plan, structured_outputs
from rufus.qp.settings import PlannerModelSettings, PlannerSettings
from rufus.serving.admission import SloAdmission, Ticket
from rufus.serving.engine import EngineSpec
from rufus.serving.generation import run_generate
from rufus.serving.metrics import AdmissionMetrics, MetricBuffer
from rufus.serving.request import GenerateRequest, finish_logprobs
from rufus.serving.sampling import merge_sampling, request_parameters
from rufus.serving.triton_backend import EngineModel, pb_utils
from rufus.serving.validation import (
    DEFAULT_LIMITS,
    MAX_HISTORY_TURNS,
    InputSpec,
    Limits,
    OutputSpec,
    decode_inputs,
    read_conversation,
)

log = logging.getLogger("rufus.qp")

# The prompt keeps the last HISTORY_TURNS_USED of the accepted turns (rufus/qp/plan.py).
assert HISTORY_TURNS_USED <= MAX_HISTORY_TURNS
# Greedy only: the planner's output must be reproducible (and Medusa's lossless guarantee is
# for greedy decoding). logprobs are for diagnostics (the losslessness test's near-tie check).
QP_SAMPLING_KEYS = ("max_tokens", "logprobs")
# request parameter: the plan latency this request accepts, replacing the planner's SLO for
# its admission (the assistant sends its plan time limit: its own admission holds the turn)
SLO_PARAMETER = "slo_ms"
MAX_SLO_MS = 600_000

# The planner's inputs and outputs, declared once (config auto-complete, decoding, the
# known-inputs set; tests/unit/test_inputs.py checks them against config.pbtxt).
QP_INPUT_SPECS: tuple[InputSpec, ...] = (
    InputSpec("question", "TYPE_STRING"),
    InputSpec("history", "TYPE_STRING"),
    InputSpec("sampling_parameters", "TYPE_STRING", bound="max_parameters_bytes"),
)
QP_OUTPUT_SPECS: tuple[OutputSpec, ...] = (
    OutputSpec("text_output", "TYPE_STRING"),
    OutputSpec("plan", "TYPE_STRING"),
    OutputSpec("fallback", "TYPE_BOOL"),
    OutputSpec("fallback_reason", "TYPE_STRING"),
    OutputSpec("finish_reason", "TYPE_STRING"),
    OutputSpec("num_output_tokens", "TYPE_UINT32"),
    OutputSpec("output_token_ids", "TYPE_INT32"),
    OutputSpec("logprobs", "TYPE_STRING"),
)


@dataclass
class PlanRequest:
    question: str
    generate: GenerateRequest
    history: list[dict[str, str]] | None = None
    slo_s: float | None = None  # the request's ``slo_ms``, in seconds
    ticket: Ticket | None = None  # admitted on Triton's execute thread


def read_slo(params: dict[str, Any]) -> float | None:
    """Pop the ``slo_ms`` request parameter: seconds, or None when the request sets none."""
    if SLO_PARAMETER not in params:
        return None
    value = params.pop(SLO_PARAMETER)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 1 <= value <= MAX_SLO_MS:
        raise InvalidInput(f"parameters.{SLO_PARAMETER}",
                           f"must be a number of milliseconds in 1..{MAX_SLO_MS}, got "
                           f"{str(value)[:40]!r}")
    return float(value) / 1e3


def parse_plan_request(inputs: dict[str, np.ndarray | None], parameters: str | None,
                       default_max_tokens: int, limits: Limits = DEFAULT_LIMITS) -> PlanRequest:
    """Validate one planner request; every error names the offending input field."""
    values = decode_inputs(QP_INPUT_SPECS, inputs, limits)
    question, turns = read_conversation(values, limits)
    history = turns or None
    params = request_parameters(parameters, limits)
    slo_s = read_slo(params)
    try:
        sampling = merge_sampling(values.get("sampling_parameters"), params, limits=limits,
                                  default_max_tokens=default_max_tokens, allowed=QP_SAMPLING_KEYS)
    except InvalidInput as exc:
        if exc.field == "sampling_parameters" and exc.reason.startswith("unknown key"):
            raise InvalidInput("sampling_parameters",
                               f"{exc.reason} for the query planner (greedy decoding)") from exc
        raise
    sampling["temperature"] = 0.0
    req = GenerateRequest(
        messages=build_messages(question, history),
        sampling=sampling,
        exclude_input_in_output=True,
        return_finish_reason=True,
        return_num_output_tokens=True,
        return_logprobs="logprobs" in sampling,
        return_token_ids=True,
        # the prompt is built from question + history: blame what the client sent
        prompt_field="history" if history else "question",
    )
    finish_logprobs(req)
    return PlanRequest(question, req, history, slo_s)


class PlanSink:
    """Wraps the Triton sink: the final text becomes text + plan + fallback flag.

    With ``ground`` the plan's filters pass the post-decode check (rufus/qp/filter_grounding.py):
    a brand or price cap not written in the question or history is dropped from ``plan``;
    ``text_output`` stays the raw generation."""

    def __init__(self, inner: Any, question: str, history: list[dict[str, str]] | None = None,
                 ground: bool = False, ticket: Ticket | None = None) -> None:
        self.inner = inner
        self.question = question
        self.history = history
        self.ground = ground
        self.ticket = ticket

    def send(self, outputs: dict[str, np.ndarray] | None, error: RufusError | None,
             final: bool) -> None:
        if outputs is not None and "text_output" in outputs:
            text = bytes(outputs["text_output"][0]).decode("utf-8", "replace")
            res = parse_plan(text, self.question)
            if self.ground and not res.fallback:
                grounded, dropped = ground_plan(res.plan, self.question, self.history)
                res = dataclasses.replace(res, plan=grounded)
                if dropped:
                    log.debug("plan filters dropped: %s", "; ".join(dropped))
            outputs["plan"] = np.array([json.dumps(res.plan).encode()], dtype=np.object_)
            outputs["fallback"] = np.array([res.fallback], dtype=bool)
            outputs["fallback_reason"] = np.array([res.error.encode()], dtype=np.object_)
        if final and error is None and self.ticket is not None:
            self.ticket.first_token()  # the plan is done: what the admission learns from
        self.inner.send(outputs, error, final)

    def is_cancelled(self) -> bool:
        return bool(self.inner.is_cancelled())


def spec_stat_logger(counters: dict[str, Any]) -> Any:
    """vLLM stat logger publishing Medusa acceptance (drafts, draft/accepted tokens).

    Mean tokens per verification step = 1 + accepted / drafts (the bench reads these)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SpecLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any = None,
                   *args: Any, **kwargs: Any) -> None:
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is None:
                return
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                n = int(getattr(spec, key, 0))
                if n:
                    counters[key].increment(n)

        def log_engine_initialized(self) -> None:
            pass

    return _SpecLogger


def _step_counter(counters: dict[str, Any]) -> Any:
    """The torch engine's per-request callback, feeding the same Medusa counters as vLLM's."""

    def on_stats(steps: int, drafted: int, accepted: int) -> None:
        counters["num_drafts"].increment(steps)
        counters["num_draft_tokens"].increment(drafted)
        if accepted:
            counters["num_accepted_tokens"].increment(accepted)

    return on_stats


class QueryPlannerModel(EngineModel):
    INPUT_SPECS = QP_INPUT_SPECS
    OUTPUT_SPECS = QP_OUTPUT_SPECS
    SETTINGS = PlannerModelSettings
    settings: PlannerModelSettings
    _admission_metrics: MetricBuffer | None = None  # set by setup when metrics are on
    backend: PlannerBackend
    precision_workload = "planner"  # tree verification passes decide "dtype": "measured"

    def engine_spec(self, spec: EngineSpec) -> EngineSpec:
        """Split model.json once into vLLM's engine args and the planner's typed knobs; the
        backend's engine (its factory, Medusa's stat logger) is the planner's engine."""
        args = tree_args(dict(spec.engine_args), self.model_dir)
        self.planner_settings = PlannerSettings.load(self.settings, args, self.name)
        self.backend = create_backend(args, self.planner_settings.knobs)
        engine_args = self.backend.engine_args(args)
        self._spec_families: list[Any] = []
        counters = self._spec_counters() if pb_utils is not None and self.backend.medusa else None
        loggers = spec.stat_loggers
        if self.backend.name == "vllm_medusa" and counters is not None:
            loggers = (*loggers, spec_stat_logger(counters))
        factory = self.backend.engine_factory(
            None if counters is None else _step_counter(counters))
        self.admission = self._make_admission()
        return replace(spec, engine_args=engine_args, factory=factory, stat_loggers=loggers)

    def _make_admission(self) -> SloAdmission:
        """The planner's SLO admission, its estimate and error exported when metrics are on
        (through a buffer: each update is IPC, and admission runs on Triton's thread)."""
        s = self.settings.admission
        adm = SloAdmission(s, what="plan", queue="{waiting} plans in flight",
                           features=self.backend.admission_features())
        if pb_utils is not None and self.settings.report_custom_metrics:
            buf = MetricBuffer(AdmissionMetrics(
                pb_utils, "rufus_qp_plan", "plan latency",
                {"model": self.name, "version": self.version}, s.slo_s), name="qp-admission")
            adm.on_estimate = lambda v: buf.gauge("estimate", v)
            adm.on_error = lambda v: buf.event("estimate_error", v)
            self._admission_metrics = buf
        log.info("%s: plans admitted against a %g s SLO (margin %g; 0: off)", self.name,
                 s.slo_s, s.margin)
        return adm

    def finalize(self) -> None:
        super().finalize()
        if self._admission_metrics is not None:
            self._admission_metrics.close()

    def _spec_counters(self) -> dict[str, Any]:
        labels = {"model": self.name, "version": self.version}
        out = {}
        for key, desc in (("num_drafts", "Medusa verification steps with drafts"),
                          ("num_draft_tokens", "Medusa draft tokens proposed"),
                          ("num_accepted_tokens", "Medusa draft tokens accepted")):
            fam = pb_utils.MetricFamily(name=f"rufus_qp_spec_{key}_total", description=desc,
                                        kind=pb_utils.MetricFamily.COUNTER)
            self._spec_families.append(fam)
            out[key] = fam.Metric(labels=labels)
        return out

    async def warm_up(self) -> None:
        """The plan grammar compiled (torch engine), then plans through the real path:
        one with history (grammar, tree, copy constraint), then two at once (packed passes)."""
        warm = getattr(self.host.engine, "warm_grammar", None)
        if warm is not None and self.backend.structured_output:
            warm(structured_outputs().json)
        await super().warm_up()

    def warmup_requests(self) -> list[list[PlanRequest]]:
        def plan(question: str, history: list[dict[str, str]] | None = None) -> PlanRequest:
            tensors = {"question": np.array([question.encode()], dtype=np.object_)}
            if history:
                tensors["history"] = np.array([json.dumps(history).encode()], dtype=np.object_)
            return self.parse(tensors, None)

        turns = [{"role": "user", "content": "I need running shoes"},
                 {"role": "assistant", "content": "Here are some running shoes."}]
        return [[plan("nike running shoes under $80")],
                [plan("any in blue?", turns), plan("compare sony and bose headphones")]]

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> PlanRequest:
        return parse_plan_request(inputs, parameters, self.default_max_tokens,
                                  self.request_limits())

    def with_trace(self, parsed: PlanRequest, parent: Any) -> PlanRequest:
        parsed.generate.trace = parent
        parsed.generate.trace_attributes = {
            "rufus.planner.grammar": bool(self.backend.structured_output),
            "rufus.planner.backend": type(self.backend).__name__,
            "rufus.planner.history_turns": len(parsed.history or []),
        }
        return parsed

    def submit(self, parsed: PlanRequest, sink: Any, arrival: float) -> None:
        # Admission here, on Triton's execute thread: a refusal is the request's one response
        # (TritonModel.execute sends it and counts it), sent before the engine sees it.
        ticket = self.admission.admit(parsed.slo_s)
        try:
            parsed.ticket = ticket
            super().submit(parsed, sink, arrival)
        except BaseException:
            ticket.done()
            raise

    async def handle(self, parsed: PlanRequest, sink: Any, arrival: float,
                     request_id: str, internal: bool = False) -> None:
        if self.backend.structured_output:
            parsed.generate.sampling["structured_outputs"] = structured_outputs()
        try:
            await run_generate(self.host, self.watcher, parsed.generate,
                               PlanSink(sink, parsed.question, parsed.history,
                                        self.backend.ground_filters, parsed.ticket),
                               self.metrics, arrival, request_id, internal)
        finally:
            if parsed.ticket is not None:
                parsed.ticket.done()
