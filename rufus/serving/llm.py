"""rufus_llm: streaming text generation, the official Triton vLLM backend's interface plus
``messages`` (chat rendered with the model's template). Its IO table and request parser
live here, with the model; the rules they apply are :mod:`rufus.serving.validation` and
:mod:`rufus.serving.sampling`.

LoRA follows the official convention: ``multi_lora.json`` next to ``model.json`` maps
adapter names to local paths (relative paths are read from the model's version directory),
and a request picks one with ``sampling_parameters.lora_name``. ``enable_lora`` in
model.json without the file is an error, as in the official backend; the file without
``enable_lora`` turns LoRA on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rufus.errors import InvalidInput
from rufus.serving.config import MULTI_LORA_FILE, lora_enabled
from rufus.serving.engine import EngineSpec
from rufus.serving.generation import run_generate
from rufus.serving.model_settings import LLMSettings
from rufus.serving.request import GenerateRequest, finish_logprobs
from rufus.serving.sampling import merge_sampling, request_parameters
from rufus.serving.triton_backend import EngineModel
from rufus.serving.validation import (
    DEFAULT_LIMITS,
    InputSpec,
    Limits,
    OutputSpec,
    check_text,
    decode_inputs,
    parse_messages,
    quote,
)

RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
# rufus_llm: the official Triton vLLM backend's inputs (text only) plus ``messages``.
LLM_INPUT_SPECS: tuple[InputSpec, ...] = (
    InputSpec("text_input", "TYPE_STRING"),
    InputSpec("messages", "TYPE_STRING"),
    InputSpec("stream", "TYPE_BOOL"),
    InputSpec("sampling_parameters", "TYPE_STRING", bound="max_parameters_bytes"),
    InputSpec("exclude_input_in_output", "TYPE_BOOL"),
    *(InputSpec(name, "TYPE_BOOL") for name in RETURN_FLAGS),
)
LLM_OUTPUT_SPECS: tuple[OutputSpec, ...] = (
    OutputSpec("text_output", "TYPE_STRING"),
    OutputSpec("finish_reason", "TYPE_STRING"),
    OutputSpec("cumulative_logprob", "TYPE_FP32"),
    OutputSpec("logprobs", "TYPE_STRING"),
    OutputSpec("num_input_tokens", "TYPE_UINT32", (1,)),
    OutputSpec("num_output_tokens", "TYPE_UINT32"),
)


def _param_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise InvalidInput(f"parameters.{name}", f"must be true or false, got {quote(v)}")


def parse_generate_request(
    inputs: Mapping[str, np.ndarray | None],
    parameters_json: str | None = None,
    default_max_tokens: int = 256,
    limits: Limits = DEFAULT_LIMITS,
) -> GenerateRequest:
    """Validate the tensors and request parameters of one rufus_llm request.

    ``sampling_parameters`` may come as the input tensor (official backend style) and/or
    as Triton request parameters; the tensor wins on conflicts. ``stream`` may also come as
    a request parameter (the official README's HTTP generate example sends it there).
    """
    values = decode_inputs(LLM_INPUT_SPECS, inputs, limits)
    text, msgs_raw = values.get("text_input"), values.get("messages")
    if text is None and msgs_raw is None:
        raise InvalidInput("text_input", "missing: send 'text_input' or 'messages'")
    if text is not None and msgs_raw is not None:
        raise InvalidInput("messages", "send either 'text_input' or 'messages', not both")
    if text is not None:
        check_text("text_input", text)
        if not text.strip():
            raise InvalidInput("text_input", "is empty")
    messages = parse_messages(msgs_raw, limits=limits) if msgs_raw is not None else None

    params = request_parameters(parameters_json, limits)
    stream_param = params.pop("stream", None)
    stream = values.get("stream")
    if stream is None:
        stream = False if stream_param is None else _param_bool("stream", stream_param)
    sampling = merge_sampling(values.get("sampling_parameters"), params, limits=limits,
                              default_max_tokens=default_max_tokens)
    if stream and sampling.get("n", 1) > 1:
        raise InvalidInput("sampling_parameters.n", "n > 1 is not supported with stream=true")

    # The official default: streaming excludes the input, non-streaming prepends it;
    # chat callers (``messages``, our extension) want the answer only.
    exclude = values.get("exclude_input_in_output")
    if exclude is None:
        exclude = stream or messages is not None
    if stream and not exclude:
        raise InvalidInput("exclude_input_in_output",
                           "When streaming, `exclude_input_in_output` = False is not allowed.")
    req = GenerateRequest(
        prompt=text,
        messages=messages,
        stream=stream,
        sampling=sampling,
        exclude_input_in_output=exclude,
        prompt_field="messages" if messages is not None else "text_input",
        lora_name=sampling.pop("lora_name", None),
    )
    for name in RETURN_FLAGS:
        setattr(req, name, values.get(name, False))
    finish_logprobs(req)
    return req




def load_loras(model_dir: Path, engine_args: dict[str, Any]) -> dict[str, str] | None:
    """Adapter name -> local path from ``multi_lora.json``; None when LoRA is off."""
    if not lora_enabled(model_dir, engine_args):
        return None
    path = model_dir / MULTI_LORA_FILE
    if not path.exists():
        raise FileNotFoundError(f"enable_lora is set in model.json but {path} is missing "
                                "(it maps each adapter name to its local path)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in raw.items()):
        raise ValueError(f"{path} must be a JSON object of adapter name -> local path")
    return {name: str((model_dir / p).resolve()) if not Path(p).is_absolute() else p
            for name, p in raw.items()}


class LLMModel(EngineModel):
    INPUT_SPECS = LLM_INPUT_SPECS
    OUTPUT_SPECS = LLM_OUTPUT_SPECS
    SETTINGS = LLMSettings

    def engine_spec(self, spec: EngineSpec) -> EngineSpec:
        """The base engine, with the adapters of multi_lora.json when LoRA is on."""
        loras = load_loras(self.model_dir, dict(spec.engine_args))
        if loras is None:
            return spec
        args = {**spec.engine_args, "enable_lora": True}
        args.setdefault("max_loras", max(1, min(len(loras), 4)))
        return replace(spec, engine_args=args, loras=loras)

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> GenerateRequest:
        return parse_generate_request(inputs, parameters, self.default_max_tokens,
                                      self.request_limits())

    def warmup_requests(self) -> list[list[GenerateRequest]]:
        """A streamed chat (the chat template, decode steps), a long prompt (prefill
        chunks), then 4 streams at once (batched decode)."""
        def req(**values: Any) -> GenerateRequest:
            tensors = {k: np.array([v], dtype=bool) if isinstance(v, bool)
                       else np.array([v.encode()], dtype=np.object_) for k, v in values.items()}
            return self.parse(tensors, None)

        chat = json.dumps([{"role": "user", "content": "Suggest running shoes for a beginner."}])
        small = json.dumps({"max_tokens": 8, "temperature": 0})
        words = max(8, min(400, self.host.max_model_len // 3))
        long_prompt = " ".join(["comfortable waterproof hiking boots"] * (words // 4))
        return [
            [req(messages=chat, stream=True, sampling_parameters=small)],
            [req(text_input=long_prompt, sampling_parameters=json.dumps({"max_tokens": 2}))],
            [req(messages=chat, stream=True, sampling_parameters=small) for _ in range(4)],
        ]

    async def handle(self, parsed: GenerateRequest, sink: Any, arrival: float,
                     request_id: str, internal: bool = False) -> None:
        await run_generate(self.host, self.watcher, parsed, sink, self.metrics, arrival,
                           request_id, internal)
