"""Prime Day across three regions: the traffic orchestrator vs fixed shares, simulated.

    python scripts/region_sim.py                 # markdown table, well under two minutes
    python scripts/region_sim.py --seed 2 --scale 0.25 --json out.json --timeline

Runs the orchestrator's own policy (proxy/orchestrator_policy.py) on the signals its
monitoring would read, against fixed shares and fixed shares with a health-check failover,
on the same seeded requests: a diurnal day, a burst in one region, a region failure.
The model and its assumptions: rufus/harness/region_sim.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rufus.harness.fleet_sim import CALIBRATION, ServiceModel
from rufus.harness.region_sim import (
    POLICIES,
    Scenario,
    burst_load,
    markdown,
    simulate,
    timeline_text,
)


def main(argv: list[str] | None = None) -> int:
    d = Scenario()
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="environment: none read")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=d.scale,
                    help="fraction of the fleet and of its traffic simulated (default %(default)s)")
    ap.add_argument("--day-s", type=float, default=d.day_s,
                    help="simulated seconds the 24 h diurnal curve is compressed into (default %(default)s)")
    ap.add_argument("--peak-utilization", type=float, default=d.peak_utilization,
                    help="decode utilization of the fleet at the day's peak; sizes the fleet")
    ap.add_argument("--direct-frac", type=float, default=d.direct_frac,
                    help="share of each region's demand pinned to its own ingress")
    ap.add_argument("--burst-factor", type=float, default=d.burst_factor)
    ap.add_argument("--interval", type=float, default=d.interval_s,
                    help="orchestrator round, simulated seconds (default %(default)s)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--timeline", action="store_true", help="print the orchestrator's share changes")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    model = ServiceModel.load(a.calibration) if a.calibration.exists() else ServiceModel()
    try:
        sc = replace(d, scale=a.scale, day_s=a.day_s, peak_utilization=a.peak_utilization,
                     direct_frac=a.direct_frac, burst_factor=a.burst_factor, interval_s=a.interval)
    except ValueError as exc:
        ap.error(str(exc))
    t0 = time.monotonic()
    res = simulate(sc, model, seed=a.seed, policies=tuple(a.policies.split(",")))
    took = time.monotonic() - t0
    units = sum(res.units.values())
    print(f"Prime Day, {len(sc.regions)} regions (baselines "
          f"{', '.join(f'{r.name} {r.baseline:g}' for r in sc.regions)}): "
          f"{sc.tokens_per_min:,.0f} tokens/min on average, diurnal x{1 - sc.diurnal_amplitude:.1f}.."
          f"x{1 + sc.diurnal_amplitude:.1f} over a day compressed into {sc.day_s:.0f} s; "
          f"{sc.direct_frac:.0%} of each region's demand pinned to it, the rest through the global "
          f"ingress; +{sc.rtt_s * 1000:.0f} ms first token when served off-origin.")
    print(f"Fleet: {res.full_scale_units} units of our engine ({res.unit_tok_s:.0f} tok/s each at "
          f"full batch) carry the peak at {sc.peak_utilization:.0%} utilization, so one unit "
          f"stands for {res.chips_per_unit:.0f} of the {sc.chips:,} chips; simulated at scale "
          f"{sc.scale:g}: {units} units ({', '.join(f'{k} {v}' for k, v in res.units.items())}) "
          f"and the same fraction of the traffic. SLA: P99 first token < {sc.sla_ttft_s:g} s; a "
          f"request queued {sc.deadline_s:g} s is given up; a unit admits {sc.max_outstanding}. "
          f"Seed {a.seed}; {took:.0f} s to simulate.\n")
    fleet, pinned = burst_load(sc)
    print(f"At the burst's peak the fleet would run at {fleet:.0%} of its decode capacity if the "
          f"load were spread perfectly; {sc.burst_region}'s pinned traffic alone loads its own "
          f"units to {pinned:.0%}.\n")
    print(markdown(res, sc))
    if a.timeline:
        for r in res.rows:
            if r["policy"] == "orchestrator":
                print("\nOrchestrator share changes (simulated time):")
                print(timeline_text(r))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"seed": a.seed, "units": res.units,
                                      "full_scale_units": res.full_scale_units,
                                      "scenario": res.scenario, "rows": res.rows}, indent=1))
        print(f"\nwritten {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
