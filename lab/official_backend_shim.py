# Compatibility shims for running the official Triton vLLM backend (written for vLLM ~0.11)
# against vLLM 0.32: a few names moved. Applied at benchmark time only: never imported,
# lab/bench.py prepends this text to the official model.py.
import importlib as _il
import sys as _sys

import vllm.inputs as _inputs
import vllm.v1.metrics.loggers as _loggers

try:
    _il.import_module("vllm.inputs.data")
except ImportError:
    _sys.modules["vllm.inputs.data"] = _inputs
if not hasattr(_loggers, "build_1_2_5_buckets"):
    from vllm.v1.metrics.buckets import build_1_2_5_buckets as _b

    _loggers.build_1_2_5_buckets = _b
import vllm.utils as _vu

if not hasattr(_vu, "random_uuid"):
    import uuid as _uuid

    _vu.random_uuid = lambda: _uuid.uuid4().hex
