"""The sentences the search writes for the customer (never model text): a brand or word
corrected, a currency converted, a filter or constraint relaxed, nothing matched. One place,
so each says the same thing wherever the search takes that step."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rufus.retrieval.base import Filters
from rufus.retrieval.constraints import Constraint
from rufus.retrieval.price import Price, money


def safe(text: str, limit: int = 40) -> str:
    """Plan or customer text shown in a system-written sentence: words only, short."""
    s = " ".join(re.sub(r"[^\w\s'&.-]", " ", text).split())
    return s if len(s) <= limit else s[:limit - 3].rstrip() + "..."


def brand_note(brand: str, wrote: str) -> str:
    """The plan's brand was a typo of the catalog's ``brand``."""
    return f'Showing {brand} products (you wrote "{safe(wrote)}").'


def currency_note(cap: Price) -> str:
    """A cap stated in another currency, searched in US dollars (the catalog's)."""
    return (f"Prices are in US dollars: {cap.amount:,g} {cap.currency} is about "
            f"{money(round(cap.usd))}.")


def typo_note(word: str, typo: str) -> str:
    """A query word corrected to the catalog's ``word``."""
    return f'Showing results for "{word}" (you wrote "{safe(typo)}").'


def nothing_matched_note(queries: Sequence[str], last: str) -> str:
    """The plan's queries found nothing; the question's own words did."""
    shown = ", ".join(f'"{safe(q)}"' for q in queries)
    return f'Nothing matched {shown}; showing results for "{safe(last, 60)}".'


def relax_note(f: Filters, relaxed: list[str]) -> str:
    """What relaxing ``relaxed`` (of the filters ``f``) means for the customer."""
    if not relaxed:
        return ""
    price = money(f.max_price) if f.max_price is not None else ""
    if relaxed == ["max_price"]:
        who = f"{f.brand} products" if f.brand else "results"
        return f"No {who} under {price}; showing {who} at any price."
    if relaxed == ["brand"]:
        under = f" under {price}" if price else ""
        return f"No {f.brand} products match your search{under}; showing other brands."
    return f"No {f.brand} products under {price}; showing results from all brands at any price."


def constraint_note(name: str, dropped: Sequence[Constraint], rest: bool) -> str:
    """What relaxing ``dropped`` means for the customer, ahead of the first pick (``name``:
    the product type's, or "products")."""
    said = " and ".join(f'"{safe(c.text)}"' for c in dropped)
    also = " with the rest of your search" if rest else ""
    if all(c.kind == "number" for c in dropped):
        return f"No {name} in the catalog match {said}{also}; showing the closest."
    return f"No {name} in the catalog match {said}{also}; showing {name} without it."


def without_filters(req: Filters, relaxed: Sequence[str]) -> str:
    """", even without the Sony brand filter and the $80 price cap" for the no-results reply."""
    without = []
    if "brand" in relaxed:
        without.append(f"the {req.brand} brand filter" if req.brand else "the brand filter")
    if "max_price" in relaxed:
        without.append(f"the {money(req.max_price)} price cap" if req.max_price is not None
                       else "the price cap")
    return f", even without {' and '.join(without)}" if without else ""
