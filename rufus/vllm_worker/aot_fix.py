"""Make vLLM 0.32's AOT compile cache load on CPU (a vLLM worker extension).

Why every start compiled again ("Compiling model again due to a load failure ... 'function'
object has no attribute 'finalize_loading'"): on CPU, vLLM turns its own compilation mode
into ``DYNAMO_TRACE_ONCE`` with torch's stock ``inductor`` backend (vllm/platforms/cpu.py).
torch then saves the AOT artifact as a ``BundledAOTAutogradSerializableCallable`` (the
inductor-compiled function, complete once deserialized), but vLLM's loader
(``_try_load_aot_compiled_fn`` in vllm/compilation/decorators.py) assumes its own
``VllmSerializableFunction`` and calls ``compiled_fn.finalize_loading(vllm_config)``; the
bundled callable forwards that attribute to a plain function, the AttributeError is caught,
and vLLM traces and compiles the model again.

The fix gives torch's bundled callable a ``finalize_loading`` that does nothing (there is
nothing left to finalize), so the cached function is used. It must run in the process that
compiles the model (vLLM's worker): rufus's worker extension (rufus/vllm_worker/extension.py,
named in model.json) imports it there, the multi-node follower's worker included. Guarded:
it does nothing if torch or vLLM changed the classes involved.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rufus.vllm_worker.aot_fix")


def apply() -> bool:
    """Install the no-op ``finalize_loading``; True if installed (or already there)."""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
    except ImportError:  # a torch without AOT compile: nothing to fix
        return False
    if "finalize_loading" in vars(BundledAOTAutogradSerializableCallable):
        return True

    def finalize_loading(self: Any, vllm_config: Any) -> None:
        """Nothing to do: the deserialized inductor function is complete."""

    BundledAOTAutogradSerializableCallable.finalize_loading = finalize_loading
    return True


class AotCacheFix:
    """Empty on purpose: importing this module in the worker applies :func:`apply` (the
    extension class earlier model.json files name; rufus.vllm_worker.extension supersedes it)."""


apply()
