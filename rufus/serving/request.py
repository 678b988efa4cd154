"""The one validated generation request the hot path serves (:mod:`rufus.serving.generation`).

Independent of Triton types: rufus_llm's parser (:mod:`rufus.serving.llm`) and the planner's
(:mod:`rufus.qp.model`) build it; the response builder (:mod:`rufus.serving.responses`)
reads its ``return_*`` flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerateRequest:
    """One validated generation request, independent of Triton types."""

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    stream: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    exclude_input_in_output: bool = False
    return_finish_reason: bool = False
    return_cumulative_logprob: bool = False
    return_logprobs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    # Not a Triton input of rufus_llm: set by models built on run_generate (rufus_qp_medusa).
    return_token_ids: bool = False
    # The client's field to blame when the rendered prompt is unusable (too long, empty).
    prompt_field: str = "text_input"
    # Did the client ask for per-token logprobs (sampling_parameters.logprobs)? Without it the
    # ``logprobs`` output is JSON null, as in the official backend.
    logprobs_requested: bool = False
    lora_name: str | None = None
    # the trace this request joins (an OpenTelemetry context; rufus/telemetry/tracing.py),
    # None: tracing is off or the request's trace starts at this model
    trace: Any = None
    # the planner's spans also say whether its grammar constrained the output
    trace_attributes: dict[str, Any] | None = None



def finish_logprobs(req: GenerateRequest) -> None:
    """``logprobs`` output is null unless the client set ``sampling_parameters.logprobs``;
    a requested cumulative logprob still needs vLLM to compute the sampled token's."""
    req.logprobs_requested = "logprobs" in req.sampling
    if req.return_cumulative_logprob and not req.logprobs_requested:
        req.sampling["logprobs"] = 0
