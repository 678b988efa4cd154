"""What serves an OpenAI model id: a Triton model (rufus_llm over gRPC) or a registered hook.

OpenAI model ids are the Triton model names (``rufus_llm``): one name in the whole stack, in
logs, metrics and dashboards. Other ids are registered with :func:`register` (the
``rufus-assistant`` pipeline of rufus/assistant/ when that package is importable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rufus.client import RequestFailed, agenerate
from rufus.frontend.protocol import ParsedRequest, TritonCall
from rufus.frontend.render import Delta, parse_outputs

log = logging.getLogger("rufus.frontend")

# Every response carries what usage, finish_reason and logprobs need.
FLAGS = {"exclude_input_in_output": True, "return_finish_reason": True,
         "return_num_input_tokens": True, "return_num_output_tokens": True}


class Target(Protocol):
    """Serves one OpenAI model id."""

    owned_by: str

    def generate(self, parsed: ParsedRequest, call: TritonCall) -> AsyncIterator[Delta]:
        """Deltas of one call; raises :class:`RequestFailed` (Triton status) on errors."""
        ...


class TritonModelClient:
    """A Triton model with rufus_llm's interface, one gRPC stream per call.

    ``client`` is a shared ``tritonclient.grpc.aio`` client (one HTTP/2 connection; the
    ingress still routes each stream on its own); ``retries`` resends a call that failed with
    UNAVAILABLE/NOT_FOUND before its first chunk (rufus.client's rule), which matters behind
    the ingress while a unit is taken out.
    """

    owned_by = "rufus"

    def __init__(self, url: str, model: str, client: Any, retries: int, timeout: float) -> None:
        self.url = url
        self.model = model
        self.client = client
        self.retries = retries
        self.timeout = timeout

    async def generate(self, parsed: ParsedRequest, call: TritonCall) -> AsyncIterator[Delta]:
        flags = dict(FLAGS, return_logprobs=parsed.logprobs)
        async for chunk in agenerate(self.url, self.model, call.prompt, call.messages,
                                     stream=parsed.stream, sampling=call.sampling, flags=flags,
                                     timeout=self.timeout, retries=self.retries,
                                     client=self.client, conversation=parsed.conversation,
                                     trace=parsed.trace):
            yield parse_outputs(chunk.outputs)


@dataclass
class HookEvent:
    """A pipeline's output for a chat stream: text, plus extension fields for the first chunk."""

    text: str = ""
    extra: dict[str, Any] | None = None
    finish: str | None = None
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens, with the finish


class ChatHook(Protocol):
    """A non-Triton chat model (e.g. rufus-assistant): messages in, events out."""

    owned_by: str

    def chat(self, messages: list[dict[str, str]], parsed: ParsedRequest) -> AsyncIterator[HookEvent]: ...


# model id -> factory(frontend settings) -> ChatHook; filled by register()
HOOKS: dict[str, Callable[..., ChatHook]] = {}


def register(model_id: str, factory: Callable[..., ChatHook]) -> None:
    """Expose a chat pipeline as an OpenAI model id (chat completions only)."""
    HOOKS[model_id] = factory


def start_hooks(hooks: Mapping[str, ChatHook]) -> list[asyncio.Task[None]]:
    """Start, in the background, each hook that builds something slow (its ``start``: the
    assistant's product index), so the first request after ready does not wait for it."""
    async def run(model_id: str, start: Callable[[], Awaitable[None]]) -> None:
        try:
            await start()
        except Exception as exc:  # noqa: BLE001 - the first request retries it and says why
            log.warning("model %s: building at start failed (retried on first use): %s",
                        model_id, exc)

    return [asyncio.create_task(run(m, h.start)) for m, h in hooks.items()
            if hasattr(h, "start")]


def hook_registries(hooks: Mapping[str, ChatHook]) -> list[Any]:
    """The Prometheus registries of the hooks that export series of their own."""
    return [h.registry for h in hooks.values() if hasattr(h, "registry")]


__all__ = [
    "FLAGS",
    "HOOKS",
    "ChatHook",
    "HookEvent",
    "RequestFailed",
    "Target",
    "TritonModelClient",
    "register",
]
