"""Deterministic check after decoding: a filter the customer did not write is dropped.

Retrieval applies ``filters`` as hard constraints, so an invented brand or price cap hides
every right answer. The planner is a 135M model; it sometimes copies a brand from a model
name it has seen ("iphone 15" -> apple) or a number that is a size ("65 inch" -> 65). This
check keeps ``brand`` only when it is written in the question or the history (whole words,
case and punctuation ignored) and ``max_price`` only when the same amount is written there
and is not a spec (a number followed by a unit such as "inch", "v", "gb", or preceded by
"size", "sleeps", "order"). Whether it earns its place is measured on the eval set
(docs/benchmarks-history.md, "Query planner quality"): the plan may then differ from the raw
decoded text, which is why ``text_output`` stays the raw generation and losslessness is
checked on token ids, never on the grounded plan.
"""

from __future__ import annotations

import re

from rufus.qp.plan import Plan, PlanFilters

_NUM = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(\s*k\b)?")
# a number followed by one of these is a quantity or spec, not a price
_UNITS = (
    "inch", "inches", "in", "\"", "'", "ft", "feet", "foot", "v", "volt", "volts", "gb", "tb",
    "mb", "mah", "w", "watt", "watts", "hz", "lb", "lbs", "pound bag", "oz", "qt", "quart",
    "quarts", "l", "liter", "liters", "litre", "ml", "gallon", "gallons", "mm", "cm", "m",
    "p", "piece", "pieces", "pc", "pack", "count", "ct", "cup", "cups", "person", "people",
    "player", "players", "year", "years", "yr", "month", "months", "day", "days", "week",
    "weeks", "hour", "hours", "min", "minutes", "degree", "degrees", "sq", "x", "burner",
    "thread", "psi", "cu", "series", "gen", "th", "st", "nd", "rd", "%", "pro", "plus",
    "mini", "ultra", "fe", "lite", "speed", "step", "seater", "seat", "drawer", "tier", "rolls",
    "roll", "bar", "core", "pin", "port", "ports", "in 1", "am", "pm",
)
_BEFORE = ("size", "sleeps", "order", "#", "model", "series", "gen", "version", "ages", "age",
           "spf", "iphone", "galaxy", "pixel", "number")
_CURRENCY = re.compile(r"[$£€]\s*$")


def _norm(text: str) -> str:
    """Lower case, apostrophes dropped, other punctuation as spaces, padded for whole words."""
    t = text.lower().replace("'", "").replace("\u2019", "")
    t = re.sub(r"[^a-z0-9+&]+", " ", t)
    return f" {' '.join(t.split())} "


def context_text(question: str, history: list[dict[str, str]] | None = None) -> str:
    """What the customer (and the assistant) wrote: the question and every history turn."""
    return "\n".join([*(m.get("content", "") for m in history or []), question])


def brand_grounded(brand: str, text: str) -> bool:
    b = _norm(brand).strip()
    return bool(b) and f" {b} " in _norm(text)


def price_mentions(text: str, strict: bool = True) -> list[float]:
    """Amounts written in ``text`` ("$1,200", "50 bucks", "1.5k"); with ``strict`` the
    numbers that read as a spec ("65 inch", "20v", "size 10", "sleeps 4") are left out,
    unless a currency sign is right before them."""
    out = []
    low = text.lower()
    for m in _NUM.finditer(low):
        raw, kilo = m.group(1).replace(",", ""), m.group(2)
        try:
            value = float(raw) * (1000 if kilo else 1)
        except ValueError:
            continue
        if strict and not _CURRENCY.search(low[:m.start()]):
            after = low[m.end():m.end() + 12].lstrip(" -")
            before = low[max(0, m.start() - 10):m.start()].rstrip(" -").split()
            if kilo is None and any(after.startswith(u) and not after[len(u):len(u) + 1].isalpha()
                                    for u in _UNITS):
                continue
            if (before and before[-1].strip("#") in _BEFORE) or low[:m.start()].rstrip().endswith("#"):
                continue
        out.append(value)
    return out


def price_grounded(value: float, text: str, strict: bool = True) -> bool:
    return any(abs(value - v) < 1e-6 for v in price_mentions(text, strict))


def ground_plan(plan: Plan, question: str, history: list[dict[str, str]] | None = None,
                strict: bool = True) -> tuple[Plan, list[str]]:
    """The plan with ungrounded filters removed, and what was removed (for logs/responses)."""
    filters = plan.get("filters")
    if not isinstance(filters, dict) or not filters:
        return plan, []
    text = context_text(question, history)
    kept: PlanFilters = {**filters}
    dropped = []
    brand = kept.get("brand")
    # a brand only the assistant's earlier answer named ("just the 40 oz ones" after a list
    # led by YETI) is no brand the customer asked for
    said = context_text(question, [m for m in history or [] if m.get("role") != "assistant"])
    if isinstance(brand, str) and not brand_grounded(brand, said):
        dropped.append(f"brand={brand[:40]!r} not in the customer's words")
        del kept["brand"]
    price = kept.get("max_price")
    if isinstance(price, int | float) and not price_grounded(float(price), text, strict):
        dropped.append(f"max_price={price} not stated as a price")
        del kept["max_price"]
    if not dropped:
        return plan, []
    return {**plan, "filters": kept}, dropped
