"""Open-loop goodput: requests per second answered within a latency SLO, per offered rate.

Seeded Poisson arrivals of the held-out single-turn product questions (data/qp/eval.jsonl),
each request started at its time however many are in flight; latency counted from the
scheduled time. How it is measured: rufus/harness/goodput.py. Against a running stack only
(it starts no server):

    .venv/bin/python scripts/bench_goodput.py --target assistant --url 127.0.0.1:8001
    .venv/bin/python scripts/bench_goodput.py --target planner --url 127.0.0.1:8001 --rates 1 2 4 8
    .venv/bin/python scripts/bench_goodput.py --target openai --url http://127.0.0.1:9000

Targets and the measured event (default SLO): assistant, rufus_assistant over gRPC, first
answer text (1.0 s); planner, rufus_qp_medusa over gRPC, the plan (0.3 s); openai, the
OpenAI frontend's streaming chat completions of rufus-assistant, the first content after the
product list (1.0 s; the list itself is reported as "cards").

Columns: offered rate, achieved arrivals/s, arrivals, completed, p50/p90/p99 latency (ms) of
the answered requests, share of ALL arrivals within the SLO (%), goodput (within-SLO
requests per second of the window), refused (retryable error before any response) and their
p99 latency, answered later than 2x the SLO, other errors (late included), the client's p99
schedule lag (ms: large means the client itself could not keep up), load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rufus.harness import goodput as gp  # noqa: E402

DEFAULT_URLS = {"assistant": "localhost:8001", "planner": "localhost:8001",
                "openai": "http://localhost:9000"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=sorted(gp.TARGETS), default="assistant")
    ap.add_argument("--url", default=None,
                    help="Triton gRPC host:port (assistant, planner; default localhost:8001) or "
                         "the OpenAI frontend's base URL (openai; default http://localhost:9000)")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1, 2, 3],
                    help="offered rates, requests/s, each run in turn")
    ap.add_argument("--duration", type=float, default=60.0, help="arrival window per rate (s)")
    ap.add_argument("--slo", type=float, default=None,
                    help="latency SLO in seconds (default: assistant 1.0, planner 0.3, openai 1.0)")
    ap.add_argument("--seed", type=int, default=0, help="arrivals and question order")
    ap.add_argument("--drain", type=float, default=gp.DRAIN_S,
                    help="seconds in-flight requests may finish after the window; then late")
    ap.add_argument("--gap", type=float, default=2.0,
                    help="idle seconds before each rate (vLLM's CPU worker busy-polls 1 s)")
    ap.add_argument("--warmup", type=int, default=2, help="requests one at a time first, not counted")
    ap.add_argument("--min-share", type=float, default=0.99,
                    help="share within the SLO that counts as meeting it (capacity)")
    ap.add_argument("--questions", default=str(gp.EVAL_PATH))
    ap.add_argument("--out", default=None, help="JSON results (default build/goodput-<target>.json)")
    a = ap.parse_args(argv)
    url = a.url or DEFAULT_URLS[a.target]
    out = Path(a.out or ROOT / "build" / f"goodput-{a.target}.json")
    target = gp.TARGETS[a.target](url)
    slo = target.default_slo_s if a.slo is None else a.slo
    questions = gp.load_questions(a.questions)
    cpu = gp.cpu_class()
    print(f"target {a.target} ({url}): event {target.event!r}, SLO {slo * 1000:.0f} ms, "
          f"{len(questions)} questions, seed {a.seed}, {a.duration:g} s per rate", flush=True)
    print(f"cpu: {' '.join(cpu['flags']) or 'none of avx512f/avx512_bf16/amx_bf16'}"
          + (f", ATEN_CPU_CAPABILITY={cpu['ATEN_CPU_CAPABILITY']}"
             if "ATEN_CPU_CAPABILITY" in cpu else "")
          + f", {cpu['cores']} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    print(gp.TABLE_HEADER + "  load", flush=True)

    def on_row(row: dict[str, Any]) -> None:
        row["load"] = os.getloadavg()[0]
        codes = ", ".join(f"{k} {v}" for k, v in row["error_codes"].items())
        # the other events (the product list of assistant and openai) after the columns
        events = [k.removesuffix("_p50_s") for k in row
                  if k.endswith("_p50_s") and not k.startswith("done")]
        others = "".join(f"  {e} p50/p99 {row[e + '_p50_s'] * 1000:.0f}/"
                         f"{row[e + '_p99_s'] * 1000:.0f}" for e in events)
        print(gp.format_row(row) + f" {row['load']:>5.1f}" + others
              + (f"  ({codes})" if codes else ""), flush=True)

    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    rows, raw = asyncio.run(gp.sweep(target, questions, a.rates, a.duration, slo_s=slo,
                                     seed=a.seed, drain_s=a.drain, gap_s=a.gap,
                                     warmup=a.warmup, on_row=on_row))
    cap = gp.capacity_at_slo(rows, a.min_share)
    print(f"capacity at SLO ({slo * 1000:.0f} ms for >= {a.min_share:.0%} of arrivals): "
          + (f"{cap:g} req/s" if cap is not None else f"below the lowest rate ({min(a.rates):g} req/s)"),
          flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "target": a.target, "url": url, "event": target.event, "slo_s": slo,
        "min_share": a.min_share, "capacity_at_slo": cap, "seed": a.seed,
        "duration_s": a.duration, "drain_s": a.drain, "rates": a.rates,
        "questions": a.questions, "n_questions": len(questions), "cpu": cpu,
        "started_utc": started, "ended_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "rows": [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                 for r in rows],
        "requests": {rate: [gp.result_dict(x) for x in res] for rate, res in raw.items()},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
