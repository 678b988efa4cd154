"""Where a plan's time goes: plain decoding and the served decoder of the same planner, in
process, split into forward passes (by row count), the LM head and the rest (grammar,
drafts, Python), on the same questions, interleaved.

    .venv/bin/python scripts/profile_qp.py [--questions 20] [--threads 1] [--dtype int8]
        [--json build/qp/profile.json]

Why: the served decoder's speedup over plain decoding is bounded by what an extra row of a
verification pass costs against a whole one-row pass, and that differs per CPU class (on
AVX2 a multi-row pass is bound by arithmetic, a one-row pass by reading the weights). This
prints both, so the bound can be read off a machine (docs/benchmarks.md). The CPU class is
printed and written with the figures; set ``ATEN_CPU_CAPABILITY=avx2`` (and
ONEDNN_MAX_CPU_ISA, MKL's variable) to measure the AVX2 build on a bigger CPU.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.qp.profile_plan import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
