"""Plan quality on the held-out set (data/qp/eval.jsonl): every field scored.

Each eval row has the expected ``intent``, ``query_type``, ``brand`` (or null),
``max_price`` (or null) and ``query_words`` (words the search queries together must
contain); ``history`` when it is a follow-up. Scores:

* ``json_valid``: the output parsed and validated against the plan schema (no fallback).
* ``intent``, ``query_type``: accuracy over all rows (a fallback plan counts as wrong
  unless the fallback's value happens to be right, as the customer would see it).
* ``brand``, ``max_price``: precision / recall / F1 over filter values: a predicted value is
  a true positive when it equals the expected one (brand case-insensitively, price within
  a cent); every other predicted value is a false positive (including one where none was
  expected), every expected value not predicted exactly is a false negative.
* ``query_words``: share of rows whose search queries contain every required word
  (case-insensitive substring, so "earbud" matches "earbuds").
* ``multi_turn_intent``: intent accuracy on the rows with history.
* ``ungrounded_filters``: predicted brand/max_price values not written in the question or
  history (rufus/qp/filter_grounding.py): the issue's "never emitted" rule, counted.

:class:`TorchPlanner` runs the served decoder in-process (the same TorchLlama + Medusa tree
+ xgrammar path as the Triton model, batch 1) so the eval takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.loadgen import pct_nearest as pct
from lab.qp.prompts import baseline_messages
from rufus.machine import precision
from rufus.qp.backends import served_tree
from rufus.qp.build import medusa_dir, qp_model_dir
from rufus.qp.filter_grounding import brand_grounded, context_text, ground_plan, price_grounded
from rufus.qp.plan import (
    SEED_FILE,
    load_eval,
    parse_plan,
    plan_schema,
    prompt_ids,
    render_prompt_ids,
    structured_outputs,
)

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Prediction:
    text: str
    plan: dict[str, Any]
    fallback: bool
    token_ids: list[int] = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0


def _prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f, 4),
            "tp": tp, "fp": fp, "fn": fn}


def _same(field_name: str, a: Any, b: Any) -> bool:
    if field_name == "brand":
        return isinstance(a, str) and isinstance(b, str) and a.strip().lower() == b.strip().lower()
    return isinstance(a, int | float) and isinstance(b, int | float) and abs(a - b) < 0.01


def score(rows: list[dict[str, Any]], preds: list[Prediction]) -> dict[str, Any]:
    """Per-field scores (see the module docstring) plus per-intent accuracy."""
    n = len(rows)
    out: dict[str, Any] = {"n": n}
    out["json_valid"] = round(sum(not p.fallback for p in preds) / n, 4)
    for key in ("intent", "query_type"):
        out[key] = round(sum(p.plan.get(key) == r[key] for r, p in zip(rows, preds, strict=True)) / n, 4)
    ungrounded = 0
    for key in ("brand", "max_price"):
        tp = fp = fn = 0
        for r, p in zip(rows, preds, strict=True):
            want, got = r.get(key), (p.plan.get("filters") or {}).get(key)
            if got is not None and _same(key, want, got):
                tp += 1
                continue
            fp += got is not None
            fn += want is not None
            text = context_text(r["question"], r.get("history"))
            if got is not None and not (brand_grounded(str(got), text) if key == "brand"
                                        else price_grounded(float(got), text, strict=False)):
                ungrounded += 1
        out[key] = _prf(tp, fp, fn)
    out["ungrounded_filters"] = ungrounded
    words_ok = 0
    for r, p in zip(rows, preds, strict=True):
        joined = " ".join(p.plan.get("search_queries") or []).lower()
        words_ok += all(w.lower() in joined for w in r.get("query_words", []))
    out["query_words"] = round(words_ok / n, 4)
    multi = [(r, p) for r, p in zip(rows, preds, strict=True) if r.get("history")]
    out["multi_turn_n"] = len(multi)
    out["multi_turn_intent"] = round(sum(p.plan.get("intent") == r["intent"] for r, p in multi)
                                     / max(len(multi), 1), 4)
    by: dict[str, list[bool]] = {}
    for r, p in zip(rows, preds, strict=True):
        by.setdefault(r["intent"], []).append(p.plan.get("intent") == r["intent"])
    out["intent_by_class"] = {k: round(sum(v) / len(v), 3) for k, v in sorted(by.items())}
    out["confusions"] = Counter(f"{r['intent']}->{p.plan.get('intent')}"
                                for r, p in zip(rows, preds, strict=True)
                                if p.plan.get("intent") != r["intent"]).most_common(8)
    return out


def grounded(rows: list[dict[str, Any]], preds: list[Prediction], strict: bool = True
             ) -> list[Prediction]:
    """The same predictions after the post-decode filter check (rufus/qp/filter_grounding.py)."""
    out = []
    for r, p in zip(rows, preds, strict=True):
        plan, _ = ground_plan(p.plan, r["question"], r.get("history"), strict)
        out.append(Prediction(p.text, plan, p.fallback, p.token_ids, p.seconds, p.steps))
    return out


def summary_line(s: dict[str, Any]) -> str:
    return (f"json {s['json_valid']:.3f} intent {s['intent']:.3f} query_type "
            f"{s['query_type']:.3f} brand F1 {s['brand']['f1']:.3f} max_price F1 "
            f"{s['max_price']['f1']:.3f} words {s['query_words']:.3f} multi-turn intent "
            f"{s['multi_turn_intent']:.3f} ungrounded {s['ungrounded_filters']}")


class TorchPlanner:
    """The served decoding path in-process: TorchLlama, optional Medusa tree, plan grammar."""

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16",
                 medusa_dir: str | Path | None = None, tree: list[list[int]] | None = None,
                 num_heads: int = 0, grammar: bool = True, threads: int = 0,
                 grammar_drafts: int = 0, lookup_drafts: int = 0, history_drafts: int = 0,
                 copy_fields: tuple[str, ...] = (), a8: bool = False) -> None:
        import torch
        from transformers import AutoTokenizer

        from rufus.qp.decoder.grammar import TokenText, compile_grammar, draft_encoder
        from rufus.qp.decoder.medusa_decode import Decoder, Tree
        from rufus.qp.decoder.torch_llama import MedusaHeads, TorchLlama

        if threads:
            torch.set_num_threads(threads)
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        model = TorchLlama(str(model_dir), dtype, 1024, a8=a8)
        heads = t = None
        if medusa_dir and tree:
            heads = MedusaHeads(str(medusa_dir), model.weights,
                                num_heads or max(map(len, tree)))
            t = Tree.from_paths(tree)
        eos = {int(self.tok.convert_tokens_to_ids("<|im_end|>")), int(self.tok.eos_token_id)}
        self.decoder = Decoder(model, heads, t, eos, grammar_drafts if grammar else 0,
                               lookup_drafts, history_drafts=history_drafts if grammar else 0)
        if self.decoder.history_drafts and medusa_dir:  # as the served engine does
            self.decoder.history.seed(self.tok, Path(medusa_dir) / SEED_FILE)
        self.encode = draft_encoder(self.tok)
        self.compiled = None
        self.copy_fields = tuple(copy_fields)
        self.token_text: Any = None
        if grammar:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self.tok, vocab_size=model.vocab_size)
            self.compiled = compile_grammar(xgr.GrammarCompiler(info), json.dumps(plan_schema()))
            if self.copy_fields or lookup_drafts or history_drafts:
                self.token_text = TokenText.of(self.compiled)

    def plan(self, question: str, history: list[dict[str, str]] | None = None,
             max_tokens: int = 96) -> Prediction:
        from rufus.qp.decoder.grammar import CopyConstraint, Grammar, WordDrafts

        grammar = None
        ids = render_prompt_ids(self.tok, question, history)
        if self.compiled is not None:
            copy = None
            if self.copy_fields:
                copy = CopyConstraint.for_prompt(self.copy_fields, self.tok, ids, self.token_text)
            grammar = Grammar(self.compiled, self.decoder.model.vocab_size, self.encode, copy)
            if self.token_text is not None and (self.decoder.lookup_drafts
                                                or self.decoder.history_drafts):
                grammar.words = WordDrafts.for_prompt(self.tok, ids, self.token_text,
                                                      self.encode)
        t0 = time.perf_counter()
        out: list[int] = []
        steps = 0
        for step in self.decoder.generate(ids, max_tokens, grammar):
            out += step.tokens
            steps += 1
        dt = time.perf_counter() - t0
        text = self.tok.decode(out, skip_special_tokens=True)
        res = parse_plan(text, question)
        return Prediction(text, res.plan, res.fallback, out, dt, steps)


def run(planner: TorchPlanner, rows: list[dict[str, Any]], say: Any = None) -> list[Prediction]:
    preds = []
    for i, r in enumerate(rows):
        preds.append(planner.plan(r["question"], r.get("history")))
        if say is not None and (i + 1) % 50 == 0:
            say(f"{i + 1}/{len(rows)} planned")
    return preds


def speed_planners(model_dir: str | Path, dtype: str, medusa: str | Path,
                   tree: list[list[int]], num_heads: int, threads: int,
                   copy_fields: tuple[str, ...], drafts: dict[str, int],
                   kinds: tuple[str, ...] = ("plain", "medusa", "served"), a8: bool = False,
                   ) -> dict[str, TorchPlanner]:
    """The decoders a speed comparison sets side by side, same model and precision: plain
    greedy decoding, the Medusa heads alone, and the served decoder (the heads plus
    grammar-forced and prompt-lookup ``drafts``). scripts/eval_qp.py ``--speed`` and
    scripts/profile_qp.py build them here, so the profile explains the ratio measured."""
    make = {
        "plain": lambda: TorchPlanner(model_dir, dtype, threads=threads,
                                      copy_fields=copy_fields, a8=a8),
        "medusa": lambda: TorchPlanner(model_dir, dtype, medusa, tree, num_heads,
                                       threads=threads, copy_fields=copy_fields, a8=a8),
        "served": lambda: TorchPlanner(model_dir, dtype, medusa, tree, num_heads,
                                       threads=threads, copy_fields=copy_fields, a8=a8,
                                       **drafts),
    }
    return {k: make[k]() for k in kinds}


def speed_compare(planners: dict[str, TorchPlanner], rows: list[dict[str, Any]],
                  say: Any = None, baseline: str = "plain") -> dict[str, Any]:
    """The same questions through every planner (``baseline`` is plain decoding), interleaved
    per question with the order rotating, in one process: on a shared machine only a ratio
    measured this way means anything. Per planner: mean/p50/p99 latency, its speedup over
    the baseline, tokens per forward pass, and the share of outputs token-identical to the
    baseline's (the losslessness check's first criterion)."""
    names = list(planners)
    lat: dict[str, list[float]] = {k: [] for k in names}
    steps = {k: 0 for k in names}
    tokens = {k: 0 for k in names}
    identical = {k: 0 for k in names}
    for i, r in enumerate(rows):
        order = names[i % len(names):] + names[:i % len(names)]
        out = {k: planners[k].plan(r["question"], r.get("history")) for k in order}
        for k in names:
            lat[k].append(out[k].seconds)
            steps[k] += out[k].steps
            tokens[k] += len(out[k].token_ids)
            identical[k] += out[k].token_ids == out[baseline].token_ids
        if say is not None and (i + 1) % 20 == 0:
            base = sum(lat[baseline])
            say(f"speed: {i + 1}/{len(rows)}, " + ", ".join(
                f"{k} {base / sum(lat[k]):.2f}x" for k in names if k != baseline))

    res: dict[str, Any] = {"n": len(rows), "baseline": baseline}
    for k in names:
        res[k] = {"speedup_mean_latency": round(sum(lat[baseline]) / sum(lat[k]), 3),
                  "mean_ms": round(sum(lat[k]) / len(rows) * 1e3, 1),
                  "p50_ms": round(pct(lat[k], 0.5) * 1e3, 1),
                  "p99_ms": round(pct(lat[k], 0.99) * 1e3, 1),
                  "tokens_per_step": round(tokens[k] / max(steps[k], 1), 3),
                  "identical": round(identical[k] / len(rows), 4)}
    return res


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


def int8_activations(a: argparse.Namespace, mj: dict[str, Any]) -> bool:
    """model.json's ``int8_activations`` (W8A8 layers with int8 weights), unless
    --int16-activations."""
    return bool(mj.get("int8_activations")) and not a.int16_activations


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
                           a8=int8_activations(a, mj), **drafts(a, mj))
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
                              drafts(a, mj), a8=int8_activations(a, mj))
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


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", default=str(ROOT / "data/qp/eval.jsonl"))
    ap.add_argument("--engine", choices=("torch", "vllm"), default="torch")
    ap.add_argument("--dtype", default="measured",
                    help="bfloat16 | float32 | int8 | measured (this machine's served choice, "
                         "rufus/machine/precision.py)")
    ap.add_argument("--model", default="", help="default: the planner (setup.sh qp)")
    ap.add_argument("--no-medusa", action="store_true", help="torch: plain greedy decoding")
    ap.add_argument("--no-grammar", action="store_true", help="torch: no schema grammar")
    ap.add_argument("--no-copy", action="store_true",
                    help="torch: brand not restricted to the customer's words (copy_fields)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--int16-activations", action="store_true",
                    help="torch, int8: int16 activations even where model.json says "
                         "int8_activations (the comparison)")
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
    a = ap.parse_args(argv)
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

