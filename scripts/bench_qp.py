"""Benchmark the query planner through Triton: Medusa vs autoregressive, same model, same run.

Two tritonservers serve rufus_qp_medusa from the same model repository: one as configured
(Medusa), one with ``{"qp_backend": "autoregressive"}`` (env override), same dtype and
engine arguments otherwise. Every eval question is sent to both at batch size 1, one request
at a time, alternating which goes first (the 2 CPU cores are shared, so the ratio of
interleaved runs is what is reported). Prints and writes (--json) latency p50/p99, tokens/s,
mean accepted tokens per verification step (from the server's Medusa counters), speedup,
JSON validity, intent accuracy and the losslessness check (rufus/qp/lossless.py).

    .venv/bin/python scripts/bench_qp.py [--rounds 2] [--dtype bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rufus.qp.client import PlanResponse, plan
from rufus.qp.lossless import LOGPROBS_K, NEAR_TIE_NATS, compare
from rufus.qp.plan import load_eval
from rufus.server import ROOT, TritonServer, free_port

MODEL = "rufus_qp_medusa"
OVERRIDE = "RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS"


def say(msg: str) -> None:
    print(f"[bench_qp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start(kind: str, args: dict[str, object], log_dir: Path) -> TritonServer:
    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log_dir / f"tritonserver-qp-{kind}.log",
                       extra_env={OVERRIDE: json.dumps(args), "VLLM_CPU_KVCACHE_SPACE": "1"})
    return srv.start()


def spec_counters(srv: TritonServer) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        name = f"rufus_qp_spec_{key}_total"
        out[key] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{"))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summary(rs: list[PlanResponse]) -> dict[str, float]:
    lat = [r.latency for r in rs]
    toks = sum(len(r.token_ids) for r in rs)
    return {"n": len(rs), "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
            "mean_ms": statistics.mean(lat) * 1e3, "tokens_per_s": toks / sum(lat),
            "mean_tokens": toks / len(rs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the eval set")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--json", default="")
    ap.add_argument("--log-dir", default=str(ROOT / "build" / "qp"))
    a = ap.parse_args()
    log_dir = Path(a.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = load_eval(a.eval)
    servers = {"medusa": start("medusa", {"dtype": a.dtype}, log_dir),
               "ar": start("ar", {"dtype": a.dtype, "qp_backend": "autoregressive"}, log_dir)}
    try:
        for kind, srv in servers.items():
            say(f"waiting for {kind} server")
            srv.wait_ready(timeout=1200)
        urls = {k: f"127.0.0.1:{s.grpc_port}" for k, s in servers.items()}
        say("warm-up (grammar compile, prefix cache)")
        for r in rows[:4]:
            for k in servers:
                plan(urls[k], r["question"])
        before = spec_counters(servers["medusa"])
        res: dict[str, list[PlanResponse]] = {"medusa": [], "ar": []}
        pairs = []
        for rnd in range(a.rounds):
            for i, r in enumerate(rows):
                order = ["ar", "medusa"] if (i + rnd) % 2 == 0 else ["medusa", "ar"]
                got = {k: plan(urls[k], r["question"]) for k in order}
                for k in order:
                    res[k].append(got[k])
                pairs.append((r, got["ar"], got["medusa"]))
            say(f"round {rnd + 1}/{a.rounds} done")
        after = spec_counters(servers["medusa"])
        drafts = after["num_drafts"] - before["num_drafts"]
        accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
        proposed = after["num_draft_tokens"] - before["num_draft_tokens"]
        # losslessness on the first round (the second repeats the same questions)
        comps = []
        for r, ar, md in pairs[:len(rows)]:
            c = compare(ar.token_ids, md.token_ids, None)
            if not c.identical:
                ar_lp = plan(urls["ar"], r["question"], sampling={"logprobs": LOGPROBS_K})
                c = compare(ar_lp.token_ids, md.token_ids, ar_lp.logprobs)
            comps.append((r["question"], c))
    finally:
        for srv in servers.values():
            srv.stop()
    md_s, ar_s = summary(res["medusa"]), summary(res["ar"])
    n = len(rows)
    md_first = [md for _, _, md in pairs[:n]]
    out = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), {platform.platform()}",
        "dtype": a.dtype, "rounds": a.rounds, "questions": n,
        "medusa": md_s, "autoregressive": ar_s,
        "speedup_mean_latency": ar_s["mean_ms"] / md_s["mean_ms"],
        "speedup_p50": ar_s["p50_ms"] / md_s["p50_ms"],
        "speedup_tokens_per_s": md_s["tokens_per_s"] / ar_s["tokens_per_s"],
        "mean_tokens_per_step": 1 + accepted / drafts if drafts else None,
        "draft_acceptance_rate": accepted / proposed if proposed else None,
        "json_valid": sum(not r.fallback for r in md_first) / n,
        "intent_accuracy": sum((not md.fallback) and md.plan["intent"] == r["intent"]
                               for (r, _, md) in pairs[:n]) / n,
        "identical_fraction": sum(c.identical for _, c in comps) / n,
        "lossless_ok_fraction": sum(c.ok for _, c in comps) / n,
        "near_tie_threshold_nats": NEAR_TIE_NATS,
        "differences": [{"question": q, "first_diff": c.first_diff, "gap": c.gap}
                        for q, c in comps if not c.identical],
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    say(f"speedup {out['speedup_mean_latency']:.2f}x (mean latency), "
        f"p50 {md_s['p50_ms']:.0f} vs {ar_s['p50_ms']:.0f} ms, "
        f"p99 {md_s['p99_ms']:.0f} vs {ar_s['p99_ms']:.0f} ms, "
        f"tokens/step {out['mean_tokens_per_step']}, identical {out['identical_fraction']:.2f}")


if __name__ == "__main__":
    main()
