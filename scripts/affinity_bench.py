"""Conversation affinity vs least outstanding requests on two local units, same run.

    python scripts/affinity_bench.py                 # ~10 minutes on 2 cores
    python scripts/affinity_bench.py --help

The same as ``python -m lab.affinity_bench`` (lab/affinity_bench.py);
figures and the command: docs/benchmarks-history.md, "Conversation affinity".
"""

from lab.affinity_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
