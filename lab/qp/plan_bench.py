"""Planner benchmark through Triton: Medusa vs autoregressive, same model, same run.

Tritonservers from the same model repository, each with a ``qp_backend`` override (env):
``medusa`` as configured (torch_medusa), ``ar`` the same engine without the heads
(torch_autoregressive: the speedup's baseline), ``medusa_heads`` the configured engine with
the heads but without its grammar-forced and prompt-lookup drafts, and, unless ``--baselines`` says otherwise,
vLLM's autoregressive and Medusa paths in a second phase of the same run. By default every
server also loads rufus_llm, as ``make serve`` does (``--qp-only`` to leave it out).

Batch 1 (concurrency 1): every eval question to each server, one request at a time,
rotating which server goes first (the cores are shared, so interleaving gives fair ratios);
latency p50/p99, tokens/s, Medusa tokens per step (servers' counters), JSON validity,
per-field quality and the losslessness check (lab/qp/lossless.py). Under load
(``--concurrency 4 8``): ``--questions`` questions sent by that many concurrent clients to
one server at a time; plans/s and p50/p99 per server. ``--solo``: only the configured
planner's server, so its latency is measured with no other server sharing the cores (the
issue's batch-1 SLA is for ``make serve``'s configuration, one server). Each client thread
keeps one connection per server. Figures go to docs/benchmarks.md.

Driven by scripts/bench_qp.py (the options are documented there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.loadgen import pct_nearest as pct
from lab.qp.evaluate import Prediction, score
from lab.qp.lossless import LOGPROBS_K, NEAR_TIE_NATS, compare
from rufus.launch.server import ROOT, TritonServer, free_port
from rufus.machine import cpu as machine
from rufus.qp.client import PlanResponse, plan
from rufus.qp.plan import load_eval

MODEL = "rufus_qp_medusa"
OVERRIDE = "RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS"
BASELINES = {"vllm_ar": {"qp_backend": "autoregressive"},
             "vllm_medusa": {"qp_backend": "vllm_medusa"}}


def say(msg: str) -> None:
    print(f"[bench_qp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start(kind: str, args: dict[str, object], log_dir: Path, with_llm: bool) -> TritonServer:
    models = ["rufus_llm", MODEL] if with_llm else [MODEL]
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
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


def summary(rs: list[PlanResponse]) -> dict[str, float]:
    lat = [r.latency for r in rs]
    toks = sum(len(r.token_ids) for r in rs)
    return {"n": len(rs), "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
            "mean_ms": statistics.mean(lat) * 1e3, "tokens_per_s": toks / sum(lat),
            "mean_tokens": toks / len(rs),
            # the tail's shape: is it long plans or slow passes (latency ms, plan tokens)
            "slowest": sorted(((round(r.latency * 1e3), len(r.token_ids)) for r in rs),
                              reverse=True)[:5]}


_clients = threading.local()


def ask(url: str, r: dict[str, Any], **kw: Any) -> PlanResponse:
    """One plan on this thread's connection to ``url`` (kept open, as the assistant does)."""
    import tritonclient.grpc as grpcclient

    conns = _clients.__dict__.setdefault("by_url", {})
    if url not in conns:
        conns[url] = grpcclient.InferenceServerClient(url)
    return plan(url, r["question"], history=r.get("history"), client=conns[url], **kw)


def under_load(url: str, rows: list[dict[str, Any]], concurrency: int) -> dict[str, float]:
    """``rows`` sent by ``concurrency`` clients, each starting its next plan when its last
    one finished; plans/s over the wall time, latency percentiles per plan."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as ex:
        rs = list(ex.map(lambda r: ask(url, r), rows))
    wall = time.monotonic() - t0
    s = summary(rs)
    return {"concurrency": concurrency, "n": len(rs), "plans_per_s": len(rs) / wall,
            "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "mean_ms": s["mean_ms"]}


def run_phase(kinds: dict[str, dict[str, object]], rows: list[dict], a: Any,
              log_dir: Path, gap: float) -> dict[str, Any]:
    """One tritonserver per kind; batch-1 interleaved pass, then the concurrency levels."""
    servers = {k: start(k, {"dtype": a.dtype, **v}, log_dir, not a.qp_only)
               for k, v in kinds.items()}
    out: dict[str, Any] = {"res": {}, "spec": {}, "comps": [], "load": {}}
    try:
        for kind, srv in servers.items():
            say(f"waiting for {kind} server")
            srv.wait_ready(timeout=1200)
        urls = {k: f"127.0.0.1:{s.grpc_port}" for k, s in servers.items()}
        say(f"warm-up {list(servers)} (grammar compile, prefix cache)")
        for r in rows[:4]:
            for k in servers:
                ask(urls[k], r)
        medusa_kinds = [k for k in servers if "medusa" in k]
        before = {k: spec_counters(servers[k]) for k in medusa_kinds}
        res: dict[str, list[PlanResponse]] = {k: [] for k in servers}
        names = list(servers)
        if 1 in a.concurrency:
            for rnd in range(a.rounds):
                for i, r in enumerate(rows):
                    shift = (i + rnd) % len(names)
                    for k in names[shift:] + names[:shift]:
                        time.sleep(gap)
                        res[k].append(ask(urls[k], r))
                    if (i + 1) % 50 == 0:
                        say(f"batch 1: {i + 1}/{len(rows)}")
                say(f"{names}: round {rnd + 1}/{a.rounds} done")
            for k in medusa_kinds:
                after = spec_counters(servers[k])
                d = {c: after[c] - before[k][c] for c in after}
                out["spec"][k] = {
                    "mean_tokens_per_step": 1 + d["num_accepted_tokens"] / d["num_drafts"]
                    if d["num_drafts"] else None,
                    "draft_acceptance_rate": d["num_accepted_tokens"] / d["num_draft_tokens"]
                    if d["num_draft_tokens"] else None}
            if "medusa" in res and "ar" in res:
                # losslessness on the first round (later rounds repeat the same questions)
                for r, ar, md in zip(rows, res["ar"], res["medusa"], strict=False):
                    c = compare(ar.token_ids, md.token_ids, None)
                    if not c.identical:
                        ar_lp = ask(urls["ar"], r, sampling={"logprobs": LOGPROBS_K})
                        c = compare(ar_lp.token_ids, md.token_ids, ar_lp.logprobs)
                    out["comps"].append((r["question"], c))
        out["res"] = res
        subset = rows[:a.questions]
        for level in [c for c in a.concurrency if c > 1]:
            order = names if level % 2 == 0 else names[::-1]
            for k in order:
                time.sleep(max(gap, 1.5))  # vLLM's worker busy-polls ~1 s after requests
                m = under_load(urls[k], subset, level)
                out["load"].setdefault(k, []).append(m)
                say(f"{k:12s} concurrency {level}: {m['plans_per_s']:.2f} plans/s, p50 "
                    f"{m['p50_ms']:.0f} ms, p99 {m['p99_ms']:.0f} ms")
    finally:
        for srv in servers.values():
            srv.stop()
    return out


def run(a: Any) -> dict[str, Any]:
    """The whole benchmark for the options of scripts/bench_qp.py; returns the result."""
    log_dir = Path(a.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = load_eval(a.eval)
    rows = rows[:a.limit] if a.limit else rows
    configured = json.loads((ROOT / "model_repository" / MODEL / "1" / "model.json")
                            .read_text(encoding="utf-8")).get("qp_backend", "torch_medusa")
    same_engine_ar = "torch_autoregressive" if configured.startswith("torch") else "autoregressive"
    # Phase 1: the configured Medusa path and its own engine without heads, interleaved.
    # Phase 2: vLLM's paths, with a pause before each request: a vLLM CPU worker busy-polls a
    # core for 1 s after each request, which slowed whichever server ran next.
    mine = dict(getattr(a, "medusa_args", None) or {})
    phases: list[dict[str, dict[str, Any]]] = [{"medusa": mine,
                                                "ar": {"qp_backend": same_engine_ar}}]
    if a.solo:
        phases = [{"medusa": mine}]
    elif configured == "torch_medusa":
        # the served decoder verifies grammar-forced and prompt-lookup drafts with the Medusa
        # tree; this server has the heads alone, so Medusa's own share stays measurable
        phases[0]["medusa_heads"] = {**mine, "grammar_drafts": 0, "lookup_drafts": 0,
                                     "history_drafts": 0}
    extra = {b: BASELINES[b] for b in a.baselines
             if BASELINES[b]["qp_backend"] not in (configured, same_engine_ar)}
    if extra and not a.solo:
        phases.append(extra)
    say(f"medusa = {configured} (as configured), ar = {same_engine_ar}; phases "
        f"{[list(p) for p in phases]}; dtype {a.dtype}; rufus_llm loaded: {not a.qp_only}")
    res: dict[str, list[PlanResponse]] = {}
    spec: dict[str, dict] = {}
    comps: list = []
    load: dict[str, list] = {}
    for kinds in phases:
        vllm = any(str(v.get("qp_backend", configured)).startswith(("vllm", "auto"))
                   for v in kinds.values())
        out = run_phase(kinds, rows, a, log_dir, gap=a.vllm_gap if vllm else 0.0)
        res.update(out["res"])
        spec.update(out["spec"])
        load.update(out["load"])
        comps = comps or out["comps"]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "cpu": machine.describe(),
        "load_average_at_end": os.getloadavg(),
        "dtype": a.dtype, "rounds": a.rounds, "questions": len(rows), "medusa_args": mine,
        "rufus_llm_loaded": not a.qp_only,
        "backends": {"medusa": configured, "ar": same_engine_ar,
                     **{k: v["qp_backend"] for k, v in extra.items()}},
        "under_load": load,
    }
    if a.solo and res.get("medusa"):
        result["latency"] = {"medusa": summary(res["medusa"])}
        result["spec"] = spec
        result["quality"] = score(rows, [Prediction(r.text, r.plan, r.fallback)
                                         for r in res["medusa"][:len(rows)]])
        v = result["latency"]["medusa"]
        say(f"solo {configured}: p50 {v['p50_ms']:.0f} ms  p99 {v['p99_ms']:.0f} ms  "
            f"mean {v['mean_ms']:.0f} ms  {v['tokens_per_s']:.1f} tok/s")
    elif res.get("medusa"):
        summ = {k: summary(v) for k, v in res.items() if v}
        md_s, ar_s = summ["medusa"], summ["ar"]
        n = len(rows)
        md_first = res["medusa"][:n]

        def speedup(base: str, over: str = "medusa") -> float | None:
            return summ[base]["mean_ms"] / summ[over]["mean_ms"] \
                if base in summ and over in summ else None

        quality = score(rows, [Prediction(r.text, r.plan, r.fallback) for r in md_first])
        result.update({
            "latency": summ,
            "speedup_mean_latency": speedup("ar"),
            "speedup_p50": ar_s["p50_ms"] / md_s["p50_ms"],
            "speedup_tokens_per_s": md_s["tokens_per_s"] / ar_s["tokens_per_s"],
            "speedup_vs_vllm_ar": speedup("vllm_ar"),
            "medusa_heads_only_speedup": speedup("ar", "medusa_heads"),
            "vllm_medusa_speedup_vs_vllm_ar": speedup("vllm_ar", "vllm_medusa"),
            "spec": spec,
            "mean_tokens_per_step": spec.get("medusa", {}).get("mean_tokens_per_step"),
            "quality": quality,
            "identical_fraction": sum(c.identical for _, c in comps) / max(len(comps), 1),
            "lossless_ok_fraction": sum(c.ok for _, c in comps) / max(len(comps), 1),
            "near_tie_threshold_nats": NEAR_TIE_NATS,
            "differences": [{"question": q, "first_diff": c.first_diff, "gap": c.gap}
                            for q, c in comps if not c.identical],
        })
        for k, v in summ.items():
            say(f"{k:12s} p50 {v['p50_ms']:6.0f} ms  p99 {v['p99_ms']:6.0f} ms  "
                f"mean {v['mean_ms']:6.0f} ms  {v['tokens_per_s']:5.1f} tok/s")
        say(f"speedup {result['speedup_mean_latency']:.2f}x over {same_engine_ar} (mean "
            f"latency); tokens/step {result['mean_tokens_per_step']}; identical "
            f"{result['identical_fraction']:.2f}, lossless-ok {result['lossless_ok_fraction']:.2f}")
        if result["medusa_heads_only_speedup"]:
            say(f"Medusa heads alone (no grammar/lookup drafts): "
                f"{result['medusa_heads_only_speedup']:.2f}x over {same_engine_ar}")
    return result




def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1, help="batch-1 passes over the eval set")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--questions", type=int, default=64,
                    help="questions per server and concurrency level > 1")
    ap.add_argument("--dtype", default="measured",
                    help="served dtype: measured (this machine's choice) or a concrete one")
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="first N eval questions only")
    ap.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=list(BASELINES),
                    help="vLLM paths measured in a second phase of the same run")
    ap.add_argument("--qp-only", action="store_true",
                    help="load only the planner (default: rufus_llm too, as make serve does)")
    ap.add_argument("--vllm-gap", type=float, default=1.2,
                    help="seconds idle before each request to a vLLM server (its worker "
                         "busy-polls for 1 s after a request)")
    ap.add_argument("--solo", action="store_true",
                    help="one server only, the configured planner (make serve's set): its "
                         "own latency, with no other server sharing the cores")
    ap.add_argument("--medusa-args", type=json.loads, default={},
                    help='JSON merged into the configured planner\'s model.json for this run, '
                         'e.g. \'{"torch_max_batch": 1}\'')
    ap.add_argument("--json", default="")
    ap.add_argument("--log-dir", default=str(ROOT / "build" / "qp"))
    a = ap.parse_args(argv)
    result = run(a)
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")

