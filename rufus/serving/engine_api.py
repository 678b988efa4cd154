"""The engine interface rufus serves through, and the vLLM-shaped output types.

:class:`rufus.serving.engine.EngineHost` and :func:`rufus.serving.generation.run_generate`
drive an engine only through :class:`Engine`: vLLM's ``AsyncLLM`` satisfies it as it is, the
query planner's torch Medusa engine (rufus/qp/decoder/torch_engine.py) and the unit tests'
fakes implement it. The output dataclasses carry exactly the fields of vLLM's
``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` that rufus/serving/responses.py reads,
so non-vLLM engines and fakes produce what the response builder expects without importing vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class Logprob:
    """Same fields as vLLM's ``Logprob``."""

    logprob: float
    rank: int
    decoded_token: str


@dataclass
class Completion:
    """Same fields as vLLM's ``CompletionOutput`` that rufus/serving/responses.py reads."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    index: int = 0


@dataclass
class Output:
    """Same fields as vLLM's ``RequestOutput`` that rufus reads."""

    outputs: list[Completion]
    finished: bool
    request_id: str = ""


class ModelConfig(Protocol):
    max_model_len: int


class UnfinishedCounter(Protocol):
    def get_num_unfinished_requests(self) -> int: ...


@runtime_checkable
class Engine(Protocol):
    """What rufus needs from an inference engine (the slice of vLLM's ``AsyncLLM`` it uses).

    ``errored`` must turn true once the engine can no longer serve (vLLM: its engine core
    died); ``dead_error`` (optional) says why. :class:`~rufus.serving.engine.EngineHost`
    polls ``errored`` to refuse new requests at once and to replace the engine.
    """

    tokenizer: Any
    model_config: ModelConfig
    output_processor: UnfinishedCounter

    @property
    def errored(self) -> bool: ...

    def generate(self, prompt: Any, sampling_params: Any,
                 request_id: str) -> AsyncIterator[Any]: ...

    async def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...


def unfinished_requests(engine: Engine | None) -> int:
    """Requests the engine itself still holds (running + waiting)."""
    procs = getattr(engine, "output_processor", None)
    return int(procs.get_num_unfinished_requests()) if procs is not None else 0
