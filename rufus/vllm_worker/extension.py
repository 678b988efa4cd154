"""rufus's vLLM worker extension: what it changes inside vLLM's worker process.

``"worker_extension_cls": "rufus.vllm_worker.extension.WorkerExtension"`` in model.json makes
every vLLM worker (the engine core's own on CPU, a multi-node follower's too) import this
module before it loads the model, so both patches below run where the model is compiled:

- rufus/vllm_worker/aot_fix.py: vLLM 0.32's AOT compile cache loads on CPU;
- rufus/vllm_worker/warmup.py: the compile warm-up runs a short dummy batch;
- rufus/machine/vllm_int8.py: the ``rufus_int8`` quantization method, known where the model
  loads (a forked engine core inherits it from rufus_llm; a spawned worker needs it here).

(vLLM leaves ``worker_extension_cls`` out of its compile-cache key, so naming this class
does not invalidate compiled artefacts.)
"""

from __future__ import annotations

import logging

from rufus.machine import vllm_int8
from rufus.vllm_worker import aot_fix as vllm_aot_fix
from rufus.vllm_worker import warmup as vllm_warmup

log = logging.getLogger("rufus.vllm_worker.extension")


class WorkerExtension:
    """Empty on purpose: importing this module in the worker applies the patches."""


APPLIED = {"aot_cache_fix": vllm_aot_fix.apply(), "short_warmup": vllm_warmup.apply(),
           "rufus_int8": vllm_int8.register()}
log.debug("vLLM worker patches: %s", APPLIED)
