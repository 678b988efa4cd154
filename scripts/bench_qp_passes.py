"""The planner's int8 forward pass by row count: the fused pass (every decoder layer in one call
of our kernel, rufus/qp/decoder/torch_llama._FusedStack) against the op-by-op pass of the same
int8 weights, in the same process, plus a check that both give the same hidden states.

    .venv/bin/python scripts/bench_qp_passes.py [--threads 2] [--rows 1 4 8 16 32 64]
        [--json build/qp/passes.json]

The op-by-op model is built with ``RUFUS_LAB_OFF=fused``, the fused one without it
(this script sets both). Each figure: median of ``--reps`` passes
verifying ``rows`` tokens after ``--context`` cached ones, LM head included (as
rufus/machine/precision.py times them). The CPU class is printed and written with the
figures; set ``ATEN_CPU_CAPABILITY=avx2`` (and ONEDNN_MAX_CPU_ISA, MKL's
variable) to measure the AVX2 build on a bigger CPU.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.qp.passes_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
