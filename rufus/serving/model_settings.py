"""Each model's config.pbtxt ``parameters``, typed: one frozen object per model, read once at
load (:meth:`ModelSettings.from_config`). ``RUFUS_<KEY>`` in the environment wins over the
file, for every model that reads the key.

The planner adds its model.json knobs (rufus/qp/settings.py) and the assistant its pipeline
settings (rufus/assistant/settings.py); rufus_llm's model.json is vLLM's engine arguments,
passed through (rufus/serving/config.py: ``${VAR}``, overrides, ``"dtype": "measured"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from rufus.serving.engine import RestartPolicy
from rufus.serving.settings import config_parameters, group, param, read
from rufus.serving.validation import Limits


@dataclass(frozen=True)
class ModelSettings:
    """What every model reads from its config.pbtxt."""

    warmup: bool = param("warmup", True, "serve warm-up requests before reporting ready "
                         "(false: ready at once, the first requests pay)", env=True)
    report_custom_metrics: bool = param("REPORT_CUSTOM_METRICS", True,
                                        "publish the model's rufus_* metric families")
    limits: Limits = group(Limits)  # noqa: RUF009 - a default_factory field

    @classmethod
    def from_config(cls, model_config: Mapping[str, Any],
                    env: Mapping[str, str] | None = None) -> Self:
        """From Triton's model_config (config.pbtxt as JSON) and the environment."""
        return read(cls, params=config_parameters(model_config), env=env,
                    model=str(model_config.get("name", "")))


@dataclass(frozen=True)
class EngineModelSettings(ModelSettings):
    """A model served by an engine (rufus_llm, rufus_qp_medusa)."""

    default_max_tokens: int = param("default_max_tokens", 256,
                                    "max_tokens of a request that sets none", minimum=1)
    max_outstanding_requests: int = param("max_outstanding_requests", 0,
                                          "requests admitted at once, queued or running; "
                                          "more are refused AT_CAPACITY (0: no limit)",
                                          minimum=0, env=True)
    restart: RestartPolicy = group(RestartPolicy)  # noqa: RUF009 - a default_factory field


@dataclass(frozen=True)
class LLMSettings(EngineModelSettings):
    """rufus_llm. Its model.json holds vLLM's engine arguments alone, which vLLM checks."""
