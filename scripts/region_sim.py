"""Prime Day across three regions: the traffic orchestrator vs fixed shares, simulated.

    python scripts/region_sim.py                 # markdown table, well under two minutes
    python scripts/region_sim.py --seed 2 --scale 0.25 --json out.json --timeline

Runs the orchestrator's own policy (proxy/orchestrator_policy.py) on the signals its
monitoring would read, against fixed shares and fixed shares with a health-check failover,
on the same seeded requests: a diurnal day, a burst in one region, a region failure.
The model and its assumptions: lab/region_sim.py.
"""

from lab.region_sim import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
