"""The I/O of the assistant's answer-quality eval behind scripts/eval_answers.py: each
question through ``rufus_assistant`` over gRPC, the records kept and scored. The checks and
the rates are product code (rufus/assistant/answer_checks.py, rufus/assistant/answer_eval.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rufus.assistant.answer_checks import CatalogFacts
from rufus.assistant.answer_eval import FIELDS, hard_rows, qp_rows, rates, score, summary

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = ROOT / "data" / "assistant" / "answers_eval.jsonl"
CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


def cpu() -> dict[str, str]:
    """The CPU class the timings belong to (as ``grep -o -w -E 'avx512f|avx512_bf16|amx_bf16'
    /proc/cpuinfo | sort -u``), and ATEN_CPU_CAPABILITY when set."""
    try:
        words = set(Path("/proc/cpuinfo").read_text(errors="replace").split())
    except OSError:
        words = set()
    return {"flags": " ".join(f for f in sorted(CPU_FLAGS) if f in words),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "")}


def catalog_products() -> list[Any]:
    """The catalog the server answers from: RUFUS_CATALOG, else the default one."""
    from rufus.retrieval.catalog import load_catalog
    from rufus.retrieval.catalog_data import default_catalog

    src = os.environ.get("RUFUS_CATALOG")
    return load_catalog(src) if src else list(default_catalog())


async def ask(io: Any, question: str, timeout: float,
              history: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """One question through rufus_assistant: plan, cards, answer text, timings."""
    from rufus.client import RequestFailed, output_str

    rec: dict[str, Any] = {"plan": None, "fallback": None, "cards": [], "answer": "",
                           "finish_reason": "", "timings": {}, "error": ""}
    t0 = time.monotonic()
    parts: list[str] = []
    try:
        tensors: dict[str, Any] = {"question": question}
        if history:
            tensors["history"] = history
        async with contextlib.aclosing(io.stream("rufus_assistant", tensors,
                                                 timeout=timeout)) as s:
            async for outs in s:
                if "plan" in outs:
                    rec["plan"] = json.loads(output_str(outs, "plan") or "null")
                if "fallback" in outs:
                    rec["fallback"] = bool(outs["fallback"].reshape(-1)[0])
                if "products" in outs:
                    rec["cards"] = json.loads(output_str(outs, "products") or "[]")
                    rec["cards_s"] = time.monotonic() - t0
                text = output_str(outs, "text_output")
                if text:
                    rec.setdefault("first_token_s", time.monotonic() - t0)
                    parts.append(text)
                if "finish_reason" in outs:
                    rec["finish_reason"] = output_str(outs, "finish_reason")
                if "timings" in outs:
                    rec["timings"] = json.loads(output_str(outs, "timings") or "{}")
    except (RequestFailed, TimeoutError) as exc:
        rec["error"] = str(exc)[:300] or type(exc).__name__
    rec["answer"] = "".join(parts)
    rec["total_s"] = time.monotonic() - t0
    return rec


async def run(url: str, questions: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    from rufus.client import AsyncStreams

    io = AsyncStreams(url)
    out = []
    try:
        for i, q in enumerate(questions, start=1):
            rec = {k: q.get(k) for k in FIELDS} | await ask(io, q["question"], timeout)
            out.append(rec)
            print(f"[{i}/{len(questions)}] {len(rec['cards'])} cards, {len(rec['answer'])} chars"
                  f"{' ERROR ' + rec['error'] if rec['error'] else ''}: {q['question'][:60]}",
                  flush=True)
    finally:
        await io.close()
    return out


async def run_kinds(url: str, items: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Issue 58's held-out items (attribute, comparison, followup): each asked as a customer
    would, a follow-up's second turn with the first turn and its answer as history, and
    checked by rufus.assistant.card_eval."""
    from rufus.assistant import card_eval
    from rufus.client import AsyncStreams

    model_of = {p.url: p.model for p in catalog_products()}
    io = AsyncStreams(url)
    out = []
    try:
        for i, it in enumerate(items, start=1):
            rec: dict[str, Any] = dict(it)
            if it["kind"] == "followup":
                first = await ask(io, it["turns"][0], timeout)
                hist = [{"role": "user", "content": it["turns"][0]},
                        {"role": "assistant", "content": first["answer"]}]
                second = await ask(io, it["turns"][1], timeout, hist)
                rec |= {"first": first, **second}
                rec["problems"] = ([second["error"]] if second["error"] else card_eval.check_followup(
                    it, first["answer"], second["cards"], model_of))
            else:
                rec |= await ask(io, it["q"], timeout)
                check = (card_eval.check_attribute if it["kind"] == "attribute"
                         else card_eval.check_comparison)
                rec["problems"] = [rec["error"]] if rec["error"] else check(it, rec["answer"], rec["cards"])
            out.append(rec)
            print(f"[{i}/{len(items)}] {it['kind']}: {'ok' if not rec['problems'] else rec['problems']}"
                  f": {str(it.get('q') or it.get('turns'))[:70]}", flush=True)
    finally:
        await io.close()
    return out


def kinds_main(a: argparse.Namespace, items: list[dict[str, Any]]) -> int:
    from rufus.assistant import card_eval
    from rufus.assistant.answer_eval import pct

    t0 = time.time()
    records = asyncio.run(run_kinds(a.url, items, a.timeout))
    rates = card_eval.rates(records)
    firsts = [r["first_token_s"] for r in records if isinstance(r.get("first_token_s"), float)]
    report = {"url": a.url, "questions_file": str(a.questions), "cpu": cpu(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0)),
              "wall_s": time.time() - t0, "rates": rates,
              "first_token_p50_s": pct(firsts, 0.5), "first_token_p99_s": pct(firsts, 0.99),
              "records": records}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(_finite(report), indent=1), encoding="utf-8")
    for kind, r in rates.items():
        print(f"{kind:<11} {r['right']}/{r['questions']} right ({r['rate']:.1%})")
        for w in r["wrong"][:a.show]:
            print(f"    {w['problems']}: {str(w['q'])[:90]}")
    print(f"first text p50 / p99 (every turn asked): {report['first_token_p50_s'] * 1e3:.0f} / "
          f"{report['first_token_p99_s'] * 1e3:.0f} ms; cpu {report['cpu']['flags']}")
    print(f"report: {a.out}")
    return 0


def write_questions(path: Path) -> int:
    from rufus.qp.plan import load_eval

    products = catalog_products()
    rows = qp_rows(load_eval(ROOT / "data" / "qp" / "eval.jsonl"), products) + hard_rows(products)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: r[k] for k in FIELDS}) + "\n" for r in rows),
                    encoding="utf-8")
    print(f"{path}: {len(rows)} questions, {sum(r['expect_cards'] for r in rows)} expect cards")
    return 0


def _finite(obj: Any) -> Any:
    """NaN -> None, so the report is strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog="environment: RUFUS_CATALOG (the catalog the server answers from, default the "
               "default one); ATEN_CPU_CAPABILITY (recorded with the CPU class, e.g. avx2 "
               "for emulated AVX2)")
    ap.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    ap.add_argument("--questions", type=Path, default=QUESTIONS, help="question set (JSON Lines)")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "eval_answers.json",
                    help="the JSON report (default build/eval_answers.json)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per question")
    ap.add_argument("--offline-file", type=Path,
                    help="re-score the records of an earlier report (no server)")
    ap.add_argument("--show", type=int, default=10, help="held-out kinds: wrong answers to print")
    ap.add_argument("--write-questions", action="store_true",
                    help="rebuild --questions from data/qp/eval.jsonl and the hand-written cases")
    a = ap.parse_args(argv)
    if a.write_questions:
        return write_questions(a.questions)

    facts = CatalogFacts.from_products(catalog_products())
    t0 = time.time()
    if a.offline_file:
        old = json.loads(a.offline_file.read_text(encoding="utf-8"))
        records = old["records"][:a.limit] if a.limit else old["records"]
        meta = {**{k: v for k, v in old.items() if k not in ("records", "rates")},
                "rescored_from": str(a.offline_file)}
    else:
        questions = [json.loads(line) for line in a.questions.read_text(encoding="utf-8").splitlines()
                     if line.strip()]
        if a.limit:
            questions = questions[:a.limit]
        if questions and "kind" in questions[0]:  # issue 58's held-out kinds
            return kinds_main(a, questions)
        records = asyncio.run(run(a.url, questions, a.timeout))
        meta = {"url": a.url, "questions_file": str(a.questions), "cpu": cpu(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0)),
                "wall_s": time.time() - t0}
    scored = [score(r, facts) for r in records]
    report = {**meta, "rates": rates(scored), "records": scored}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(_finite(report), indent=1), encoding="utf-8")
    print(summary(report))
    missed = report["rates"]["no_cards_when_expected"]["questions"]
    for q in missed[:10]:
        print(f"  no cards, catalog has some: {q}")
    if len(missed) > 10:
        print(f"  ... and {len(missed) - 10} more (see the report)")
    print(f"report: {a.out}")
    return 1 if records and report["rates"]["errors"] == len(records) else 0

