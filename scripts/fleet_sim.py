"""Fleet-scale routing simulation: 100+ units, Prime-Day-like bursts, six routing policies.

    python scripts/fleet_sim.py                   # markdown table, about 30-60 s
    python scripts/fleet_sim.py --json out.json --seed 2 --units 150

Service times come from rufus/harness/fleet_sim_calibration.json, measured on the real engine
by ``python scripts/fleet.py bench --calibrate`` (rufus/harness/fleet_bench.py; see
rufus/harness/fleet_sim.py for the unit model). For each policy: p99/p50 TTFT with
``--units`` units, and the fewest units that keep p99 TTFT under ``--target`` seconds for
the same traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from rufus.harness.fleet_sim import (
    CALIBRATION,
    POLICIES,
    ServiceModel,
    WorkloadSpec,
    offered_rate,
    simulate,
    units_needed,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--utilization", type=float, default=0.45,
                    help="base load as a share of the fleet's decode capacity (default %(default)s)")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--target", type=float, default=1.0, help="p99 TTFT target, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    if a.calibration.exists():
        model = ServiceModel.load(a.calibration)
        source = f"{a.calibration.name} (measured on the real engine)"
    else:
        model = ServiceModel()
        source = "built-in defaults (no calibration file)"
    spec = WorkloadSpec(duration_s=a.duration)
    spec = replace(spec, base_rate=offered_rate(model, spec, a.units, a.utilization))
    t0 = time.monotonic()
    rows = []
    for name in a.policies.split(","):
        r = simulate(a.units, name, model, spec, a.seed)
        need, runs = units_needed(name, model, spec, target_p99_s=a.target, lo=a.units // 2,
                                  hi=4 * a.units, seed=a.seed)
        r.update(policy=name, units_needed=need, search_runs=runs)
        rows.append(r)
        print(f"  {name}: p99 {r['ttft_p99_s']:.2f} s at {a.units} units; needs {need} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0

    print(f"Service model: {source}: step = {model.step_base_s * 1000:.1f} ms + "
          f"{model.step_per_seq_s * 1000:.2f} ms x batch + {model.prefill_per_token_s * 1e6:.0f} us x "
          f"new prompt tokens; max_num_seqs {model.max_num_seqs}; prefix cache "
          f"{model.cache_tokens} tokens/unit.")
    print(f"Traffic: {spec.duration_s:.0f} s, {spec.base_rate:.1f} new sessions/s "
          f"(= {a.utilization:.0%} of {a.units} units' decode capacity), x{spec.peak} peak in the "
          f"middle third, x{spec.burst} lightning-deal bursts of {spec.burst_s:.0f} s every "
          f"~{spec.burst_every_s:.0f} s; {spec.chat_frac:.0%} multi-turn chats; answers "
          f"{1 - spec.long_frac:.0%} short (~{spec.short_tokens}) / {spec.long_frac:.0%} long "
          f"(~{spec.long_tokens}) tokens; seed {a.seed}; {elapsed:.0f} s to simulate.\n")
    print(f"| policy | p50 TTFT @{a.units} | p99 TTFT @{a.units} | follow-up prefix-cache hits "
          f"| units for p99 TTFT < {a.target:g} s |")
    print("|---|---|---|---|---|")
    for r in rows:
        need = r["units_needed"] if r["units_needed"] is not None else f"> {4 * a.units}"
        print(f"| {r['policy']} | {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s | "
              f"{r['followup_cache_hit']:.0%} | {need} |")
    if a.json:
        a.json.write_text(json.dumps({"model": asdict(model), "spec": asdict(spec),
                                      "seed": a.seed, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
