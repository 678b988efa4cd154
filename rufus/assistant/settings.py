"""The shopping assistant's settings: rufus_assistant's config.pbtxt parameters, and what the
pipeline reads from the environment (the Triton model and the frontend's ``rufus-assistant``
hook alike), admission included (:class:`~rufus.serving.admission.AdmissionSettings`,
``RUFUS_ASSISTANT_<FIELD>``, which keeps its own reader).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rufus.assistant.prompt import ANSWER_PRODUCTS
from rufus.serving.admission import AdmissionSettings, admission_rows
from rufus.serving.model_settings import ModelSettings
from rufus.serving.settings import Row, env_var, group, param, read

# the assistant's admission: RUFUS_ASSISTANT_SLO_S, RUFUS_ASSISTANT_MARGIN and the fit's
# priors (RUFUS_ASSISTANT_<FIELD>), measured at the first answer text
ADMISSION_PREFIX = "RUFUS_ASSISTANT_"
ADMISSION_HELP: dict[str, str] = {
    "slo_s": "first answer text SLO, seconds; turns estimated past margin x SLO are refused "
             "UNAVAILABLE / 503 (0 turns admission off)",
    "margin": "refuse above this share of the SLO",
    "base_s": "prior: first answer text of a lone turn, seconds",
    "per_waiting_s": "prior: added per turn ahead still waiting for its first text, seconds",
    "per_decoding_s": "prior: added per turn decoding its answer, seconds",
    "forgetting": "the fit's weight of the past per observation",
    "prior_weight": "observations the priors count as",
    "warm_after": "turns measured before the estimate refuses at margin x SLO; until then "
                  "only above 1.5 times that (the priors are a guess for this CPU)",
}


def read_admission(env: Mapping[str, str] | None = None) -> AdmissionSettings:
    return AdmissionSettings.from_env(env, ADMISSION_PREFIX)


def admission_env_rows() -> list[Row]:
    """AdmissionSettings as docs/configuration.md lists it (one variable per field)."""
    return admission_rows(ADMISSION_PREFIX, AdmissionSettings(), ADMISSION_HELP)


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """What the pipeline reads from the environment."""

    plan_timeout_s: float = env_var("RUFUS_ASSISTANT_PLAN_TIMEOUT_S", 10.0,
                                    "planner time limit before the fallback plan, seconds",
                                    minimum=0)
    prewarm: bool = env_var("RUFUS_ASSISTANT_PREWARM", True, "prefill a follow-up's answer "
                            "prefix while the planner runs")
    admission: AdmissionSettings = group(  # noqa: RUF009 - a default_factory field
        AdmissionSettings, read=read_admission, describe=admission_env_rows)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PipelineSettings:
        return read(cls, env=env)


@dataclasses.dataclass(frozen=True)
class AssistantSettings(ModelSettings):
    """rufus_assistant: its config.pbtxt parameters and the pipeline's environment."""

    planner_model: str = param("planner_model", "rufus_qp_medusa", "the planner it calls")
    answer_model: str = param("answer_model", "rufus_llm", "the answer model it calls")
    num_products: int = param("num_products", 5, "product cards per turn", minimum=1)
    answer_products: int = param("answer_products", ANSWER_PRODUCTS,
                                 "of those cards, how many the answer prompt lists", minimum=1)
    answer_max_tokens: int = param("answer_max_tokens", 160, "answer length cap, tokens",
                                   minimum=1)
    triton_grpc_url: str = param("triton_grpc_url", "127.0.0.1:8001",
                                 "this server's gRPC address, where it calls the two models "
                                 "(the launcher sets RUFUS_TRITON_GRPC_URL)")
    pipeline: PipelineSettings = group(PipelineSettings)  # noqa: RUF009 - a default_factory field
