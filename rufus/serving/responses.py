"""vLLM outputs -> Triton output tensors (as plain numpy dicts), official backend names.

Streaming responses carry deltas (text and token counts of this response only); the
non-streaming response carries the whole completion (one element per ``n``). Conventions
follow the official Triton vLLM backend: ``finish_reason`` is ``str()`` of vLLM's value
(``"None"`` on a streamed response before the last), ``logprobs`` is JSON ``null`` unless
the client set ``sampling_parameters.logprobs``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rufus.serving.request import GenerateRequest

Outputs = dict[str, np.ndarray]


def _bytes(values: list[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def _logprobs_json(logprobs: Any) -> str:
    """Same shape as the official backend: per token ``{token_id: {logprob, rank, decoded_token}}``."""
    if logprobs is None:
        return "null"
    out = []
    for position in logprobs:
        out.append(
            {
                str(tid): {
                    "logprob": lp.logprob,
                    "rank": lp.rank,
                    "decoded_token": lp.decoded_token,
                }
                for tid, lp in position.items()
            }
        )
    return json.dumps(out)


def build_outputs(
    req: GenerateRequest,
    completions: list[Any],
    *,
    num_input_tokens: int,
    prefix: str = "",
) -> Outputs:
    """One Triton response from vLLM ``CompletionOutput`` objects (deltas or whole)."""
    outputs: Outputs = {"text_output": _bytes([prefix + c.text for c in completions])}
    if req.return_finish_reason:
        outputs["finish_reason"] = _bytes([str(c.finish_reason) for c in completions])
    if req.return_cumulative_logprob:
        outputs["cumulative_logprob"] = np.array(
            [c.cumulative_logprob if c.cumulative_logprob is not None else 0.0 for c in completions],
            dtype=np.float32,
        )
    if req.return_logprobs:
        outputs["logprobs"] = _bytes([_logprobs_json(c.logprobs if req.logprobs_requested else None)
                                      for c in completions])
    if req.return_num_input_tokens:
        outputs["num_input_tokens"] = np.array([num_input_tokens], dtype=np.uint32)
    if req.return_num_output_tokens:
        outputs["num_output_tokens"] = np.array(
            [len(c.token_ids) for c in completions], dtype=np.uint32
        )
    if req.return_token_ids and len(completions) == 1:
        outputs["output_token_ids"] = np.array(list(completions[0].token_ids), dtype=np.int32)
    return outputs
