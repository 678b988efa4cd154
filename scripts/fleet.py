"""`make fleet`: two inference units + their unit agents + HAProxy on this machine.

    python scripts/fleet.py                      # free ports, printed; Ctrl-C stops all
    python scripts/fleet.py --fixed-ports        # ingress :9000, stats :9100 (proxy/README.md)
    python scripts/fleet.py --nnodes 1           # single-node units (less CPU)
    python scripts/fleet.py bench                # least-outstanding vs round robin, same run

``up`` is ``python -m rufus.launch.fleet`` (rufus/launch/fleet.py); the benchmark:
lab/fleet_bench.py.
"""

from lab.fleet_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
