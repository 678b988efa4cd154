"""Benchmark: start to ready (first and cached), 16-stream throughput per compile setting,
and engine death to serving again, each through a real tritonserver.

Compile settings compared in the same run (``--variants``):

* ``aot``    the served setting: vLLM 0.32's AOT compile cache (``VLLM_USE_AOT_COMPILE=1``)
  with our fix (rufus/vllm_worker/aot_fix.py, applied by the worker extension named in
  model.json), so a cached start loads the compiled model. Without the fix vLLM's loader
  fails on CPU ("'function' object has no attribute 'finalize_loading'") and every start
  compiles again.
* ``inductor`` ``VLLM_USE_AOT_COMPILE=0``: torch.compile each start, inductor's FX-graph and
  AOTAutograd caches (``TORCHINDUCTOR_CACHE_DIR``) skip code generation.
* ``eager``  ``enforce_eager``: no compilation at all.

Each variant gets its own empty cache directories, so its first start is a true cold start
and its later ones cached (``--rounds``). Starts of different variants alternate (``--rounds``), so the
load of a shared machine hits all alike; the table reports medians and the load average.

    python scripts/bench_recovery.py [--variants aot inductor eager] [--models rufus_llm]
        [--rounds 1] [--streams 16] [--death]
"""

from lab.recovery_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
