"""Benchmark the query planner through Triton: Medusa vs autoregressive, same model, same run.

Tritonservers serve rufus_qp_medusa from the same model repository, each with a
``qp_backend`` override (env): ``medusa`` as configured (torch_medusa), ``ar`` the same
engine without the heads (torch_autoregressive: the speedup's baseline), and, unless
``--baselines`` says otherwise, vLLM's autoregressive and vLLM's Medusa paths (the serving
baseline and the alternative we measured against), in a second phase of the same run.
Same dtype and model everywhere. Within a phase every eval question is sent to each server
at batch size 1, one request at a time, rotating which goes first (the CPU cores are shared,
so interleaved runs give fair ratios). Prints and writes
(--json) latency p50/p99, tokens/s, mean accepted tokens per verification step (from the
servers' Medusa counters), speedups, JSON validity, intent accuracy and the losslessness
check (rufus/qp/tooling/lossless.py).

    .venv/bin/python scripts/bench_qp.py [--rounds 2] [--dtype bfloat16] [--baselines ...]
                                         [--json out.json]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rufus.harness.server import ROOT, TritonServer, free_port
from rufus.qp.client import PlanResponse, plan
from rufus.qp.plan import load_eval
from rufus.qp.tooling.lossless import LOGPROBS_K, NEAR_TIE_NATS, compare

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


BASELINES = {"vllm_ar": {"qp_backend": "autoregressive"},
             "vllm_medusa": {"qp_backend": "vllm_medusa"}}


def run_phase(kinds: dict[str, dict[str, object]], rows: list[dict], rounds: int, dtype: str,
              log_dir: Path, gap: float = 0.0
              ) -> tuple[dict[str, list[PlanResponse]], dict[str, dict], Any]:
    """Start one tritonserver per kind, warm up, send every question to each (rotating which
    goes first), read the Medusa counters; returns responses, spec stats and a re-query
    function for the AR reference's logprobs (valid until the servers stop)."""
    servers = {k: start(k, {"dtype": dtype, **v}, log_dir) for k, v in kinds.items()}
    try:
        for kind, srv in servers.items():
            say(f"waiting for {kind} server")
            srv.wait_ready(timeout=1200)
        urls = {k: f"127.0.0.1:{s.grpc_port}" for k, s in servers.items()}
        say(f"warm-up {list(servers)} (grammar compile, prefix cache)")
        for r in rows[:4]:
            for k in servers:
                plan(urls[k], r["question"])
        medusa_kinds = [k for k in servers if "medusa" in k]
        before = {k: spec_counters(servers[k]) for k in medusa_kinds}
        res: dict[str, list[PlanResponse]] = {k: [] for k in servers}
        names = list(servers)
        for rnd in range(rounds):
            for i, r in enumerate(rows):
                shift = (i + rnd) % len(names)
                for k in names[shift:] + names[:shift]:
                    time.sleep(gap)
                    res[k].append(plan(urls[k], r["question"]))
            say(f"{list(servers)}: round {rnd + 1}/{rounds} done")
        spec = {}
        for k in medusa_kinds:
            after = spec_counters(servers[k])
            d = {c: after[c] - before[k][c] for c in after}
            spec[k] = {"mean_tokens_per_step": 1 + d["num_accepted_tokens"] / d["num_drafts"]
                       if d["num_drafts"] else None,
                       "draft_acceptance_rate": d["num_accepted_tokens"] / d["num_draft_tokens"]
                       if d["num_draft_tokens"] else None}
        comps = []
        if "medusa" in res and "ar" in res:
            # losslessness on the first round (later rounds repeat the same questions)
            for r, ar, md in zip(rows, res["ar"], res["medusa"], strict=False):
                c = compare(ar.token_ids, md.token_ids, None)
                if not c.identical:
                    ar_lp = plan(urls["ar"], r["question"], sampling={"logprobs": LOGPROBS_K})
                    c = compare(ar_lp.token_ids, md.token_ids, ar_lp.logprobs)
                comps.append((r["question"], c))
    finally:
        for srv in servers.values():
            srv.stop()
    return res, spec, comps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the eval set")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=list(BASELINES),
                    help="vLLM paths measured in a second phase of the same run")
    ap.add_argument("--vllm-gap", type=float, default=1.2,
                    help="seconds idle before each request to a vLLM server (its worker "
                         "busy-polls for 1 s after a request)")
    ap.add_argument("--json", default="")
    ap.add_argument("--log-dir", default=str(ROOT / "build" / "qp"))
    a = ap.parse_args()
    log_dir = Path(a.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = load_eval(a.eval)
    configured = json.loads((ROOT / "model_repository" / MODEL / "1" / "model.json")
                            .read_text(encoding="utf-8")).get("qp_backend", "torch_medusa")
    same_engine_ar = "torch_autoregressive" if configured.startswith("torch") else "autoregressive"
    # Phase 1: the configured Medusa path and its own engine without heads, interleaved.
    # Phase 2: vLLM's paths. Separate phases, and a pause before each request in phase 2:
    # a vLLM CPU worker busy-polls a core for 1 s after each request (shm_broadcast), which
    # slowed whichever server ran next in the rotation (seen: one vLLM path 1.8x slower
    # depending on order).
    phases = [{"medusa": {}, "ar": {"qp_backend": same_engine_ar}}]
    extra = {b: BASELINES[b] for b in a.baselines
             if BASELINES[b]["qp_backend"] not in (configured, same_engine_ar)}
    if extra:
        phases.append(extra)
    say(f"medusa = {configured} (as configured), ar = {same_engine_ar}; phases "
        f"{[list(p) for p in phases]}; dtype {a.dtype}")
    res: dict[str, list[PlanResponse]] = {}
    spec: dict[str, dict] = {}
    comps: list = []
    for kinds in phases:
        vllm = any(str(v.get("qp_backend", configured)).startswith(("vllm", "auto"))
                   for v in kinds.values())
        r, sp, c = run_phase(kinds, rows, a.rounds, a.dtype, log_dir,
                             gap=a.vllm_gap if vllm else 0.0)
        res.update(r)
        spec.update(sp)
        comps = comps or c
    summ = {k: summary(v) for k, v in res.items()}
    md_s, ar_s = summ["medusa"], summ["ar"]
    n = len(rows)
    md_first = res["medusa"][:n]

    def speedup(base: str, over: str = "medusa") -> float | None:
        return summ[base]["mean_ms"] / summ[over]["mean_ms"] if base in summ and over in summ \
            else None

    out = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "dtype": a.dtype, "rounds": a.rounds, "questions": n,
        "backends": {"medusa": configured, "ar": same_engine_ar,
                     **{k: v["qp_backend"] for k, v in extra.items()}},
        "latency": summ,
        "speedup_mean_latency": speedup("ar"),
        "speedup_p50": ar_s["p50_ms"] / md_s["p50_ms"],
        "speedup_tokens_per_s": md_s["tokens_per_s"] / ar_s["tokens_per_s"],
        "speedup_vs_vllm_ar": speedup("vllm_ar"),
        "vllm_medusa_speedup_vs_vllm_ar": speedup("vllm_ar", "vllm_medusa"),
        "spec": spec,
        "mean_tokens_per_step": spec.get("medusa", {}).get("mean_tokens_per_step"),
        "json_valid": sum(not r.fallback for r in md_first) / n,
        "intent_accuracy": sum((not md.fallback) and md.plan["intent"] == r["intent"]
                               for r, md in zip(rows, md_first, strict=True)) / n,
        "identical_fraction": sum(c.identical for _, c in comps) / n,
        "lossless_ok_fraction": sum(c.ok for _, c in comps) / n,
        "near_tie_threshold_nats": NEAR_TIE_NATS,
        "differences": [{"question": q, "first_diff": c.first_diff, "gap": c.gap}
                        for q, c in comps if not c.identical],
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    for k, v in summ.items():
        say(f"{k:12s} p50 {v['p50_ms']:6.0f} ms  p99 {v['p99_ms']:6.0f} ms  "
            f"mean {v['mean_ms']:6.0f} ms  {v['tokens_per_s']:5.1f} tok/s")
    say(f"speedup {out['speedup_mean_latency']:.2f}x over {same_engine_ar} (mean latency); "
        f"vs vLLM autoregressive: {out['speedup_vs_vllm_ar']}; tokens/step "
        f"{out['mean_tokens_per_step']}; identical {out['identical_fraction']:.2f}, "
        f"lossless-ok {out['lossless_ok_fraction']:.2f}")


if __name__ == "__main__":
    main()
