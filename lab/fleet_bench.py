"""Routing benchmark and calibration on a local fleet (``make fleet-bench``).

Least outstanding requests vs round robin through the same HAProxy (two frontends over the
same units), in one run, on a mixed workload where a share of the requests asks for long
answers: the policies differ only when some units are busier than others. ``calibrate``
measures the service times that lab/fleet_sim.py's unit model needs (the fleet
simulator's ``lab/fleet_sim_calibration.json``). Results and the command:
docs/benchmarks.md. :func:`main` is scripts/fleet.py: the fleet's own ``up``
(rufus/launch/fleet.py) and this ``bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from lab.loadgen import SHOPPING_PROMPTS, Stream, closed_loop, triton_stream
from rufus.client import agenerate
from rufus.launch import fleet as launch
from rufus.launch.fleet import Fleet

MODEL = "rufus_llm"


def say(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


def mixed_workload(n_prompts: int, short: int, long: int, long_frac: float,
                   seed: int) -> dict[str, int]:
    """prompt -> max_tokens: ``long_frac`` of the prompts get long answers (seeded)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n_prompts):
        p = f"{SHOPPING_PROMPTS[i % len(SHOPPING_PROMPTS)]} (customer {i})"
        out[p] = long if rng.random() < long_frac else short
    return out


def mixed_stream(url: str, lengths: dict[str, int], retries: int = 2) -> Stream:
    """A load-generator stream whose answer length comes from ``lengths`` (ignore_eos), sent
    with the client's retry rule (a unit taken out mid-run costs a retry, not an error)."""

    async def stream(prompt: str, _max_tokens: int) -> AsyncIterator[tuple[int, float]]:
        sampling = {"max_tokens": lengths[prompt], "temperature": 0.0, "ignore_eos": True}
        async for chunk in agenerate(url, MODEL, messages=[{"role": "user", "content": prompt}],
                                     sampling=sampling, flags={"return_num_output_tokens": True},
                                     retries=retries):
            yield int(chunk.outputs["num_output_tokens"][0]), chunk.t

    return stream


async def calibrate(url: str, report: Callable[[str], None] = say) -> dict[str, Any]:
    """Service times for the fleet simulator, measured on one unit directly (no proxy).

    ITL vs batch size (closed loop at 1, 4, 8 streams, 48 tokens) and TTFT vs prompt length
    at one stream (raw prompts of about 50, 300 and 700 tokens)."""
    out: dict[str, Any] = {"itl_ms": {}, "ttft_ms_by_prompt_tokens": {}}
    stream = triton_stream(url, MODEL)
    for c in (1, 4, 8):
        r = await closed_loop(stream, SHOPPING_PROMPTS, c, max(2 * c, 4), 48, progress=False)
        out["itl_ms"][str(c)] = r["itl_p50_ms"]
        report(f"calibration: {c} stream(s): ITL p50 {r['itl_p50_ms']:.1f} ms, "
               f"TTFT p50 {r['ttft_p50_ms']:.0f} ms")
    filler = "The customer compares tents, stoves, sleeping bags and lanterns for a trip. "
    for reps in (3, 20, 48):
        ttfts, ntok = [], 0
        for k in range(3):
            # a unique first line: vLLM's prefix cache must not serve any part of the prompt
            prompt = f"Order {random.random():.12f} {reps} {k}.\n" + filler * reps + "\nSummary:"
            t0 = time.monotonic()
            async for ch in agenerate(url, MODEL, prompt,
                                      sampling={"max_tokens": 1, "temperature": 0.0},
                                      flags={"return_num_input_tokens": True}):
                ttfts.append(time.monotonic() - t0)
                ntok = int(ch.outputs["num_input_tokens"][0])
                break
        median = 1000 * sorted(ttfts)[1]
        out["ttft_ms_by_prompt_tokens"][str(ntok)] = median
        report(f"calibration: prompt {ntok} tokens: TTFT median {median:.0f} ms")
    return out


def policy_phase(url: str, lengths: dict[str, int], concurrency: int,
                 requests: int) -> dict[str, Any]:
    """One closed-loop run of the mixed workload through one ingress."""
    return asyncio.run(closed_loop(mixed_stream(url, lengths), list(lengths), concurrency,
                                   requests, 0, progress=False))


def run_bench(fleet: Fleet, *, concurrency: int, requests: int, phases: int, short: int,
              long: int, long_frac: float, seed: int, calibrate_units: bool = False,
              report: Callable[[str], None] = say) -> dict[str, Any]:
    """On a started, ready fleet with a round-robin frontend: warm up, optionally calibrate,
    then alternate policies (LOR, RR, RR, LOR: first ``phases``) and pool them."""
    result: dict[str, Any] = {"phases": []}
    lengths = mixed_workload(64, short, long, long_frac, seed)
    policy_phase(fleet.url, lengths, 2, 4)  # warm both units
    if calibrate_units:
        result["calibration"] = asyncio.run(calibrate(fleet.units[0].url, report))
    for policy in ["lor", "rr", "rr", "lor"][:phases]:
        url = fleet.url if policy == "lor" else fleet.rr_url
        backend = "units_lor" if policy == "lor" else "units_rr"
        before = fleet.served(backend)
        r = policy_phase(url, lengths, concurrency, requests)
        after = fleet.served(backend)
        r["policy"] = policy
        r["per_unit_streams"] = {k: after[k] - before.get(k, 0) for k in after}
        result["phases"].append(r)
        report(f"{policy}: {r['output_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms "
               f"p99 {r['ttft_p99_ms']:.0f} ms, errors {r['errors']}, per unit "
               f"{r['per_unit_streams']}")
    result["summary"] = summarize_policies(result["phases"])
    return result


def summarize_policies(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the phases of each policy (weighted by wall time) and compute the bar: LOR
    must cut p99 TTFT to <= 0.7x of round robin's or raise throughput to >= 1.2x."""
    out: dict[str, Any] = {}
    for policy in ("lor", "rr"):
        ps = [p for p in phases if p["policy"] == policy]
        if not ps:
            continue
        wall = sum(p["wall_s"] for p in ps)
        toks = sum(p["output_tok_s"] * p["wall_s"] for p in ps)
        out[policy] = {"output_tok_s": toks / wall, "req_s": sum(p["requests"] for p in ps) / wall,
                       "ttft_p50_ms": sum(p["ttft_p50_ms"] for p in ps) / len(ps),
                       "ttft_p99_ms": sum(p["ttft_p99_ms"] for p in ps) / len(ps),
                       "errors": sum(p["errors"] for p in ps)}
    if "lor" in out and "rr" in out:
        out["p99_ttft_ratio_lor_over_rr"] = out["lor"]["ttft_p99_ms"] / out["rr"]["ttft_p99_ms"]
        out["throughput_ratio_lor_over_rr"] = out["lor"]["output_tok_s"] / out["rr"]["output_tok_s"]
        out["bar_met"] = (out["p99_ttft_ratio_lor_over_rr"] <= 0.7
                          or out["throughput_ratio_lor_over_rr"] >= 1.2)
    return out


def cmd_bench(a: argparse.Namespace) -> int:
    fleet = launch.build_fleet(a, rr=True)

    def on_signal(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "units": a.units,
                              "nnodes": a.nnodes, "engine_args": fleet.engine_args,
                              "concurrency": a.concurrency, "requests_per_phase": a.requests,
                              "short_tokens": a.short, "long_tokens": a.long,
                              "long_fraction": a.long_frac}
    try:
        fleet.start()
        say(fleet.describe())
        say(f"fleet ready in {fleet.wait_ready():.0f} s")
        result.update(run_bench(fleet, concurrency=a.concurrency, requests=a.requests,
                                phases=a.phases, short=a.short, long=a.long,
                                long_frac=a.long_frac, seed=a.seed, calibrate_units=a.calibrate))
    finally:
        fleet.stop()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    say(f"results in {a.out}")
    return 0


COMMANDS = {**launch.COMMANDS,
            "bench": "least outstanding vs round robin in one run (make fleet-bench; lab/fleet_bench.py)"}


def main(argv: list[str] | None = None) -> int:
    """scripts/fleet.py: ``up`` as ``python -m rufus.launch.fleet``, and ``bench``."""
    ap = launch.parser(COMMANDS, prog="python scripts/fleet.py")
    b = ap.add_argument_group("bench")
    b.add_argument("--concurrency", type=int, default=16)
    b.add_argument("--requests", type=int, default=96, help="requests per phase")
    b.add_argument("--phases", type=int, default=4, help="LOR, RR, RR, LOR (first N)")
    b.add_argument("--short", type=int, default=16)
    b.add_argument("--long", type=int, default=160)
    b.add_argument("--long-frac", type=float, default=0.2)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--calibrate", action="store_true",
                   help="also measure service times for scripts/fleet_sim.py")
    b.add_argument("--out", default="bench-results/proxy-bench.json")
    a = launch.parse(ap, argv)
    return cmd_bench(a) if a.command == "bench" else launch.cmd_up(a)
