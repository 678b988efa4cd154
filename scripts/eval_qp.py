"""Plan quality of the query planner on the held-out set: every field scored.

Scoring and the in-process decoder: rufus/qp/tooling/evaluate.py; the post-decode filter
check: rufus/qp/grounding.py. ``--engine torch`` (default) runs the served path (the torch
decoder, Medusa tree and plan grammar, batch 1) and prints the scores raw and after the
filter check; ``--engine vllm`` runs vLLM in-process for the prompt/decoding variants
compared in docs/architecture.md (un-tuned baselines: rufus/qp/tooling/prompts.py).

    .venv/bin/python scripts/eval_qp.py [--json build/qp/eval.json]
    .venv/bin/python scripts/eval_qp.py --engine vllm --variants finetuned+grammar,fewshot+grammar
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from rufus.qp.backends import served_tree  # noqa: E402
from rufus.qp.plan import load_eval, parse_plan, prompt_ids, structured_outputs  # noqa: E402
from rufus.qp.tooling.build import medusa_dir, qp_model_dir  # noqa: E402
from rufus.qp.tooling.evaluate import (  # noqa: E402
    Prediction,
    TorchPlanner,
    grounded,
    run,
    score,
    speed_compare,
    speed_planners,
    summary_line,
)
from rufus.qp.tooling.prompts import baseline_messages  # noqa: E402
from rufus.serving import precision  # noqa: E402

MODEL_DIR = ROOT / "model_repository" / "rufus_qp_medusa" / "1"


def say(msg: str) -> None:
    print(f"[eval_qp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def copy_fields(a: argparse.Namespace, mj: dict[str, Any]) -> tuple[str, ...]:
    """model.json's copied fields (the brand), unless --no-copy."""
    return () if a.no_copy else tuple(mj.get("copy_fields") or ())


def drafts(a: argparse.Namespace, mj: dict[str, Any]) -> dict[str, int]:
    """Grammar-forced and prompt-lookup drafts: model.json's, unless --no-drafts."""
    if a.no_drafts:
        return {"grammar_drafts": 0, "lookup_drafts": 0, "history_drafts": 0}
    return {k: int(mj.get(k, 0)) for k in ("grammar_drafts", "lookup_drafts", "history_drafts")}


def torch_eval(a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    tree = None
    heads = 0
    if not a.no_medusa:
        mj = json.loads((MODEL_DIR / "model.json").read_text())
        tree = served_tree(mj, MODEL_DIR, str(a.model or qp_model_dir()), a.dtype)
        heads = int(mj["num_medusa_heads"])
    mj = json.loads((MODEL_DIR / "model.json").read_text())
    planner = TorchPlanner(a.model or qp_model_dir(), a.dtype, None if a.no_medusa else
                           medusa_dir(), tree, heads, grammar=not a.no_grammar,
                           threads=a.threads, copy_fields=copy_fields(a, mj),
                           **drafts(a, mj))
    planner.plan("warm up")
    t0 = time.monotonic()
    preds = run(planner, rows, say)
    wall = time.monotonic() - t0
    out: dict[str, Any] = {"engine": "torch", "dtype": a.dtype, "medusa": not a.no_medusa,
                           "grammar": not a.no_grammar,
                           "copy_fields": list(planner.copy_fields), "seconds": round(wall, 1),
                           "mean_ms_per_plan": round(wall / len(rows) * 1e3, 1)}
    for name, pr in (("raw", preds), ("grounded", grounded(rows, preds)),
                     ("grounded_presence_only", grounded(rows, preds, strict=False))):
        out[name] = score(rows, pr)
        say(f"{name:24s} {summary_line(out[name])}")
    if a.out:
        Path(a.out).write_text("".join(json.dumps({
            "question": r["question"], "history": r.get("history"), "expected": {
                k: r.get(k) for k in ("intent", "query_type", "brand", "max_price",
                                      "query_words")},
            "text": p.text, "fallback": p.fallback, "ms": round(p.seconds * 1e3, 1)}) + "\n"
            for r, p in zip(rows, preds, strict=True)))
    return out


def speed_eval(a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Plain decoding, Medusa heads alone, and the served decoder (heads plus grammar-forced
    and prompt-lookup drafts), interleaved on the same questions."""
    mj = json.loads((MODEL_DIR / "model.json").read_text())
    model = a.model or qp_model_dir()
    tree = served_tree(mj, MODEL_DIR, str(model), a.dtype)
    heads = int(mj["num_medusa_heads"])
    cf = copy_fields(a, mj)
    planners = speed_planners(model, a.dtype, medusa_dir(), tree, heads, a.threads, cf,
                              drafts(a, mj))
    for p in planners.values():
        p.plan("warm up")
    res = speed_compare(planners, rows, say)
    for k in ("medusa", "served"):
        r = res[k]
        say(f"{k}: {r['speedup_mean_latency']:.2f}x over plain decoding ({res['n']} questions, "
            f"{r['tokens_per_step']} tokens/step, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"identical {r['identical']:.3f})")
    return {"engine": "torch", "dtype": a.dtype, "tree": tree, "threads": a.threads,
            "drafts": drafts(a, mj), "speed": res}


def vllm_eval(a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=a.model or str(qp_model_dir()), dtype=a.dtype, max_model_len=2048, seed=0,
              enable_prefix_caching=True, gpu_memory_utilization=0.3)
    tok = llm.get_tokenizer()
    out: dict[str, Any] = {"engine": "vllm", "dtype": a.dtype}
    for variant in a.variants.split(","):
        style = variant.split("+")[0]
        grammar = variant.endswith("+grammar")
        sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens,
                            structured_outputs=structured_outputs() if grammar else None)
        prompts = [TokensPrompt(prompt_token_ids=prompt_ids(
            tok, baseline_messages(r["question"], r.get("history"), style))) for r in rows]
        t0 = time.monotonic()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        preds = []
        for r, o in zip(rows, outs, strict=True):
            res = parse_plan(o.outputs[0].text, r["question"])
            preds.append(Prediction(o.outputs[0].text, res.plan, res.fallback,
                                    list(o.outputs[0].token_ids)))
        s = score(rows, preds)
        s["mean_tokens"] = round(sum(len(p.token_ids) for p in preds) / len(preds), 1)
        s["seconds"] = round(time.monotonic() - t0, 1)
        s["grounded"] = score(rows, grounded(rows, preds))
        s["grounded_presence_only"] = score(rows, grounded(rows, preds, strict=False))
        out[variant] = s
        say(f"{variant:24s} {summary_line(s)}")
        say(f"{variant + ' grounded':24s} {summary_line(s['grounded'])}")
        if a.out:
            with open(a.out, "a", encoding="utf-8") as f:
                for r, p in zip(rows, preds, strict=True):
                    f.write(json.dumps({"variant": variant, "question": r["question"],
                                        "history": r.get("history"), "text": p.text,
                                        "fallback": p.fallback}) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--engine", choices=("torch", "vllm"), default="torch")
    ap.add_argument("--dtype", default="measured",
                    help="bfloat16 | float32 | int8 | measured (this machine's served choice, "
                         "rufus/serving/precision.py)")
    ap.add_argument("--model", default="", help="default: the planner (setup.sh qp)")
    ap.add_argument("--no-medusa", action="store_true", help="torch: plain greedy decoding")
    ap.add_argument("--no-grammar", action="store_true", help="torch: no schema grammar")
    ap.add_argument("--no-copy", action="store_true",
                    help="torch: brand not restricted to the customer's words (copy_fields)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-drafts", action="store_true",
                    help="torch: no grammar-forced / prompt-lookup drafts (Medusa heads only)")
    ap.add_argument("--speed", type=int, default=0, metavar="N",
                    help="torch: instead of scoring, time N questions through the Medusa "
                         "and the plain decoder, interleaved (speedup, token identity)")
    ap.add_argument("--variants", default="finetuned+grammar,finetuned,fewshot+grammar,"
                    "fewshot,zeroshot+grammar,zeroshot", help="vllm: prompt[+grammar] list")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default="", help="write per-question outputs (JSONL) here")
    ap.add_argument("--json", default="", help="write the scores here")
    a = ap.parse_args()
    a.dtype = precision.resolve({"model": str(a.model or qp_model_dir()), "dtype": a.dtype},
                                "planner")["dtype"]
    rows = load_eval(a.eval)
    if a.speed:
        res = speed_eval(a, rows[::max(1, len(rows) // a.speed)][:a.speed])
    else:
        res = torch_eval(a, rows) if a.engine == "torch" else vllm_eval(a, rows)
    res.update({"eval": str(Path(a.eval).resolve().relative_to(ROOT)), "questions": len(rows),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
