"""What a query asks for, read from its words alone: its product phrase ("dog harness | for a
70 lb dog"), that phrase's product word and the generic words that name no product. Kept apart
from the catalog's vocabulary (rufus/retrieval/vocabulary.py) because none of it needs one."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rufus.retrieval.base import STOPWORDS, query_terms
from rufus.retrieval.spelling import stem1, words

# Where a query's product phrase ends: "dog harness | for a 70 lb dog", "baby monitor | with
# camera". Its last word is the product ("harness", "monitor").
_PHRASE_END = frozenset("""
for with without under below over above in on to of by from near like vs versus than that
which who thats at into between compatible fits fit up sleeps holds keeps works rated
""".split())
# Words that follow a number as its unit ("16 inch", "20000mah", "3 piece"): never the product.
_UNITS = frozenset("""
inch inches in ft feet foot lb lbs pound pounds oz ounce ounces qt quart quarts mah gb tb mb
mm cm w watt watts v volt volts hz piece pieces pc pcs pack count ct sq x year years yr old
month months degree degrees person people player players
""".split())
# Heads that name no product ("fishing gifts", "puppy essentials"): the word before them does.
GENERIC = frozenset("""
gift gifts idea ideas essential essentials stuff thing things accessory accessories gear product
products item items option options suggestion suggestions recommendation recommendations deal
deals set sets kit kits
""".split())
_N_IN_N = re.compile(r"\b\d+\s*(?:-\s*)?in\s*(?:-\s*)?\d+\b")  # "3 in 1", "2-in-1"


@dataclass(frozen=True)
class Ask:
    """What one query asks for: its product word (``head``, None when it names none) and a
    brand named in its product phrase (display name, or None)."""

    head: str | None
    brand: str | None


def product_phrase(query: str) -> list[str]:
    """The words of ``query``'s product phrase: up to the first word that ends it ("for",
    "with", ...), numbers and the units after them left out."""
    ws = words(_N_IN_N.sub(" ", query.lower()))
    out: list[str] = []
    after_number = skip = False
    for w in ws:
        if w in _PHRASE_END and out and not (after_number and w in _UNITS):
            break
        number = any(c.isdigit() for c in w)
        if w == "non":  # "pan non stick": "non stick" describes the pan
            skip = True
        elif skip:
            skip = False
        elif not number and not (after_number and w in _UNITS) and w not in STOPWORDS:
            out.append(w)
        after_number = number
    return out


def stems_of(text: str) -> set[str]:
    """The search terms of ``text`` as FTS5 stems them: the customer's own words."""
    return {stem1(w) for w in query_terms(text)}


def without_generic(query: str, ask: Ask) -> str:
    """``query`` without the generic words of its product phrase when it names a product
    ("camping essentials" -> "camping": "essentials" found Amazon Essentials T-shirts)."""
    if ask.head is None:
        return query
    phrase = set(product_phrase(query))
    kept = [w for w in query.split() if not (w.lower() in GENERIC and w.lower() in phrase)]
    return " ".join(kept) if kept else query
