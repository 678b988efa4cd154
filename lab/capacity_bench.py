"""Capacity-weighted routing vs equal weights on a local fleet of two different units.

Two single-node units that differ only in their batch limit (``max_num_seqs``, default 8 and
2: a big and a small cell), each with its unit agent reporting its capacity, behind one
HAProxy with two frontends over the same units and health: ``units_lor`` (leastconn, weights
from the agents: load factor x capacity / reference, proxy/agent.py) and ``units_equal``
(leastconn, static equal weights: servers that ``track`` units_lor's health keep their own
weight, so no agent weight applies there). Closed-loop streaming load of mixed answer lengths
alternates the two in ABBA order (capacity, equal, equal, capacity) so drift on a shared
machine hits both alike. Per policy: first-token p50/p99, requests/s and tokens/s, each unit's share of
streams (HAProxy's own ``stot``), failures. The bar (issue 27): capacity-weighted p99 first
token at most equal weights', and higher throughput.

    python -m lab.capacity_bench                    # 8 vs 2 sequences, 4 phases
    python -m lab.capacity_bench --smoke            # two short phases (~4 min here)
    python scripts/capacity_bench.py --unit-seqs 8,2 --concurrency 10 --requests 96
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.fleet_bench import mixed_stream, mixed_workload
from lab.loadgen import closed_loop
from rufus.launch.fleet import FLEET_ENGINE_ARGS, Fleet
from rufus.launch.server import free_port

POLICIES = {"capacity": "units_lor", "equal": "units_equal"}
ABBA = ["capacity", "equal", "equal", "capacity"]


def say(msg: str) -> None:
    print(f"[capacity-bench] {msg}", file=sys.stderr, flush=True)


def agent_load(fleet: Fleet, i: int) -> dict[str, Any]:
    """Unit ``i``'s agent ``/load`` (capacity, weight, load); {} while it does not answer."""
    url = f"http://127.0.0.1:{fleet.units[i].ports.agent}/load"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def wait_for_capacity(fleet: Fleet, timeout: float = 60.0,
                      report: Callable[[str], None] = say) -> list[dict[str, Any]]:
    """Every agent reports a capacity, and HAProxy's weights are the agents' (idle units:
    the capacity ratio). Returns the agents' ``/load`` at that point."""
    assert fleet.haproxy is not None
    t0 = time.monotonic()
    loads: list[dict[str, Any]] = []
    weights: dict[str, int] = {}
    while time.monotonic() - t0 < timeout:
        loads = [agent_load(fleet, i) for i in range(len(fleet.units))]
        rows = fleet.haproxy.servers("units_lor")
        weights = {k: int(r["weight"] or 0) for k, r in rows.items()}
        want = {fu.name: ld.get("weight_percent") for fu, ld in zip(fleet.units, loads,
                                                                     strict=True)}
        if all(ld.get("capacity") for ld in loads) and weights == want:
            report("agents report capacity " + ", ".join(
                f"{fu.name} {ld['capacity']} seqs (weight {ld['weight_percent']}%)"
                for fu, ld in zip(fleet.units, loads, strict=True))
                + f"; HAProxy weights {weights}")
            return loads
        time.sleep(0.5)
    raise TimeoutError(f"agents did not report capacity within {timeout:.0f} s: loads {loads}, "
                       f"HAProxy weights {weights} (agent logs in {fleet.log_dir})")


def run_phase(fleet: Fleet, policy: str, lengths: dict[str, int], concurrency: int,
              requests: int) -> dict[str, Any]:
    """One closed-loop run through one policy's frontend; HAProxy's per-unit stream counts."""
    backend = POLICIES[policy]
    url = fleet.url if policy == "capacity" else fleet.equal_url
    before = fleet.served(backend)
    r = asyncio.run(closed_loop(mixed_stream(url, lengths), list(lengths), concurrency,
                                requests, 0, progress=True))
    after = fleet.served(backend)
    per_unit = {k: after[k] - before.get(k, 0) for k in after}
    total = sum(per_unit.values()) or 1
    r.update(policy=policy, per_unit_streams=per_unit,
             per_unit_share={k: round(v / total, 3) for k, v in per_unit.items()})
    return r


def summarize(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool each policy's phases (throughput weighted by wall time, percentiles averaged)
    and check the bar: capacity p99 TTFT <= equal's and capacity throughput > equal's."""
    out: dict[str, Any] = {}
    for policy in POLICIES:
        ps = [p for p in phases if p["policy"] == policy]
        if not ps:
            continue
        wall = sum(p["wall_s"] for p in ps)
        streams: dict[str, int] = {}
        for p in ps:
            for k, v in p["per_unit_streams"].items():
                streams[k] = streams.get(k, 0) + v
        total = sum(streams.values()) or 1
        out[policy] = {
            "req_s": sum(p["requests"] for p in ps) / wall,
            "output_tok_s": sum(p["output_tok_s"] * p["wall_s"] for p in ps) / wall,
            "ttft_p50_ms": sum(p["ttft_p50_ms"] for p in ps) / len(ps),
            "ttft_p99_ms": sum(p["ttft_p99_ms"] for p in ps) / len(ps),
            "errors": sum(p["errors"] for p in ps),
            "per_unit_share": {k: round(v / total, 3) for k, v in streams.items()},
        }
    if "capacity" in out and "equal" in out:
        cap, eq = out["capacity"], out["equal"]
        out["p99_ttft_ratio_capacity_over_equal"] = cap["ttft_p99_ms"] / eq["ttft_p99_ms"]
        out["throughput_ratio_capacity_over_equal"] = cap["output_tok_s"] / eq["output_tok_s"]
        out["bar_met"] = (out["p99_ttft_ratio_capacity_over_equal"] <= 1.0
                          and out["throughput_ratio_capacity_over_equal"] > 1.0)
    return out


def run(fleet: Fleet, *, concurrency: int, requests: int, phases: int, short: int, long: int,
        long_frac: float, seed: int, report: Callable[[str], None] = say) -> dict[str, Any]:
    """On a started, ready fleet with an equal-weights frontend: wait for capacities, warm
    both units, then the ABBA phases."""
    result: dict[str, Any] = {"agents": wait_for_capacity(fleet, report=report), "phases": []}
    lengths = mixed_workload(64, short, long, long_frac, seed)
    asyncio.run(closed_loop(mixed_stream(fleet.equal_url, lengths), list(lengths), 2, 4, 0,
                            progress=False))  # warm both units (equal weights reach both)
    for n, policy in enumerate((ABBA * ((phases + 3) // 4))[:phases], 1):
        report(f"phase {n}/{phases}: {policy} weights, {requests} requests at concurrency "
               f"{concurrency}")
        r = run_phase(fleet, policy, lengths, concurrency, requests)
        result["phases"].append(r)
        report(f"phase {n} {policy}: {r['req_s']:.2f} req/s, {r['output_tok_s']:.1f} tok/s, "
               f"TTFT p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms, errors "
               f"{r['errors']}, streams per unit {r['per_unit_streams']}")
    result["summary"] = summarize(result["phases"])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab.capacity_bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment: RUFUS_CAPACITY_REFERENCE is set for the agents from --reference; "
               "the units read the serving variables of docs/architecture.md")
    ap.add_argument("--unit-seqs", default="8,2",
                    help="max_num_seqs of each unit, comma-separated (default %(default)s)")
    ap.add_argument("--unit-engine-args", default="",
                    help="JSON list of per-unit engine-arg overrides (instead of --unit-seqs)")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes per unit (default 1)")
    ap.add_argument("--reference", type=int, default=0,
                    help="RUFUS_CAPACITY_REFERENCE for the agents (default: the largest unit's "
                         "max_num_seqs, so it weighs 100 %%)")
    ap.add_argument("--concurrency", type=int, default=10,
                    help="closed-loop streams (default 10: the units' batch slots together)")
    ap.add_argument("--requests", type=int, default=96, help="requests per phase")
    ap.add_argument("--phases", type=int, default=4, help="capacity, equal, equal, capacity, ...")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=160)
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true",
                    help="prove it works: 2 phases of 16 requests (overrides those options)")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-capacity"))
    ap.add_argument("--out", default="bench-results/capacity-bench.json")
    a = ap.parse_args(argv)
    if a.unit_engine_args:
        per_unit = json.loads(a.unit_engine_args)
        if not isinstance(per_unit, list) or not all(isinstance(x, dict) for x in per_unit):
            ap.error("--unit-engine-args: expected a JSON list of objects")
    else:
        try:
            per_unit = [{"max_num_seqs": int(x)} for x in a.unit_seqs.split(",")]
        except ValueError:
            ap.error(f"--unit-seqs {a.unit_seqs!r}: expected whole numbers, e.g. 8,2")
    if len(per_unit) < 2:
        ap.error("two or more units: the comparison needs units of different capacity")
    if a.smoke:
        a.phases, a.requests = 2, 16
    seqs = [int(u.get("max_num_seqs", FLEET_ENGINE_ARGS["max_num_seqs"])) for u in per_unit]
    reference = a.reference or max(seqs)
    # the agents inherit this process's environment (Fleet._start_agent)
    os.environ["RUFUS_CAPACITY_REFERENCE"] = str(reference)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    fleet = Fleet(n_units=len(per_unit), nnodes=a.nnodes, log_dir=Path(a.log_dir),
                  unit_engine_args=per_unit, equal_port=free_port())

    def on_signal(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "units": len(per_unit), "nnodes": a.nnodes,
        "engine_args": fleet.engine_args, "unit_engine_args": per_unit,
        "capacity_reference": reference, "concurrency": a.concurrency,
        "requests_per_phase": a.requests, "short_tokens": a.short, "long_tokens": a.long,
        "long_fraction": a.long_frac, "seed": a.seed, "smoke": a.smoke,
        "load_avg_start": os.getloadavg()}
    try:
        fleet.start()
        say(fleet.describe())
        say(f"fleet ready in {fleet.wait_ready():.0f} s")
        result.update(run(fleet, concurrency=a.concurrency, requests=a.requests,
                          phases=a.phases, short=a.short, long=a.long, long_frac=a.long_frac,
                          seed=a.seed))
    finally:
        fleet.stop()
    result["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    say(f"results in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
