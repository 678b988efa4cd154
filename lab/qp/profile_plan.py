"""Where a plan's time goes, behind scripts/profile_qp.py (why: its docstring): the planner's
passes and LM-head calls timed by wrapping its model, plain decoding and the served decoder
interleaved on the same questions."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

MODEL_DIR = ROOT / "model_repository" / "rufus_qp_medusa" / "1"


def timed(planner: Any, log: dict[str, list[tuple[int, float]]]) -> None:
    """Wrap ``planner``'s model so that every pass and LM-head call is logged (rows, s)."""
    model = planner.decoder.model
    forward_many, logits = model.forward_many, model.logits

    def fwd(segs: list[Any]) -> Any:
        t = time.perf_counter()
        out = forward_many(segs)
        log["forward"].append((sum(int(s.ids.shape[0]) for s in segs), time.perf_counter() - t))
        return out

    def head(hidden: Any) -> Any:
        t = time.perf_counter()
        out = logits(hidden)
        log["logits"].append((int(hidden.shape[0]), time.perf_counter() - t))
        return out

    model.forward_many, model.logits = fwd, head
    some = getattr(model.lm_head, "some", None)
    if some is not None:  # the few allowed tokens' logits (forced rows): LM head time too

        def head_some(hidden: Any, rows: Any, cols: Any) -> Any:
            t = time.perf_counter()
            out = some(hidden, rows, cols)
            log["logits_some"].append((len(set(rows.tolist())), time.perf_counter() - t))
            return out

        model.lm_head.some = head_some


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--questions", type=int, default=20, help="first N of data/qp/eval.jsonl")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--int16-activations", action="store_true",
                    help="int16 activations even where model.json says int8_activations")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    from lab.qp.evaluate import int8_activations, speed_planners
    from rufus.machine.cpu import describe
    from rufus.qp.backends import served_tree
    from rufus.qp.build import medusa_dir, qp_model_dir
    from rufus.qp.plan import load_eval

    mj = json.loads((MODEL_DIR / "model.json").read_text())
    model = qp_model_dir()
    tree = served_tree(mj, MODEL_DIR, str(model), a.dtype)
    planners = speed_planners(
        model, a.dtype, medusa_dir(), tree, int(mj["num_medusa_heads"]), a.threads,
        tuple(mj.get("copy_fields") or ()),
        {k: int(mj.get(k, 0))
         for k in ("grammar_drafts", "lookup_drafts", "history_drafts")},
        kinds=("plain", "served"),
        a8=int8_activations(a, mj))
    logs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for name, p in planners.items():
        p.plan("warm up")
        logs[name] = defaultdict(list)
        timed(p, logs[name])
    rows = load_eval(ROOT / "data" / "qp" / "eval.jsonl")[: a.questions]
    total = dict.fromkeys(planners, 0.0)
    tokens = dict.fromkeys(planners, 0)
    cpu = describe()
    print(f"[profile_qp] {cpu['cpu_key']}, {a.threads} threads, {a.dtype}, tree {tree}",
          flush=True)
    for i, r in enumerate(rows):
        names = list(planners)[i % 2:] + list(planners)[:i % 2]
        for name in names:
            pred = planners[name].plan(r["question"], r.get("history"))
            total[name] += pred.seconds
            tokens[name] += len(pred.token_ids)
    n = len(rows)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cpu": cpu, "threads": a.threads, "dtype": a.dtype, "tree": tree,
                           "questions": n}
    for name in planners:
        fw, lg = logs[name]["forward"], logs[name]["logits"] + logs[name]["logits_some"]
        by_rows: dict[int, list[float]] = defaultdict(list)
        for k, s in fw:
            by_rows[k].append(s)
        f_ms, l_ms = sum(s for _, s in fw) / n * 1e3, sum(s for _, s in lg) / n * 1e3
        res = {"ms_per_plan": total[name] / n * 1e3, "tokens_per_plan": tokens[name] / n,
               "passes_per_plan": len(fw) / n, "forward_ms": f_ms, "lm_head_ms": l_ms,
               "lm_head_rows_per_plan": sum(k for k, _ in logs[name]["logits"]) / n,
               "forced_rows_per_plan": sum(k for k, _ in logs[name]["logits_some"]) / n,
               "other_ms": total[name] / n * 1e3 - f_ms - l_ms,
               "pass_ms_by_rows": {k: {"passes": len(v), "median_ms":
                                       sorted(v)[len(v) // 2] * 1e3}
                                   for k, v in sorted(by_rows.items())}}
        out[name] = res
        print(f"[profile_qp] {name}: {res['ms_per_plan']:.1f} ms per plan, "
              f"{res['tokens_per_plan']:.1f} tokens in {res['passes_per_plan']:.1f} passes; "
              f"forward {f_ms:.1f} ms, LM head {l_ms:.1f} ms "
              f"({res['lm_head_rows_per_plan']:.1f} rows, {res['forced_rows_per_plan']:.1f} "
              f"forced rows with only their allowed tokens), rest {res['other_ms']:.1f} ms",
              flush=True)
        print("[profile_qp]   pass ms by rows (passes): " + ", ".join(
            f"{k}: {v['median_ms']:.1f} ({v['passes']})"
            for k, v in res["pass_ms_by_rows"].items()), flush=True)
    out["served_over_plain"] = total["plain"] / total["served"]
    print(f"[profile_qp] served over plain: {out['served_over_plain']:.2f}x", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1))

