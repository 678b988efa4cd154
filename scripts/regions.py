"""The orchestrator's real local run: two "regions" (one tritonserver unit + agent + HAProxy
ingress each) behind a global HAProxy whose weights python -m proxy.orchestrator sets.

    python scripts/regions.py up        # start everything, print where it listens; Ctrl-C stops all
    python scripts/regions.py drill     # load change on region a, then kill region b's tritonserver

The same as ``python -m lab.regions`` (lab/regions.py); the figures it
records: docs/benchmarks.md.
"""

from lab.regions import main

if __name__ == "__main__":
    raise SystemExit(main())
