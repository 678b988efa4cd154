"""rufus_llm: streaming text generation, the official Triton vLLM backend's interface plus
``messages`` (chat rendered with the model's template)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rufus.serving.generation import run_generate
from rufus.serving.requests import KNOWN_INPUTS, GenerateRequest, parse_generate_request
from rufus.serving.triton_backend import EngineModel, TritonSink, add_io


def _opt(name: str, dtype: str) -> dict[str, Any]:
    return {"name": name, "data_type": dtype, "dims": [1], "optional": True}


LLM_INPUTS = [
    _opt("text_input", "TYPE_STRING"),
    _opt("messages", "TYPE_STRING"),
    _opt("stream", "TYPE_BOOL"),
    _opt("sampling_parameters", "TYPE_STRING"),
    _opt("exclude_input_in_output", "TYPE_BOOL"),
    _opt("return_finish_reason", "TYPE_BOOL"),
    _opt("return_cumulative_logprob", "TYPE_BOOL"),
    _opt("return_logprobs", "TYPE_BOOL"),
    _opt("return_num_input_tokens", "TYPE_BOOL"),
    _opt("return_num_output_tokens", "TYPE_BOOL"),
]
LLM_OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
]


class LLMModel(EngineModel):
    INPUTS = set(KNOWN_INPUTS)

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        return add_io(auto_complete_model_config, LLM_INPUTS, LLM_OUTPUTS)

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> GenerateRequest:
        return parse_generate_request(inputs, parameters, self.default_max_tokens)

    async def handle(self, parsed: GenerateRequest, sink: TritonSink, arrival: float,
                     request_id: str) -> None:
        await run_generate(self.host, self.watcher, parsed, sink, self.metrics, arrival, request_id)
