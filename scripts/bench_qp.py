"""Benchmark the query planner through Triton: Medusa vs autoregressive, same model, same run.

What runs and how it is measured: lab/qp/plan_bench.py's docstring. Figures:
docs/benchmarks.md.

    .venv/bin/python scripts/bench_qp.py [--rounds 1] [--concurrency 1 4 8] [--json out.json]
"""

from lab.qp.plan_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
