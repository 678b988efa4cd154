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
  history (rufus/qp/grounding.py): the issue's "never emitted" rule, counted.

:class:`TorchPlanner` runs the served decoder in-process (the same TorchLlama + Medusa tree
+ xgrammar path as the Triton model, batch 1) so the eval takes about a minute.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rufus.harness.loadgen import pct_nearest as pct
from rufus.qp.grounding import brand_grounded, context_text, ground_plan, price_grounded
from rufus.qp.plan import SEED_FILE, parse_plan, plan_schema, render_prompt_ids


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
    """The same predictions after the post-decode filter check (rufus/qp/grounding.py)."""
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
                 copy_fields: tuple[str, ...] = ()) -> None:
        import torch
        from transformers import AutoTokenizer

        from rufus.qp.decoder.constraints import TokenText, compile_grammar, draft_encoder
        from rufus.qp.decoder.medusa_decode import Decoder, Tree
        from rufus.qp.decoder.torch_llama import MedusaHeads, TorchLlama

        if threads:
            torch.set_num_threads(threads)
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        model = TorchLlama(str(model_dir), dtype, 1024)
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
        from rufus.qp.decoder.constraints import CopyConstraint, Grammar, WordDrafts

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
                   kinds: tuple[str, ...] = ("plain", "medusa", "served"),
                   ) -> dict[str, TorchPlanner]:
    """The decoders a speed comparison sets side by side, same model and precision: plain
    greedy decoding, the Medusa heads alone, and the served decoder (the heads plus
    grammar-forced and prompt-lookup ``drafts``). scripts/eval_qp.py ``--speed`` and
    scripts/profile_qp.py build them here, so the profile explains the ratio measured."""
    make = {
        "plain": lambda: TorchPlanner(model_dir, dtype, threads=threads,
                                      copy_fields=copy_fields),
        "medusa": lambda: TorchPlanner(model_dir, dtype, medusa, tree, num_heads,
                                       threads=threads, copy_fields=copy_fields),
        "served": lambda: TorchPlanner(model_dir, dtype, medusa, tree, num_heads,
                                       threads=threads, copy_fields=copy_fields, **drafts),
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
