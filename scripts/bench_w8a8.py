"""W8A8 (int8, compressed-tensors) answer model on vLLM CPU: load check, agreement, speed.

    .venv/bin/python scripts/bench_w8a8.py engine --model DIR --dtype bfloat16 --json OUT
        one vLLM start: greedy first-32 tokens of 20 fixed chat prompts, a 128-token prefill
        with 1 output token (median of 5, prefix caching off), 16 prompts x 64 tokens.
    .venv/bin/python scripts/bench_w8a8.py compare REF.json OTHER.json [...]
        share of prompts whose first 32 greedy tokens equal the reference's; first divergences.
    .venv/bin/python scripts/bench_w8a8.py quality --src DIR --w8a8 DIR --ref REF.json
        transformers, no vLLM: teacher-forced top-1 agreement and KL vs fp32 for bf16,
        int8 weights only, and W8A8 simulated (per-token int8 fake-quant of Linear inputs).
    .venv/bin/python scripts/bench_w8a8.py kernels [--rows 1 16 128] [--reps N]
        one thread: vLLM's int8 path (dynamic per-token quant + oneDNN scaled mm, as
        CPUInt8ScaledMMLinearKernel runs it) vs F.linear fp32 and bf16 at the model's shapes.

Emulate an AVX2-only CPU on an AVX-512 one by prefixing
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``. The model is written by
``python -m rufus.launch.w8a8``.
"""

from lab.w8a8_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
