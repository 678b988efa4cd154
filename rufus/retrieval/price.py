"""Prices the customer states: the cap in "under $80", "below 50 euros", "under 1k", in US
dollars. Its own module because the planner's prompt, the fallback plan and the grounded search
all read the same caps, and a misread cap ("under 1k" as 1.0) hides every product."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Fixed, approximate rates (USD per unit, mid-2024), on purpose not live: a cap is a bound
# the customer gave in round numbers, and the note to the customer says "about".
USD_PER: dict[str, float] = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "CAD": 0.73, "AUD": 0.66,
                             "JPY": 0.0067, "INR": 0.012}
_CURRENCY_OF: dict[str, str] = {
    "$": "USD", "us$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "bucks": "USD",
    "€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR",
    "£": "GBP", "gbp": "GBP", "quid": "GBP", "pound sterling": "GBP", "pounds sterling": "GBP",
    "c$": "CAD", "cad": "CAD", "a$": "AUD", "aud": "AUD",
    "¥": "JPY", "jpy": "JPY", "yen": "JPY", "₹": "INR", "inr": "INR", "rupee": "INR", "rupees": "INR",
}
_PRE = r"us\$|c\$|a\$|[$€£¥₹]|usd|eur|gbp|cad|aud|jpy|inr"
# "pounds" alone is a weight here ("dumbbells under 50 pounds"), not GBP: see _UNIT.
_POST = (r"[$€£¥₹]|(?:us\s+)?dollars?\b|bucks\b|usd\b|euros?\b|eur\b|gbp\b|quid\b|"
         r"pounds?\s+sterling\b|cad\b|aud\b|yen\b|jpy\b|rupees?\b|inr\b")
_MENTION = re.compile(
    rf"(?<![\w.$€£¥₹])(?:(?P<pre>{_PRE})\s*)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<dec>[.,]\d+)?(?P<k>\s?k\b)?"
    rf"(?:\s*(?P<post>{_POST}))?")
# A cap cue right before the amount ("under", "less than", "budget of", "max") ...
_CUE_BEFORE = re.compile(
    r"(?:\b(?:under|below|beneath|less\s+than|lower\s+than|cheaper\s+than|no\s+more\s+than|"
    r"not\s+more\s+than|not\s+over|not\s+above|no\s+higher\s+than|up\s+to|upto|at\s+most|"
    r"max(?:imum)?(?:\s+price)?(?:\s+of)?|within|budget(?:\s+(?:is|of|at|under))?(?:\s+of)?|"
    r"budget\s*:|spend\s+at\s+most)"
    r"\s*(?:(?:about|around|roughly|approximately|like|just|only)\s+)?|<=?\s*|≤\s*)$")
# ... or right after it ("$1,200 max", "300 or less", "a $300 budget").
_CUE_AFTER = re.compile(r"^\s*(?:max(?:imum)?|tops|or\s+(?:less|under|below|lower|cheaper)|"
                        r"at\s+(?:the\s+)?most|budget|limit)\b")
# A number followed by a unit is a spec ("under 65 inch", "under 20 lb"), not a price.
_UNIT = re.compile(
    r"^\s*-?\s*(?:\"|''|'|(?:inch(?:es)?|in|ft|feet|foot|gb|tb|mb|mah|w|watts?|v|volts?|hz|lbs?|"
    r"pounds?|oz|qt|quarts?|l|liters?|litres?|ml|mm|cm|m|mp|pieces?|pcs?|pack|count|ct|cups?|"
    r"grams?|g|kg|kilos?|gigs?|gigabytes?|terabytes?|"
    r"person|people|players?|years?|yrs?|months?|weeks?|days?|hours?|hrs?|minutes?|mins?|"
    r"percent|degrees?|sq|x|series|gen|th|st|nd|rd)(?![a-z])|%)")


# ... and neither is a bare number a head count's cue comes before ("sleeps up to 4").
_COUNT_BEFORE = re.compile(r"\b(?:sleeps|seats|fits|holds|serves|carries|takes)\s+"
                           r"(?:up\s+to|upto|at\s+most|max(?:imum)?)\s*$")


# "a grand", "half a grand", "2 grand", "two grand": thousands of dollars said as slang
_GRAND_WORDS = {"a": 1.0, "one": 1.0, "two": 2.0, "three": 3.0, "four": 4.0, "five": 5.0,
                "half a": 0.5}
_GRAND = re.compile(r"\b(half\s+a|a|one|two|three|four|five|\d+(?:\.\d+)?)\s+grand\b(?!\s+pianos?)")
# "a hundred bucks", "two hundred dollars", "a couple hundred": hundreds said as words
_HUNDREDS = {"a": 1, "one": 1, "a couple": 2, "couple": 2, "two": 2, "three": 3, "four": 4,
             "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
_HUNDRED = re.compile(r"\b(a\s+couple|couple|a|one|two|three|four|five|six|seven|eight|nine)"
                      r"\s+hundred\b(?:\s+(?:dollars|bucks|usd))?")


def spoken_amounts(low: str) -> str:
    """``low`` (lower case) with slang amounts written as dollars: "under a grand" is
    "under 1000 dollars", "2 grand" "2000 dollars", "a hundred bucks" "100 dollars"."""
    def dollars(m: re.Match[str]) -> str:
        word = re.sub(r"\s+", " ", m.group(1))
        n = _GRAND_WORDS.get(word)
        amount = 1000 * (n if n is not None else float(word))
        return f"{amount:g} dollars"
    def hundreds(m: re.Match[str]) -> str:
        return f"{100 * _HUNDREDS[' '.join(m.group(1).split())]} dollars"
    return _HUNDRED.sub(hundreds, _GRAND.sub(dollars, low))


@dataclass(frozen=True)
class Price:
    """A price stated in text."""

    amount: float  # in the stated currency
    currency: str  # "USD", "EUR", "GBP", ...
    usd: float  # converted with USD_PER (the catalog is in USD)


def _currency(marker: str | None) -> str:
    """The currency a marker ("€", "quid") names; US dollars when none is written."""
    return _CURRENCY_OF.get(re.sub(r"\s+", " ", marker), "USD") if marker else "USD"


def parse_price_cap(text: str) -> Price | None:
    """The first price cap stated in ``text`` ("under $80", "below 50 dollars", "under 1k",
    "$1,200 max", "less than 1.5k", "budget of 300", "under €30"), or None. Only amounts
    with a cap cue count: "65 inch tv", "gts 23", "iphone 15", "size 10" are not caps, and
    neither is a cue before a spec ("under 65 inch", "under 20 pounds")."""
    low = spoken_amounts(text.lower().replace("\u2019", "'"))
    for m in _MENTION.finditer(low):
        pre, post = m.group("pre"), m.group("post")
        before, after = low[:m.start()], low[m.end():]
        if not (_CUE_BEFORE.search(before) or _CUE_AFTER.match(after)):
            continue
        if not (pre or post) and (_UNIT.match(after) or _COUNT_BEFORE.search(before)):
            continue
        # "1,200" is grouped thousands (matched first); "1,5k" and "9,99" a decimal comma
        amount = float(m.group("num").replace(",", "") + (m.group("dec") or "").replace(",", "."))
        if m.group("k"):
            amount *= 1000
        cur = _currency(pre) if pre else _currency(post)
        return Price(amount=amount, currency=cur, usd=round(amount * USD_PER[cur], 2))
    return None



def stated_max_price(plan_max: float | None, question: str) -> tuple[float | None, Price | None]:
    """The price cap to search with and the cap the question states (None: none stated). The
    cap the customer stated wins over the plan's ("under 1k" is 1000, not the plan's 1.0)."""
    cap = parse_price_cap(question)
    if cap is not None and (plan_max is None or abs(plan_max - cap.usd) > 0.005):
        return cap.usd, cap
    return plan_max, cap


def money(usd: float) -> str:
    """A price as the customer reads it: "$80", "$79.99"."""
    return f"${usd:,.0f}" if abs(usd - round(usd)) < 0.005 else f"${usd:,.2f}"
