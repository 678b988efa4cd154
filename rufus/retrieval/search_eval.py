"""Does search find what was asked? The checks behind scripts/eval_search.py.

Held-out questions (data/retrieval/heldout_search.jsonl, written before the search was
tuned) carry the product type the cards must have and, for constraint questions, what the
question states, as labels independent of the search's own parser:

- ``{"unit": "qt", "op": "=", "value": 6}``: some spec key ending in ``_qt`` is 6 (within 5%);
- ``{"feature": "waterproof"}``, ``{"attr": "panel", "value": "OLED"}``, ``{"size": "9"}``,
  ``{"gender": "Women's"}``, ``{"brand": "Ninja"}``, ``{"max_price": 100}``, ``{"min_price": 50}``.

Two checks, each per card: a card of another product type (:func:`wrong_type`), and a card
that misses a stated constraint although the catalog has products meeting them all
(:func:`misses`). Rates: :func:`rates`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rufus.retrieval.base import norm_brand
from rufus.retrieval.catalog import Product

WATERPROOF = frozenset({"IPX7", "IPX8", "IP67", "IP68"})
Card = dict[str, Any]


def _attrs(card: Card | Product) -> dict[str, Any]:
    return card.attributes if isinstance(card, Product) else card.get("attributes") or {}


def _get(card: Card | Product, field: str) -> Any:
    return getattr(card, field) if isinstance(card, Product) else card.get(field)


def expected(item: dict[str, Any]) -> set[str]:
    c = item["category"]
    return set(c) if isinstance(c, list) else {c}


def wrong_type(cards: Sequence[Card | Product], item: dict[str, Any]) -> list[int]:
    """Positions (0-based) of the cards whose category is not one the question asked for."""
    want = expected(item)
    return [i for i, c in enumerate(cards) if _get(c, "category") not in want]


def meets(card: Card | Product, label: dict[str, Any]) -> bool:
    """Whether ``card`` meets one constraint label (see the module docstring)."""
    a = _attrs(card)
    if "unit" in label:
        suffix = "_" + str(label["unit"])
        x = float(label["value"])
        for k, v in a.items():
            if not k.endswith(suffix) or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            op = label.get("op", "=")
            if (op == "<=" and v <= x) or (op == ">=" and v >= x) or (
                    op == "=" and abs(v - x) <= 0.05 * abs(x)):
                return True
        return False
    if "feature" in label:
        f = label["feature"]
        if f == "waterproof" and "waterproof" not in a:
            return str(a.get("water_rating", "")).upper() in WATERPROOF
        return a.get(f) is True
    if "attr" in label:
        have = str(a.get(label["attr"], "")).lower()
        want = str(label["value"]).lower()
        if label["attr"] == "color":
            return want in have.replace("gray", "grey").split() or want == have
        return have == want
    if "size" in label:
        want = str(label["size"]).upper()
        sizes = a.get("sizes")
        sizes = sizes if isinstance(sizes, list) else [str(a.get("size", ""))]
        return any(s.upper() == want or (re.fullmatch(r"\d+(?:\.5)?", want) is not None
                                          and s.upper().rstrip("CYK") == want
                                          and s.upper() != s.upper().rstrip("CYK"))
                   for s in sizes)
    if "gender" in label:
        g = str(a.get("gender", ""))
        return g == label["gender"] or (g == "Unisex" and label["gender"] != "Kids'")
    if "brand" in label:
        return norm_brand(str(_get(card, "brand"))) == norm_brand(str(label["brand"]))
    if "max_price" in label:
        return float(_get(card, "price")) <= float(label["max_price"])
    if "min_price" in label:
        return float(_get(card, "price")) >= float(label["min_price"])
    raise ValueError(f"unknown constraint label {label}")


def meetable(item: dict[str, Any], catalog: Iterable[Product]) -> bool:
    """Whether the catalog has a product of the asked type meeting every constraint."""
    want = expected(item)
    labels = item.get("constraints") or []
    return any(p.category in want and all(meets(p, c) for c in labels) for p in catalog)


def misses(cards: Sequence[Card | Product], item: dict[str, Any]) -> list[int]:
    """Positions of the cards that miss one of the question's constraints (or its type)."""
    want = expected(item)
    labels = item.get("constraints") or []
    return [i for i, c in enumerate(cards)
            if _get(c, "category") not in want or not all(meets(c, lab) for lab in labels)]


def score(item: dict[str, Any], cards: Sequence[Card | Product], catalog_can: bool) -> dict[str, Any]:
    wrong = wrong_type(cards, item)
    miss = misses(cards, item) if item["kind"] == "constraint" else []
    return {"q": item["q"], "kind": item["kind"], "cards": len(cards),
            "wrong_type": wrong, "misses": miss, "meetable": catalog_can,
            "titles": [str(_get(c, "title"))[:90] for c in cards]}


def _share(rows: Sequence[dict[str, Any]], ok: Callable[[dict[str, Any]], Any]) -> float:
    return sum(1 for r in rows if ok(r)) / len(rows) if rows else 0.0


def rates(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Product-type relevance (share of all cards of the asked type), constraints met by
    every card (share of the meetable constraint questions), and product questions whose
    cards are all of the asked type (share of product questions with cards)."""
    cards = sum(r["cards"] for r in rows)
    wrong = sum(len(r["wrong_type"]) for r in rows)
    cons = [r for r in rows if r["kind"] == "constraint" and r["meetable"]]
    prod = [r for r in rows if r["kind"] == "product"]
    return {
        "questions": len(rows), "cards": cards,
        "type_relevance": 1 - wrong / cards if cards else 0.0,
        "constraint_questions_meetable": len(cons),
        "constraints_met": _share(cons, lambda r: r["cards"] and not r["misses"]),
        "product_questions": len(prod),
        "product_type_right": _share(prod, lambda r: r["cards"] and not r["wrong_type"]),
        "no_cards": [r["q"] for r in rows if not r["cards"]],
    }
