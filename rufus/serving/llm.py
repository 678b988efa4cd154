"""rufus_llm: streaming text generation, the official Triton vLLM backend's interface plus
``messages`` (chat rendered with the model's template).

LoRA follows the official convention: ``multi_lora.json`` next to ``model.json`` maps
adapter names to local paths (relative paths are read from the model's version directory),
and a request picks one with ``sampling_parameters.lora_name``. ``enable_lora`` in
model.json without the file is an error, as in the official backend; the file without
``enable_lora`` turns LoRA on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rufus.serving.generation import run_generate
from rufus.serving.requests import (
    KNOWN_INPUTS,
    LLM_INPUT_SPECS,
    LLM_OUTPUT_SPECS,
    GenerateRequest,
    Limits,
    parse_generate_request,
)
from rufus.serving.triton_backend import EngineModel, TritonSink, add_io, config_param

MULTI_LORA_FILE = "multi_lora.json"
LLM_INPUTS = [spec.config() for spec in LLM_INPUT_SPECS]
LLM_OUTPUTS = [spec.config() for spec in LLM_OUTPUT_SPECS]


def load_loras(model_dir: Path, engine_args: dict[str, Any]) -> dict[str, str] | None:
    """Adapter name -> local path from ``multi_lora.json``; None when LoRA is off."""
    path = model_dir / MULTI_LORA_FILE
    wanted = str(engine_args.get("enable_lora", "")).lower() == "true"
    if not path.exists():
        if wanted:
            raise FileNotFoundError(f"enable_lora is set in model.json but {path} is missing "
                                    "(it maps each adapter name to its local path)")
        return None
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
    INPUTS = set(KNOWN_INPUTS)
    loras: dict[str, str] | None = None

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        return add_io(auto_complete_model_config, LLM_INPUTS, LLM_OUTPUTS)

    def setup(self) -> None:
        self.loras = load_loras(self.model_dir, self.host.engine_args)
        if self.loras is not None:
            self.host.engine_args["enable_lora"] = True
            self.host.engine_args.setdefault("max_loras", max(1, min(len(self.loras), 4)))
            self.host.loras = self.loras  # type: ignore[attr-defined]
        super().setup()

    def request_limits(self) -> Limits:
        limits = getattr(self, "_limits", None)
        if limits is None:
            limits = self._limits = Limits.for_model(
                lambda key, default: config_param(self.model_config, key, default),
                self.host.engine, self.loras)
        return limits

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> GenerateRequest:
        return parse_generate_request(inputs, parameters, self.default_max_tokens,
                                      self.request_limits())

    async def handle(self, parsed: GenerateRequest, sink: TritonSink, arrival: float,
                     request_id: str) -> None:
        await run_generate(self.host, self.watcher, parsed, sink, self.metrics, arrival, request_id)
