"""`make capacity-bench`: capacity-weighted routing vs equal weights, two different units.

    python scripts/capacity_bench.py                       # max_num_seqs 8 vs 2, ABBA phases
    python scripts/capacity_bench.py --smoke               # two short phases: does it work
    python scripts/capacity_bench.py --unit-seqs 8,2 --concurrency 10 --requests 96

The same as ``python -m lab.capacity_bench`` (lab/capacity_bench.py).
"""

from lab.capacity_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
