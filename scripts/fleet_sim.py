"""Fleet-scale routing simulation: 100+ units, Prime-Day-like bursts, six routing policies.

    python scripts/fleet_sim.py                   # markdown table, about 30-60 s
    python scripts/fleet_sim.py --json out.json --seed 2 --units 150

Service times come from lab/fleet_sim_calibration.json, measured on the real engine
by ``python scripts/fleet.py bench --calibrate`` (lab/fleet_bench.py; see
lab/fleet_sim.py for the unit model). For each policy: p99/p50 TTFT with
``--units`` units, and the fewest units that keep p99 TTFT under ``--target`` seconds for
the same traffic.
"""

from lab.fleet_sim import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
