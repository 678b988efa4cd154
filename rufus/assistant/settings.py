"""The shopping assistant's settings: rufus_assistant's config.pbtxt parameters, and what the
pipeline reads from the environment (the Triton model and the frontend's ``rufus-assistant``
hook alike), admission included (its SLO and margin; :class:`AdmissionLimits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rufus.assistant.prompt import ANSWER_PRODUCTS
from rufus.env import lab_on
from rufus.serving.admission import AdmissionSettings, with_limits
from rufus.serving.model_settings import ModelSettings
from rufus.serving.settings import env_var, group, param, read, rows


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    """The assistant's admission as an operator sets it, measured at the first answer text;
    the fit's priors are AdmissionSettings' defaults (rufus/serving/admission.py)."""

    slo_s: float = env_var("RUFUS_ASSISTANT_SLO_S", 1.0,
                           "first answer text SLO, seconds; turns estimated past margin x SLO "
                           "are refused UNAVAILABLE / 503 (0 turns admission off)", minimum=0)
    margin: float = env_var("RUFUS_ASSISTANT_MARGIN", 1.0,
                            "refuse above this share of the SLO", minimum=0)


def read_admission(env: Mapping[str, str] | None = None) -> AdmissionSettings:
    limits = read(AdmissionLimits, env=env)
    return with_limits(AdmissionSettings(), limits.slo_s, limits.margin)


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """What the pipeline reads from the environment."""

    plan_timeout_s: float = env_var("RUFUS_ASSISTANT_PLAN_TIMEOUT_S", 10.0,
                                    "planner time limit before the fallback plan, seconds",
                                    minimum=0)
    # a follow-up's answer prefix prefilled while the planner runs (RUFUS_LAB_OFF=prewarm:
    # the benchmark's baseline, no operator's knob)
    prewarm: bool = True
    admission: AdmissionSettings = group(  # noqa: RUF009 - a default_factory field
        AdmissionSettings, read=read_admission, describe=lambda: rows(AdmissionLimits))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PipelineSettings:
        return dataclasses.replace(read(cls, env=env), prewarm=lab_on("prewarm", env))


@dataclasses.dataclass(frozen=True)
class AssistantSettings(ModelSettings):
    """rufus_assistant: its config.pbtxt parameters and the pipeline's environment."""

    planner_model: str = param("planner_model", "rufus_qp_medusa", "the planner it calls")
    answer_model: str = param("answer_model", "rufus_llm", "the answer model it calls")
    num_products: int = param("num_products", 5, "product cards per turn", minimum=1)
    answer_products: int = param("answer_products", ANSWER_PRODUCTS,
                                 "of those cards, how many the answer prompt lists", minimum=1)
    answer_max_tokens: int = param("answer_max_tokens", 160, "answer length cap, tokens",
                                   minimum=1, env=True)
    triton_grpc_url: str = param("triton_grpc_url", "127.0.0.1:8001",
                                 "this server's gRPC address, where it calls the two models "
                                 "(the launcher sets RUFUS_TRITON_GRPC_URL)", env=True)
    pipeline: PipelineSettings = group(  # noqa: RUF009 - a default_factory field
        PipelineSettings, read=PipelineSettings.from_env)
