"""rufus_qp_medusa: the query planner as a Triton model (decoupled Python backend).

Input: ``question`` (+ optional ``history``: previous chat turns as JSON). Output: the raw
generated text, the parsed plan as JSON (``plan``), and ``fallback`` / ``fallback_reason``
when the text did not validate against rufus/qp/plan_schema.json (the plan then passes the
question through as the search query). Decoding is greedy, constrained to the plan schema
(an xgrammar JSON-schema grammar, passed as vLLM structured outputs) and, by default,
accelerated by Medusa heads verified as a tree by the torch decoder (rufus/qp/backends.py).

Generation, admission, cancellation, metrics and error mapping are rufus_llm's own
(:func:`rufus.serving.generation.run_generate`); this module only builds the request and turns the
final text into a plan on its way out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from rufus.qp.backends import PlannerBackend, create_backend
from rufus.qp.plan import build_messages, parse_plan, structured_outputs
from rufus.serving.generation import ServiceError, run_generate
from rufus.serving.requests import (
    GenerateRequest,
    InvalidInput,
    _text,
    parse_messages,
    parse_sampling_json,
    validate_sampling,
)
from rufus.serving.triton_backend import EngineModel, TritonSink, add_io, pb_utils

MAX_QUESTION_CHARS = 1000
MAX_HISTORY_TURNS = 8
# Greedy only: the planner's output must be reproducible (and Medusa's lossless guarantee is
# for greedy decoding). logprobs are for diagnostics (the losslessness test's near-tie check).
QP_SAMPLING_KEYS = ("max_tokens", "logprobs")


def _opt(name: str, dtype: str) -> dict[str, Any]:
    return {"name": name, "data_type": dtype, "dims": [1], "optional": True}


QP_INPUTS = [
    _opt("question", "TYPE_STRING"),
    _opt("history", "TYPE_STRING"),
    _opt("sampling_parameters", "TYPE_STRING"),
]
QP_OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "plan", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "fallback", "data_type": "TYPE_BOOL", "dims": [-1]},
    {"name": "fallback_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
    {"name": "output_token_ids", "data_type": "TYPE_INT32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
]


@dataclass
class PlanRequest:
    question: str
    generate: GenerateRequest


def parse_plan_request(inputs: dict[str, np.ndarray | None], parameters: str | None,
                       default_max_tokens: int) -> PlanRequest:
    """Validate one planner request; every error names the offending input field."""
    if inputs.get("question") is None:
        raise InvalidInput("question", "missing: send the customer's question")
    question = _text("question", inputs["question"])  # type: ignore[arg-type]
    if not question.strip():
        raise InvalidInput("question", "is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InvalidInput("question", f"is {len(question)} characters; at most "
                           f"{MAX_QUESTION_CHARS}")
    history = None
    if inputs.get("history") is not None:
        raw = _text("history", inputs["history"])  # type: ignore[arg-type]
        try:
            turns = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput("history", f"is not valid JSON ({exc.msg})") from exc
        if not isinstance(turns, list):
            raise InvalidInput("history", "must be a JSON list of {role, content}")
        try:
            # rufus_llm's message checks; previous turns may end with the assistant's reply
            history = parse_messages(json.dumps(
                [*turns, {"role": "user", "content": question}]))[:-1]
        except InvalidInput as exc:
            raise InvalidInput(exc.field.replace("messages", "history", 1), exc.reason) from exc
        if len(history) > MAX_HISTORY_TURNS:
            raise InvalidInput("history", f"{len(history)} turns; at most {MAX_HISTORY_TURNS}")
    raw_sampling: dict[str, Any] = {}
    if parameters:
        raw_sampling.update(parse_sampling_json(parameters))
    if inputs.get("sampling_parameters") is not None:
        raw_sampling.update(parse_sampling_json(
            _text("sampling_parameters", inputs["sampling_parameters"])))  # type: ignore[arg-type]
    extra = sorted(set(raw_sampling) - set(QP_SAMPLING_KEYS))
    if extra:
        raise InvalidInput("sampling_parameters",
                           f"unsupported key(s) {extra} for the query planner (greedy decoding); "
                           f"supported: {list(QP_SAMPLING_KEYS)}")
    sampling = validate_sampling(raw_sampling, from_parameters=bool(parameters))
    sampling.setdefault("max_tokens", default_max_tokens)
    sampling["temperature"] = 0.0
    req = GenerateRequest(
        messages=build_messages(question, history),
        sampling=sampling,
        exclude_input_in_output=True,
        return_finish_reason=True,
        return_num_output_tokens=True,
        return_logprobs="logprobs" in sampling,
        return_token_ids=True,
    )
    return PlanRequest(question, req)


class PlanSink:
    """Wraps the Triton sink: the final text becomes text + plan + fallback flag."""

    def __init__(self, inner: Any, question: str) -> None:
        self.inner = inner
        self.question = question

    def send(self, outputs: dict[str, np.ndarray] | None, error: ServiceError | None,
             final: bool) -> None:
        if error is not None and error.message.startswith("messages"):
            # the prompt is built from question + history: blame what the client sent
            error = ServiceError(error.code, "question" + error.message[len("messages"):])
        if outputs is not None and "text_output" in outputs:
            text = bytes(outputs["text_output"][0]).decode("utf-8", "replace")
            res = parse_plan(text, self.question)
            outputs["plan"] = np.array([json.dumps(res.plan).encode()], dtype=np.object_)
            outputs["fallback"] = np.array([res.fallback], dtype=bool)
            outputs["fallback_reason"] = np.array([res.error.encode()], dtype=np.object_)
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
    INPUTS = {i["name"] for i in QP_INPUTS}
    backend: PlannerBackend

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        return add_io(auto_complete_model_config, QP_INPUTS, QP_OUTPUTS)

    def setup(self) -> None:
        """Split model.json into engine args and the planner's Medusa settings."""
        args = dict(self.host.engine_args)
        tree = args.get("medusa_tree")
        if isinstance(tree, str) and not tree.startswith("/"):
            args["medusa_tree"] = str(self.model_dir / tree)
        self.backend = create_backend(args)
        self.host.engine_args = self.backend.engine_args(args)
        if self.backend.name == "nxdi":
            raise RuntimeError("qp_backend=nxdi runs on Neuron hosts through NxDI "
                               "(rufus/qp/backends.py), not inside this vLLM model")
        self._spec_families: list[Any] = []
        counters = self._spec_counters() if pb_utils is not None and self.backend.medusa else None
        if self.backend.name == "vllm_medusa" and counters is not None:
            self.host.stat_loggers.append(spec_stat_logger(counters))
        self.host.engine_factory = self.backend.engine_factory(
            None if counters is None else _step_counter(counters))
        super().setup()

    def _spec_counters(self) -> dict[str, Any]:
        labels = {"model": self.name, "version": str(self.args["model_version"])}
        out = {}
        for key, desc in (("num_drafts", "Medusa verification steps with drafts"),
                          ("num_draft_tokens", "Medusa draft tokens proposed"),
                          ("num_accepted_tokens", "Medusa draft tokens accepted")):
            fam = pb_utils.MetricFamily(name=f"rufus_qp_spec_{key}_total", description=desc,
                                        kind=pb_utils.MetricFamily.COUNTER)
            self._spec_families.append(fam)
            out[key] = fam.Metric(labels=labels)
        return out

    def ready(self) -> None:
        """The torch engine compiles the plan grammar before the model reports ready."""
        warm = getattr(self.host.engine, "warm_grammar", None)
        if warm is not None and self.backend.structured_output:
            warm(structured_outputs().json)

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> PlanRequest:
        return parse_plan_request(inputs, parameters, self.default_max_tokens)

    async def handle(self, parsed: PlanRequest, sink: TritonSink, arrival: float,
                     request_id: str) -> None:
        if self.backend.structured_output:
            parsed.generate.sampling["structured_outputs"] = structured_outputs()
        await run_generate(self.host, self.watcher, parsed.generate,
                           PlanSink(sink, parsed.question), self.metrics, arrival, request_id)
