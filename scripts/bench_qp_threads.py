"""Planner latency per ``torch_threads`` next to an idle or busy answer model.

What runs: lab/qp/threads_bench.py's docstring. Figures: docs/benchmarks-history.md
("Planner threads").

    .venv/bin/python scripts/bench_qp_threads.py [--threads auto 2 1] [--neighbours idle same apart]
"""

from lab.qp.threads_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
