"""`make fleet`: two inference units + their unit agents + HAProxy on this machine.

    python scripts/fleet.py                      # free ports, printed; Ctrl-C stops all
    python scripts/fleet.py --fixed-ports        # ingress :9000, stats :9100 (proxy/README.md)
    python scripts/fleet.py --nnodes 1           # single-node units (less CPU)
    python scripts/fleet.py bench                # least-outstanding vs round robin, same run

The same as ``python -m rufus.harness.fleet`` (rufus/harness/fleet.py; the benchmark:
rufus/harness/fleet_bench.py).
"""

from rufus.harness.fleet import main

if __name__ == "__main__":
    raise SystemExit(main())
