"""The answer evaluation's logic, apart from its I/O (``scripts/eval_answers.py``): the
held-out question set, one scored record per answer, and the rates over a run.

Question set (data/assistant/answers_eval.jsonl): every single-turn product question of the
planner's held-out set (data/qp/eval.jsonl) plus :data:`HARD_CASES`, what customers write
(typos, budgets in other units, a brand with a category). ``expect_cards`` says whether the
catalog has products for the question: a question without cards when the catalog has them is
a retrieval miss the answer cannot make up for.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from rufus.assistant.answer_checks import CatalogFacts, check_answer
from rufus.retrieval.catalog import Product

PRODUCT_INTENTS = ("product_search", "product_comparison", "product_question", "recommendation")
FIELDS = ("question", "intent", "category", "brand", "max_price", "expect_cards", "source")

# What customers write that the planner's set lacks. category / brand / max_price are the
# truth the question means (max_price in USD: 30 euros is about $32); expect_cards is
# computed from the catalog (:func:`hard_rows`).
HARD_CASES: tuple[dict[str, Any], ...] = (
    {"question": "wireles mouse for laptop", "intent": "product_search",
     "category": "mouse", "brand": None, "max_price": None},
    {"question": "robot vaccum under 1k", "intent": "product_search",
     "category": "robot_vacuum", "brand": None, "max_price": 1000},
    {"question": "are the brooks adrenaline gts 24 good for flat feet?", "intent": "product_question",
     "category": "running_shoes", "brand": "Brooks", "max_price": None},
    {"question": "beginer yoga mat", "intent": "product_search",
     "category": "yoga_mat", "brand": None, "max_price": None},
    {"question": "noise cancelling headphons", "intent": "product_search",
     "category": "headphones", "brand": None, "max_price": None},
    {"question": "logitech mechanical keybord", "intent": "product_search",
     "category": "keyboard", "brand": "Logitech", "max_price": None},
    {"question": "cheap jbl bluetooth speakr", "intent": "product_search",
     "category": "bluetooth_speaker", "brand": "JBL", "max_price": None},
    {"question": "lenovo laptop for collage under $700", "intent": "product_search",
     "category": "laptop", "brand": "Lenovo", "max_price": 700},
    {"question": "tv under 1.5k", "intent": "product_search",
     "category": "tv", "brand": None, "max_price": 1500},
    {"question": "running shoes under $1,200", "intent": "product_search",
     "category": "running_shoes", "brand": None, "max_price": 1200},
    {"question": "earbuds under 30 euros", "intent": "product_search",
     "category": "earbuds", "brand": None, "max_price": 32},
    {"question": "bluetooth speaker under fifty dollars", "intent": "product_search",
     "category": "bluetooth_speaker", "brand": None, "max_price": 50},
    {"question": "sony wireless earbuds", "intent": "product_search",
     "category": "earbuds", "brand": "Sony", "max_price": None},
    {"question": "samsung galaxy watch under $300", "intent": "product_search",
     "category": "smartwatch", "brand": "Samsung", "max_price": 300},
    {"question": "is the keurig k-mini good for a dorm room?", "intent": "product_question",
     "category": "coffee_maker", "brand": "Keurig", "max_price": None},
    {"question": "dyson or shark cordless vacum for pet hair?", "intent": "product_comparison",
     "category": "vacuum", "brand": None, "max_price": None},
    {"question": "best hoka running shoes for a first marathon", "intent": "recommendation",
     "category": "running_shoes", "brand": "Hoka", "max_price": None},
    # a brand the catalog has, in a category it has, that it does not sell together
    {"question": "nike noise cancelling headphones", "intent": "product_search",
     "category": "headphones", "brand": "Nike", "max_price": None},
    {"question": "65 inch tv under $100", "intent": "product_search",
     "category": "tv", "brand": None, "max_price": 100},
)

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")


def stem(word: str) -> str:
    """Plural to singular, roughly ("shoes" -> "shoe", "batteries" -> "battery")."""
    w = word.lower().removesuffix("'s")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith("es") and w[:-2].endswith(("s", "x", "ch", "sh")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us")):
        return w[:-1]
    return w


def words(text: str) -> set[str]:
    """Stemmed words, hyphenated ones also by part ("wf-1000xm5", "wf", "1000xm5")."""
    out = set()
    for w in _WORD.findall(text.lower()):
        out.add(stem(w))
        out.update(stem(p) for p in re.split(r"[-']", w) if p)
    return out


@functools.lru_cache(maxsize=65536)
def _product_words(title: str, brand: str, category: str) -> frozenset[str]:
    """A product's words, once per product (the question set matches ~200 questions
    against the whole catalog)."""
    return frozenset(words(f"{title} {brand} {category.replace('_', ' ')}"))


def matching_products(products: Iterable[Product], query_words: Sequence[str] = (),
                      category: str | None = None, brand: str | None = None,
                      max_price: float | None = None) -> list[Product]:
    """Products that have every query word (title, category, brand), the brand and the
    category if given, and cost at most ``max_price``."""
    need = set().union(*(words(q) for q in query_words)) if query_words else set()
    out = []
    for p in products:
        if category is not None and p.category != category:
            continue
        if brand is not None and p.brand.lower() != brand.lower():
            continue
        if max_price is not None and p.price > max_price:
            continue
        if need and not need <= _product_words(p.title, p.brand, p.category):
            continue
        out.append(p)
    return out


def main_category(matches: Sequence[Product], share: float = 0.6) -> str | None:
    """The category most matches are in, when it holds ``share`` of them (else unclear)."""
    if not matches:
        return None
    cat, n = Counter(p.category for p in matches).most_common(1)[0]
    return cat if n >= share * len(matches) else None


# Product words a planner label leaves out (its query_words name only the compared brands):
# without them "matching one side" finds Dyson vacuums for a question about air purifiers.
LABEL_PRODUCT_WORDS = {
    "which is quieter, the dyson purifier or the levoit core 400s": ["purifier"],
}


def qp_rows(qp_eval: Iterable[dict[str, Any]], products: Sequence[Product]) -> list[dict[str, Any]]:
    """The planner's held-out single-turn product questions, with the catalog's answer: a
    product with every query word (a comparison: with every word of one compared side),
    the brand if one is named, within the price cap. The category is where most such
    products are (None when unclear)."""
    brands = {p.brand.lower(): p.brand for p in products}
    out = []
    for r in qp_eval:
        if r.get("intent") not in PRODUCT_INTENTS or r.get("history"):
            continue
        qw = list(r.get("query_words") or [])
        extra = LABEL_PRODUCT_WORDS.get(r["question"], [])
        sides = [[w, *extra] for w in qw] if r["intent"] == "product_comparison" else [qw + extra]
        found = [p for side in sides for p in matching_products(
            products, side, brand=r.get("brand"), max_price=r.get("max_price"))]
        loose = [p for side in sides for p in matching_products(products, side)] if qw else []
        brand = r.get("brand")
        out.append({"question": r["question"], "intent": r["intent"],
                    "category": main_category(found) or main_category(loose),
                    "brand": brands.get(brand.lower(), brand) if brand else None,
                    "max_price": r.get("max_price"), "expect_cards": bool(found),
                    "source": "qp_eval"})
    return out


def hard_rows(products: Sequence[Product]) -> list[dict[str, Any]]:
    """:data:`HARD_CASES`, with ``expect_cards`` from the catalog."""
    return [{**case, "expect_cards": bool(matching_products(
                products, category=case["category"], brand=case["brand"], max_price=case["max_price"])),
             "source": "hand"} for case in HARD_CASES]


# ------------------------------------------------------------------ scoring

def score(record: dict[str, Any], facts: CatalogFacts) -> dict[str, Any]:
    """``record`` (question, cards, answer, timings, ...) with its ``defects``."""
    d = check_answer(record.get("answer") or "", record.get("cards") or [], facts,
                     question=record.get("question") or "")
    tokens = (record.get("timings") or {}).get("answer_tokens")
    d.tokens = int(tokens) if isinstance(tokens, int | float) and tokens == tokens else None
    return {**record, "defects": d.to_json()}


def pct(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile, NaNs ignored (the project's benchmark convention)."""
    xs = sorted(x for x in values if x == x)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _first_token(r: dict[str, Any]) -> float:
    t = (r.get("timings") or {}).get("first_token_s", r.get("first_token_s"))
    return float(t) if isinstance(t, int | float) else float("nan")


def rates(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A run's rates over scored records. Defect rates are over answered questions (no
    error, some text); ``cites_shown_rate`` over those that got cards."""
    ok = [r for r in records if not r.get("error")]
    answered = [r for r in ok if (r.get("answer") or "").strip()]
    carded = [r for r in answered if r.get("cards")]
    missed = [r["question"] for r in ok if r.get("expect_cards") and not r.get("cards")]
    extra = [r["question"] for r in ok if r.get("expect_cards") is False and r.get("cards")]
    tokens = [float(r["defects"]["tokens"]) for r in answered if r["defects"].get("tokens") is not None]

    def rate(rs: Sequence[dict[str, Any]], key: str) -> float:
        return sum(bool(r["defects"][key]) for r in rs) / len(rs) if rs else float("nan")

    return {
        "questions": len(records), "errors": len(records) - len(ok), "answered": len(answered),
        "empty_answers": len(ok) - len(answered), "with_cards": len(carded),
        "ok_rate": rate(answered, "ok"),
        "loop_rate": rate(answered, "loop"),
        "invented_rate": rate(answered, "invented"),
        "contradiction_rate": rate(answered, "contradictions"),
        "cites_shown_rate": rate(carded, "cites_shown"),
        "no_cards_when_expected": {"count": len(missed), "questions": missed},
        "cards_when_not_expected": {"count": len(extra), "questions": extra},
        "answer_tokens_mean": sum(tokens) / len(tokens) if tokens else float("nan"),
        "answer_tokens_p50": pct(tokens, 0.5),
        "first_token_p50_s": pct((_first_token(r) for r in answered), 0.5),
        "first_token_p99_s": pct((_first_token(r) for r in answered), 0.99),
    }


def summary(report: dict[str, Any]) -> str:
    """The few lines a person reads after a run."""
    r = report["rates"]

    def pc(x: float) -> str:
        return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.0%}"

    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x * 1000:.0f} ms"

    cpu = report.get("cpu", {})
    rows = [
        ("questions", f"{r['questions']} ({r['errors']} errors, {r['answered']} answered, "
                      f"{r.get('empty_answers', 0)} empty, {r['with_cards']} with cards)"),
        ("ok (no defect)", pc(r["ok_rate"])),
        ("loop", pc(r["loop_rate"])),
        ("invented", pc(r["invented_rate"])),
        ("contradiction", pc(r["contradiction_rate"])),
        ("cites a shown card", pc(r["cites_shown_rate"])),
        ("no cards, expected", str(r["no_cards_when_expected"]["count"])),
        ("cards, not expected", str(r["cards_when_not_expected"]["count"])),
        ("answer tokens mean/p50", "-" if math.isnan(r["answer_tokens_mean"]) else
         f"{r['answer_tokens_mean']:.1f} / {r['answer_tokens_p50']:.0f}"),
        ("first token p50/p99", f"{ms(r['first_token_p50_s'])} / {ms(r['first_token_p99_s'])}"),
        ("cpu", f"{cpu.get('flags') or 'none of avx512f/avx512_bf16/amx_bf16'}"
                + (f", ATEN_CPU_CAPABILITY={cpu['aten_cpu_capability']}"
                   if cpu.get("aten_cpu_capability") else "")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
