"""Offline quality check of the query planner: JSON validity rate and intent accuracy.

Runs vLLM in-process (no Triton) on the held-out eval set, for the prompt/decoding variants
compared in docs/architecture.md ("Query planner"):

    .venv/bin/python scripts/eval_qp.py --variants fewshot+grammar,fewshot,zeroshot
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rufus.qp.plan import load_eval, parse_plan, render_prompt_ids, structured_outputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--variants", default="finetuned+grammar,finetuned,fewshot+grammar,"
                    "fewshot,zeroshot+grammar,zeroshot")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model", default="", help="default: the planner (setup.sh qp)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default="", help="write per-question results (JSONL) here")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rufus.qp.tooling.build import qp_model_dir

    llm = LLM(model=a.model or str(qp_model_dir()), dtype=a.dtype, max_model_len=2048, seed=0,
              enable_prefix_caching=True, gpu_memory_utilization=0.3)
    tok = llm.get_tokenizer()
    rows = load_eval(a.eval)
    summary = {}
    details = []
    for variant in a.variants.split(","):
        style = variant.split("+")[0]
        grammar = variant.endswith("+grammar")
        sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens,
                            structured_outputs=structured_outputs() if grammar else None)
        prompts = [TokensPrompt(prompt_token_ids=render_prompt_ids(tok, r["question"], None, style))
                   for r in rows]
        t0 = time.monotonic()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        valid = correct = ntok = 0
        for r, o in zip(rows, outs, strict=True):
            text = o.outputs[0].text
            ntok += len(o.outputs[0].token_ids)
            res = parse_plan(text, r["question"])
            valid += not res.fallback
            ok = not res.fallback and res.plan["intent"] == r["intent"]
            correct += ok
            details.append({"variant": variant, "question": r["question"], "expected": r["intent"],
                            "text": text, "fallback": res.fallback, "error": res.error,
                            "correct": ok})
        n = len(rows)
        summary[variant] = {"n": n, "json_valid": round(valid / n, 3),
                            "intent_accuracy": round(correct / n, 3),
                            "mean_tokens": round(ntok / n, 1),
                            "seconds": round(time.monotonic() - t0, 1)}
        print(f"[eval_qp] {variant}: {summary[variant]}", flush=True)
    if a.out:
        Path(a.out).write_text("".join(json.dumps(d) + "\n" for d in details))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
