"""`make fleet`: two inference units + their unit agents + HAProxy on this machine.

    python scripts/fleet.py                      # free ports, printed; Ctrl-C stops all
    python scripts/fleet.py --fixed-ports        # ingress :9000, stats :9100 (proxy/README.md)
    python scripts/fleet.py --nnodes 1           # single-node units (less CPU)
    python scripts/fleet.py bench                # least-outstanding vs round robin, same run

Everything started here is ended by process group on exit (Ctrl-C, SIGTERM, or an error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.fleet import Fleet
from rufus.harness.loadgen import SHOPPING_PROMPTS, closed_loop

log = logging.getLogger("fleet")


def _print(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


def build_fleet(a: argparse.Namespace, rr: bool = False) -> Fleet:
    extra = {}
    if a.engine_args:
        extra["RUFUS_RUFUS_LLM_ENGINE_ARGS"] = a.engine_args
    fleet = Fleet(n_units=a.units, nnodes=a.nnodes, log_dir=Path(a.log_dir),
                  fixed_ports=a.fixed_ports,
                  rr_port=(9001 if a.fixed_ports else _free()) if rr else None)
    if a.engine_args:
        fleet.engine_args.update(json.loads(a.engine_args))
    return fleet


def _free() -> int:
    from proxy.fleet import listen_port

    return listen_port()


def describe(fleet: Fleet) -> str:
    lines = [f"ingress (gRPC, least outstanding): {fleet.url}"]
    if fleet.rr_port:
        lines.append(f"ingress (gRPC, round robin):       {fleet.rr_url}")
    if fleet.stats_port:
        lines.append(f"HAProxy stats: http://127.0.0.1:{fleet.stats_port}/stats  "
                     f"Prometheus: http://127.0.0.1:{fleet.stats_port}/metrics")
    for fu in fleet.units:
        u = fu.unit
        lines.append(f"{fu.name}: leader grpc :{u.grpc_port} http :{u.http_port} metrics "
                     f":{u.metrics_port}; followers "
                     f"{[u.health_url(r) for r in range(1, u.nnodes)]}; agent "
                     f"http://127.0.0.1:{fu.ports.agent}/health, agent-check :{fu.ports.agent_check}")
    lines.append(f"logs: {fleet.log_dir}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- up
def cmd_up(a: argparse.Namespace) -> int:
    fleet = build_fleet(a)
    stop = {"flag": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    try:
        fleet.start()
        _print("starting (first engine start compiles: 1-3 minutes on 2 cores)\n" + describe(fleet))
        t0 = time.monotonic()
        while not stop["flag"]:
            st = fleet.server_status()
            if all(s == "UP" for s in st.values()):
                _print(f"all units UP after {time.monotonic() - t0:.0f} s. Try:\n"
                       f"  .venv/bin/python scripts/client.py --url {fleet.url} "
                       f"\"What should I pack for a beach trip?\"\nCtrl-C stops everything.")
                break
            time.sleep(1)
        last: dict[str, str] = {}
        while not stop["flag"]:
            st = fleet.server_status()
            if st != last:
                _print(f"HAProxy sees {st}")
                last = st
            time.sleep(1)
    finally:
        _print("stopping HAProxy, agents and units")
        fleet.stop()
    return 0


# ---------------------------------------------------------------------------- bench
def mixed_workload(n_prompts: int, short: int, long: int, long_frac: float,
                   seed: int) -> dict[str, int]:
    """prompt -> max_tokens: ``long_frac`` of the prompts get long answers (seeded)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n_prompts):
        p = f"{SHOPPING_PROMPTS[i % len(SHOPPING_PROMPTS)]} (customer {i})"
        out[p] = long if rng.random() < long_frac else short
    return out


def mixed_stream(url: str, lengths: dict[str, int]) -> Any:
    from rufus.client import agenerate

    async def stream(prompt: str, _max_tokens: int) -> AsyncIterator[tuple[int, float]]:
        sampling = {"max_tokens": lengths[prompt], "temperature": 0.0, "ignore_eos": True}
        async for chunk in agenerate(url, "rufus_llm", messages=[{"role": "user", "content": prompt}],
                                     sampling=sampling, flags={"return_num_output_tokens": True},
                                     retries=2):
            yield int(chunk.outputs["num_output_tokens"][0]), chunk.t

    return stream


async def _calibrate(url: str) -> dict[str, Any]:
    """Service times for scripts/fleet_sim.py, measured on one unit directly (no proxy).

    ITL vs batch size (closed loop at 1, 4, 8 streams, 48 tokens) and TTFT vs prompt length
    at one stream (raw prompts of about 50, 300 and 700 tokens)."""
    from rufus.client import agenerate
    from rufus.harness.loadgen import triton_stream

    out: dict[str, Any] = {"itl_ms": {}, "ttft_ms_by_prompt_tokens": {}}
    stream = triton_stream(url, "rufus_llm")
    for c in (1, 4, 8):
        r = await closed_loop(stream, SHOPPING_PROMPTS, c, max(2 * c, 4), 48, progress=False)
        out["itl_ms"][str(c)] = r["itl_p50_ms"]
        _print(f"calibration: {c} stream(s): ITL p50 {r['itl_p50_ms']:.1f} ms, "
               f"TTFT p50 {r['ttft_p50_ms']:.0f} ms")
    filler = "The customer compares tents, stoves, sleeping bags and lanterns for a trip. "
    for reps in (3, 20, 48):
        ttfts, ntok = [], 0
        for k in range(3):
            # a unique first line: vLLM's prefix cache must not serve any part of the prompt
            prompt = f"Order {random.random():.12f} {reps} {k}.\n" + filler * reps + "\nSummary:"
            t0 = time.monotonic()
            async for ch in agenerate(url, "rufus_llm", prompt,
                                      sampling={"max_tokens": 1, "temperature": 0.0},
                                      flags={"return_num_input_tokens": True}):
                ttfts.append(time.monotonic() - t0)
                ntok = int(ch.outputs["num_input_tokens"][0])
                break
        out["ttft_ms_by_prompt_tokens"][str(ntok)] = 1000 * sorted(ttfts)[1]
        _print(f"calibration: prompt {ntok} tokens: TTFT median {1000 * sorted(ttfts)[1]:.0f} ms")
    return out


async def _policy_phase(url: str, lengths: dict[str, int], concurrency: int,
                        requests: int) -> dict[str, Any]:
    stream = mixed_stream(url, lengths)
    return await closed_loop(stream, list(lengths), concurrency, requests, 0, progress=False)


def cmd_bench(a: argparse.Namespace) -> int:
    fleet = build_fleet(a, rr=True)
    stop_now = {"flag": False}

    def on_signal(*_: Any) -> None:
        stop_now["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "units": a.units,
                              "nnodes": a.nnodes, "engine_args": fleet.engine_args,
                              "concurrency": a.concurrency, "requests_per_phase": a.requests,
                              "short_tokens": a.short, "long_tokens": a.long,
                              "long_fraction": a.long_frac, "phases": []}
    try:
        fleet.start()
        _print(describe(fleet))
        took = fleet.wait_ready()
        _print(f"fleet ready in {took:.0f} s")
        lengths = mixed_workload(64, a.short, a.long, a.long_frac, a.seed)
        asyncio.run(_policy_phase(fleet.url, lengths, 2, 4))  # warm both units
        if a.calibrate:
            result["calibration"] = asyncio.run(_calibrate(fleet.units[0].url))
        order = ["lor", "rr", "rr", "lor"][: a.phases]
        for policy in order:
            url = fleet.url if policy == "lor" else fleet.rr_url
            backend = "units_lor" if policy == "lor" else "units_rr"
            before = fleet.served(backend)
            r = asyncio.run(_policy_phase(url, lengths, a.concurrency, a.requests))
            after = fleet.served(backend)
            r["policy"] = policy
            r["per_unit_streams"] = {k: after[k] - before.get(k, 0) for k in after}
            result["phases"].append(r)
            _print(f"{policy}: {r['output_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms "
                   f"p99 {r['ttft_p99_ms']:.0f} ms, errors {r['errors']}, per unit "
                   f"{r['per_unit_streams']}")
    finally:
        fleet.stop()
    result["summary"] = summarize_policies(result["phases"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    _print(f"results in {a.out}")
    return 0


def summarize_policies(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the phases of each policy (weighted by wall time) and compute the bar."""
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="up", choices=["up", "bench"])
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--nnodes", type=int, default=int(os.environ.get("RUFUS_FLEET_NNODES", 2)),
                    help="nodes per unit (leader + followers); 1 = single-node units")
    ap.add_argument("--fixed-ports", action="store_true",
                    help="documented ports (ingress 9000, RR 9001, stats 9100, unit i at 8100+10i)")
    ap.add_argument("--engine-args", default="", help="JSON engine-arg overrides for every unit")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-fleet"))
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
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return cmd_bench(a) if a.command == "bench" else cmd_up(a)


if __name__ == "__main__":
    raise SystemExit(main())
