"""What the question states, as constraints on a card's typed attributes.

"a tent that sleeps 4", "air fryer 6 qt ninja", "women's running shoes size 8", "waterproof
hiking boots", "65 inch oled tv", "running shoes for flat feet": each stated size, capacity,
count, dimension, gender, feature, value or brand becomes a :class:`Constraint` checked
against the attributes of the product types the question names (rufus/retrieval/taxonomy.py).
Numbers find their attribute by the unit in the key's suffix (``capacity_qt``, ``screen_in``,
``capacity_people``): no per-category table, so a user's catalog that names its keys that way
gets the same (docs/catalog.md). A price floor or range ("over $100", "between $50 and $80")
is parsed here too; the cap ("under $80") is rufus.retrieval.price.parse_price_cap.

When the catalog cannot meet them all, the search drops as few as it can, the least
important kind first (:data:`RELAX_RANK`), and says which in a system-written note.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.catalog import AttrValue, Product
from rufus.retrieval.phrases import catalog_phrases
from rufus.retrieval.price import spoken_amounts
from rufus.retrieval.spelling import stem1
from rufus.retrieval.taxonomy import Taxonomy

Kind = Literal["number", "feature", "value", "colour", "size", "gender", "brand"]
# Which constraint the search drops first when the catalog cannot meet them all: a colour
# before a feature before a size ... before the brand the customer named.
RELAX_RANK: dict[str, int] = {"colour": 0, "feature": 1, "value": 2, "size": 3, "number": 4,
                              "gender": 5, "brand": 6}
EQUAL_WITHIN = 0.05  # "6 qt" is met by 5.8-6.3 qt; "65 inch" by a 64.5-inch TV

# unit suffix of a spec key -> how customers write it (longest first in the pattern)
UNITS: dict[str, tuple[str, ...]] = {
    "in": ("inches", "inch", "in", '"', "''"), "ft": ("feet", "foot", "ft"),
    "mm": ("millimeters", "millimetres", "mm"), "cm": ("centimeters", "centimetres", "cm"),
    "qt": ("quarts", "quart", "qts", "qt"), "oz": ("fl oz", "fluid ounces", "ounces", "ounce", "oz"),
    "l": ("liters", "litres", "liter", "litre", "l"), "cups": ("cups", "cup"),
    "lb": ("pounds", "pound", "lbs", "lb"), "g": ("grams", "gram", "g"),
    "hours": ("hours", "hour", "hrs", "hr", "h"), "minutes": ("minutes", "minute", "mins", "min"),
    "people": ("people", "persons", "person", "man"),
    "gb": ("gigabytes", "gigs", "gig", "gb"), "tb": ("terabytes", "tb"),
    "w": ("watts", "watt", "w"), "v": ("volts", "volt", "v"), "mah": ("mah",), "hz": ("hz",),
    "mp": ("megapixels", "mp"), "years": ("years", "year", "yrs", "yr"), "btu": ("btu",),
    "sqft": ("square feet", "sq ft", "sqft"), "cuft": ("cubic feet", "cu ft", "cu. ft.", "cuft"),
    "f": ("degrees f", "degrees", "degree", "°f", "°"), "mph": ("mph",), "hp": ("hp", "horsepower"),
    "lumens": ("lumens", "lumen"), "km": ("km", "kilometers"), "days": ("days", "day"),
    "weeks": ("weeks", "week"), "gallons": ("gallons", "gallon"), "percent": ("percent", "%"),
}
_ALIAS = sorted(((a, u) for u, al in UNITS.items() for a in al), key=lambda x: -len(x[0]))
_UNIT_OF = dict(_ALIAS)
_NUM_UNIT = re.compile(
    r"(?<![\w.$])(?P<num>\d+(?:\.\d+)?)\s*(?P<plus>\+)?\s*-?\s*(?P<unit>"
    + "|".join(re.escape(a) for a, _ in _ALIAS) + r")(?![a-z])")
# "3 burner", "1000 piece", "88 key": a count of things (keys ``<thing>_count``)
_NUM_COUNT = re.compile(r"(?<![\w.$])(?P<num>\d+)\s*-?\s*(?P<thing>[a-z]{3,12}?)(?:s|es)?\b")
_SLEEPS = re.compile(r"\b(?:sleeps|seats|fits|for|family\s+of|group\s+of)\s+"
                     r"(?:up\s+to\s+|(?P<least>at\s+least\s+|(?:a\s+)?minimum\s+(?:of\s+)?))?"
                     r"(?P<num>\d{1,2})"
                     r"(?:\s+(?:people|persons|adults|campers|kids))?\b")
_AT_MOST = re.compile(r"(?:under|below|less\s+than|up\s+to|at\s+most|no\s+more\s+than|max(?:imum)?|"
                      r"rated\s+(?:to|for)|down\s+to|good\s+to|"
                      r"lighter\s+than|smaller\s+than|shorter\s+than|<=?)\s*$")
_AT_LEAST = re.compile(r"(?:over|above|more\s+than|at\s+least|min(?:imum)?|longer\s+than|"
                       r"bigger\s+than|larger\s+than|>=?)\s*$")
# "rated up to 65 lb", "for a 70 lb dog", "i'm 250 lbs": a need a limit must cover
_LIMIT = re.compile(r"(?:up\s+to|rated\s+(?:to|for)?|holds?|supports?|capacity|for\s+(?:a|an|my)|"
                    r"for\s+ages?|ages?|year\s+old|years?\s+old|old|i'?m|i\s+am|i\s+weigh|"
                    r"weighs?|weighing|(?:he|she)\s+is|(?:he|she)'s)\s*(?:about\s+|around\s+|like\s+)?$")
_SIZE = re.compile(r"\bsize\s*:?\s*(?P<v>\d{1,2}(?:\.5)?\s*[cyk]?|xxs|xs|xxl|xl|x-large|small|"
                   r"medium|large|s|m|l)(?![\w.])")
_KIDS_SIZE = re.compile(r"(?<![\w.$])(?P<v>\d{1,2}(?:\.5)?c)(?![\w])")
_SIZE_WORDS = {"small": "S", "medium": "M", "large": "L", "x-large": "XL"}
# "in a medium", "in an xl", "in small": a letter size said without "size" (ending the phrase)
_IN_SIZE = re.compile(r"\bin\s+(?:an?\s+)?(?:(?:women'?s|men'?s|kids'?)\s+)?(?P<v>xxs|xs|xxl|xl|"
                      r"x-large|small|medium|large)(?=\s*(?:$|[,.?!;]|and\b|or\b|please\b|in\b))")
# "24 pack", "pack of 12", "36 count": how many of the thing itself (``<its noun>_count``)
_PACK = re.compile(r"(?<![\w.$])(?P<num>\d+)\s*-?\s*(?:pack|pk|ct|count)\b|"
                   r"\b(?:pack|box)\s+of\s+(?P<num2>\d+)\b")
# "spf 30": the thing named before its number (a ``<thing>_count`` key)
_NAMED_COUNT = re.compile(r"\b(?P<thing>[a-z]{2,12})\s*(?P<num>\d+)\b(?!\s*%)")
_GENDER = (
    ("Kids'", re.compile(r"\b(?:kids?|kid's|kids'|children'?s?|child'?s|boys?'?|girls?'?|"
                         r"toddlers?'?|youth|little\s+kids?|big\s+kids?)\b")),
    ("Women's", re.compile(r"\b(?:women'?s?|womens|woman'?s|ladies|lady'?s|female|for\s+her)\b")),
    ("Men's", re.compile(r"\b(?:men'?s?|mens|man's|male|for\s+him)\b")),
)
COLOURS = ("black", "white", "blue", "red", "green", "pink", "grey", "gray", "silver", "gold",
           "purple", "navy", "beige", "brown", "orange", "yellow", "teal", "tan", "olive")
# Feature keys -> the other ways customers say them (the key's own words always count).
FEATURE_WORDS: dict[str, tuple[str, ...]] = {
    "noise_cancelling": ("noise cancelling", "noise canceling", "noise cancellation", "anc"),
    "waterproof": ("waterproof", "water proof"),
    "dishwasher_safe": ("dishwasher safe", "dishwasher"),
    "latex_free": ("latex free", "no latex", "without latex"),
    "works_with_mac": ("works with mac", "mac compatible", "compatible with mac", "for mac"),
    "nonstick": ("nonstick", "non stick"),
    "cordless": ("cordless", "battery powered"),
    "wireless": ("wireless", "bluetooth"),
    "pet_hair": ("pet hair", "dog hair", "cat hair", "for pets", "pet"),
    "lumbar_support": ("lumbar support", "lumbar", "back support"),
    "hepa": ("hepa",), "polarized": ("polarized", "polarised"),
    "carry_on": ("carry on", "carryon"), "hardside": ("hardside", "hard shell", "hard sided"),
    "fragrance_free": ("fragrance free", "unscented"),
    "machine_washable": ("machine washable", "washable"),
    "weighted_keys": ("weighted keys", "weighted"), "brushless": ("brushless",),
    "standing": ("standing", "sit stand", "height adjustable"),
    "insulated": ("insulated",), "orthopedic": ("orthopedic", "orthopaedic"),
    "multipoint": ("multipoint", "multi point", "two devices", "2 devices"),
    "induction_compatible": ("induction",), "oven_safe": ("oven safe", "ovenproof"),
    "self_empty": ("self emptying", "empties itself", "self empty", "auto empty",
                   "empty themselves", "empties", "empty itself"),
    "wireless_charging": ("wireless charging", "charges wirelessly", "qi charging"),
    "variable_temperature": ("variable temperature", "temperature control", "adjustable temperature"),
    "rear_camera": ("rear camera", "front and rear", "rear cam", "backup camera"),
    "back_buttons": ("back buttons", "back paddles", "paddles"),
    "straw_lid": ("straw lid", "straw"), "self_cleaning": ("self cleaning", "cleans itself"),
    "pressure_sensor": ("pressure sensor", "brush too hard", "brushing too hard"),
    "viewing_window": ("viewing window", "window", "see the food", "see inside"),
    "rotating": ("rotating", "rotate", "rotates", "swivel", "swivels", "spins around"),
    "cooling": ("cooling", "sleep hot", "sleeps hot", "keeps me cool", "cool to the touch"),
}


def feature_words(key: str) -> tuple[str, ...]:
    """The other ways customers say ``key``: the table above, then data/catalog/phrases.jsonl."""
    return FEATURE_WORDS.get(key, ()) + catalog_phrases().get(key, ())


# Words of a feature key that the customer need not say ("works_with_homekit": "homekit").
_KEY_GLUE = frozenset({"works", "with", "has", "have", "is", "included", "built", "in", "mode",
                       "control", "compatible", "support", "available", "option"})
WATERPROOF_RATINGS = frozenset({"IPX7", "IPX8", "IP67", "IP68"})
# Needs that name a value: "running shoes for flat feet" want a stability shoe.
USES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"\b(?:flat\s+feet|flat\s+foot|flat\s+footed|over\s*pronat\w*|low\s+arches?|"
                r"stability)\b"), "support", "stability"),
    (re.compile(r"\b(?:trail|trails|off\s+road)\b"), "terrain", "trail"),
)
_WET = re.compile(r"\b(?:for\s+the\s+pool|in\s+the\s+pool|swimming|in\s+the\s+shower|for\s+the\s+shower)\b")
_NOT_VALUES = frozenset({"standard", "regular", "other", "none", "yes", "no", "classic", "original",
                         "n/a", "unisex", "men's", "women's", "kids'"})


def _norm(text: str) -> str:
    t = text.lower().replace("\u2019", "'").replace("-", " ").replace("_", " ")
    t = t.replace("canceling", "cancelling").replace("shut off", "shutoff")
    return " " + " ".join(re.findall(r"[a-z0-9.'+]+|\"", t)) + " "


def _compact(text: str) -> str:
    """Letters and digits only ("Wi-Fi 6" and "wifi 6" are "wifi6")."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _stem(w: str) -> str:
    """Porter step 1 and a final "e" ("charge" and "charging" are one word here)."""
    return stem1(w).removesuffix("e")


def _has(q: str, phrase: str) -> bool:
    p = _norm(phrase).strip()
    return bool(p) and f" {p} " in q and f" not {p} " not in q and f" non {p} " not in q


@dataclass(frozen=True)
class Constraint:
    """One thing the question states. ``keys``: the attributes it is checked against (a
    number may have several: any one meets it); ``text``: the customer's words for it."""

    kind: Kind
    keys: tuple[str, ...]
    value: float | str | tuple[str, ...]
    op: Literal["=", ">=", "<="] = "="
    text: str = ""

    def met(self, p: Product) -> bool:
        a = p.attributes
        if self.kind == "brand":
            return norm_brand(p.brand) in {norm_brand(b) for b in self.value}  # type: ignore[union-attr]
        if self.kind == "number":
            x = float(self.value)  # type: ignore[arg-type]
            return any(_cmp(a.get(k), x, _limit_op(k, self.op)) for k in self.keys)
        if self.kind == "feature":
            if self.keys == ("water_rating",):
                return str(a.get("water_rating", "")).upper() in WATERPROOF_RATINGS
            return a.get(self.keys[0]) is True
        if self.kind == "size":
            return any(_size_eq(s, str(self.value)) for k in self.keys for s in _as_list(a.get(k)))
        if self.kind == "gender":
            g = str(a.get("gender", ""))
            return g == self.value or (g == "Unisex" and self.value != "Kids'")
        if self.kind == "colour":
            c = str(a.get("color", "")).lower().replace("gray", "grey")
            return str(self.value) in c.split() or str(self.value) == c
        return str(a.get(self.keys[0], "")).lower() == str(self.value).lower()

    def distance(self, p: Product) -> float:
        """How far ``p`` is from a number it misses (0 when met): nearest first."""
        if self.kind != "number":
            return 0.0 if self.met(p) else 1.0
        vs = [v for k in self.keys if isinstance(v := p.attributes.get(k), int | float)
              and not isinstance(v, bool)]
        return min((abs(float(v) - float(self.value)) for v in vs), default=float("inf"))  # type: ignore[arg-type]


def _limit_op(key: str, op: str) -> str:
    """A limit meets a need on its side of it: a ``max_weight_lb`` of 80 holds a 65 lb
    child, a ``min_age_years`` of 6 suits an 8-year-old."""
    if key.startswith("max_") and op in ("=", "<="):
        return ">="
    if key.startswith("min_") and op in ("=", ">="):
        return "<="
    return op


def _cmp(v: AttrValue | None, x: float, op: str) -> bool:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    if op == "<=":
        return v <= x * (1 + 1e-9)
    if op == ">=":
        return v >= x * (1 - 1e-9)
    return abs(v - x) <= EQUAL_WITHIN * abs(x) + 1e-9


def _as_list(v: AttrValue | None) -> list[str]:
    if isinstance(v, list):
        return v
    return [str(v)] if isinstance(v, str) else []


def _size_eq(have: str, want: str) -> bool:
    h, w = have.upper().replace(" ", ""), want.upper().replace(" ", "")
    if h == w:
        return True
    # kids' sizes are often written "13C" / "2Y": "size 13" means the child's 13
    return bool(re.fullmatch(r"\d+(?:\.5)?", w)) and h.rstrip("CYK") == w and h != h.rstrip("CYK")


_MORE_AFTER = re.compile(r"^\s*(?:or\s+(?:more|higher|longer|bigger|larger|above|over)|"
                         r"and\s+(?:up|above|over)|plus)\b")
_LESS_AFTER = re.compile(r"^\s*(?:or\s+(?:less|lower|under|smaller|lighter|below)|max(?:imum)?|"
                         r"at\s+most|tops)\b")


def _op(before: str, plus: bool, after: str = "") -> Literal["=", ">=", "<="]:
    if plus or _AT_LEAST.search(before) or _MORE_AFTER.match(after):
        return ">="
    return "<=" if _AT_MOST.search(before) or _LESS_AFTER.match(after) else "="


def _keys_with(tax: Taxonomy, cats: Sequence[str], suffix: str) -> tuple[str, ...]:
    out = []
    for c in cats:
        for k, t in tax.attr_types.get(c, {}).items():
            if t == "number" and k.endswith("_" + suffix) and k not in out:
                out.append(k)
    return tuple(out)


def _at_word(q: str, compact: str, most: int = 4) -> bool:
    """``compact`` (:func:`_compact`) starts at one of ``q``'s words, up to ``most`` of them
    run together: "wi fi 6" holds "wifi6", "allday" "all"; "sunglasses" holds no "glass"."""
    ws = [w for w in (_compact(x) for x in q.split()) if w]
    return any("".join(ws[i:i + most]).startswith(compact) for i in range(len(ws)))


def _value_said(vals: Iterable[str], q: str, q_compact: str) -> str | None:
    """The spec value ``q`` says, the longest first: as words before run together ("dry"
    in "really dry skin", not "all" in "really"), ties in name order, so that the answer
    never depends on a set's order."""
    ok = [v for v in sorted(vals, key=lambda v: (-len(v), v))
          if len(v) >= 2 and v.lower() not in STOPWORDS and v.lower() not in _NOT_VALUES]
    return (next((v for v in ok if _has(q, v)), None)
            or next((v for v in ok if _compact(v) in q_compact and _at_word(q, _compact(v))), None))


def _shade(q: str, cats: Sequence[str], tax: Taxonomy) -> str | None:
    """A colour of these types' own listings that :data:`COLOURS` lacks, said in ``q``: a
    listing's whole colour ("matte tortoise"), else a word of two colours at least
    ("tortoise" of "Matte Tortoise" and "Tortoise on Gold"; one listing's fancy name, "Nice
    Vice Grip", names no colour by a word of it)."""
    counts: Counter[str] = Counter()
    whole: set[str] = set()
    for c in cats:
        for v in tax.values.get(c, {}).get("color", ()):
            counts.update(set(v.lower().split()))
            whole.add(v.lower())
    said = [v for v in sorted(whole, key=lambda v: (-len(v), v)) if " " in v and _has(q, v)]
    return said[0] if said else next((w for w, n in sorted(counts.items()) if n >= 2 and len(w) >= 4
                                      and w.isalpha() and w not in STOPWORDS and _has(q, w)), None)


def parse(question: str, cats: Sequence[str], tax: Taxonomy,
          brands: Sequence[str] = ()) -> list[Constraint]:
    """The constraints ``question`` states for the product types ``cats`` (only those their
    attributes can check). ``brands``: catalog brands the question names (display names)."""
    if not cats:
        return []
    low = question.lower().replace("\u2019", "'")
    q = _norm(question)
    types: dict[str, str] = {}
    for c in cats:
        for k, t in tax.attr_types.get(c, {}).items():
            types.setdefault(k, t)
    out = _numbers(low, cats, tax, types)
    out += _sizes(low, types)
    if "gender" in types:
        for g, rx in _GENDER:
            if (m := rx.search(low)) is not None:
                out.append(Constraint("gender", ("gender",), g, "=", m.group(0)))
                break
    out += _features(q, low, types)
    for rx, key, value in USES:
        if key in types and (m := rx.search(low)) is not None:
            out.append(Constraint("value", (key,), value, "=", m.group(0)))
    out += _values(question, q, cats, tax, {c.keys[0] for c in out if c.kind == "value"})
    if "color" in types:
        col = next((c for c in COLOURS if _has(q, c)), None) or _shade(q, cats, tax)
        if col:
            out.append(Constraint("colour", ("color",), col.replace("gray", "grey"), "=", col))
    if brands:
        out.append(Constraint("brand", (), tuple(brands), "=", " or ".join(brands)))
    return out


# Numbers said as words ("one" left out: "one that folds" is no number)
WORD_NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
                "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
                "eighty": 80, "ninety": 90}
_WORD_NUMBER = re.compile(r"\b(" + "|".join(WORD_NUMBERS) + r")\b")


def _numbers(low: str, cats: Sequence[str], tax: Taxonomy, types: dict[str, str]) -> list[Constraint]:
    """Counts of people first ("sleeps 4", "for 6 people", "4 person"), then numbers with a
    unit ("65 inch", "20 lb"), then counts of things; each span of the question read once."""
    out: list[Constraint] = []
    used: list[tuple[int, int]] = []
    # "comes with two batteries", "sleeps six": a number said as a word ("one" is too often
    # no number: "one that folds")
    low = _WORD_NUMBER.sub(lambda m: str(WORD_NUMBERS[m.group(1)]), low)
    # "20k mah": thousands of a unit
    low = re.sub(r"\b(\d+(?:\.\d+)?)k(?=\s*mah\b)", lambda m: f"{float(m.group(1)) * 1000:g}", low)
    # "five and a half quarts", "one and a half": the half said as a word
    low = re.sub(r"\b(one|\d+) and a half\b",
                 lambda m: f"{(1 if m.group(1) == 'one' else int(m.group(1))) + 0.5:g}", low)

    def free(m: re.Match[str]) -> bool:
        """Whether ``m`` overlaps no span already read as a number."""
        return not any(s < m.end() and m.start() < e for s, e in used)

    people = _keys_with(tax, cats, "people")
    for m in _SLEEPS.finditer(low):
        if people and free(m) and (m.group(0).startswith(("sleeps", "seats", "family", "group")) or
                                   re.search(r"people|persons|adults|campers|kids", m.group(0))):
            op = ">=" if m.group("least") else _op(low[max(0, m.start() - 20):m.start()], False,
                                                    low[m.end():m.end() + 20])
            out.append(Constraint("number", people, float(m.group("num")), op, m.group(0).strip()))
            used.append(m.span())
    for m in _NUM_UNIT.finditer(low):
        if free(m) and (c := _with_unit(m, low, cats, tax)) is not None:
            out.append(c)
            used.append(m.span())
    def count(m: re.Match[str], keys: tuple[str, ...], num: str) -> None:
        """A count the question states at ``m`` ("24 pack", "spf 30", "3 burner")."""
        out.append(Constraint("number", keys, float(num), _op(low[max(0, m.start() - 20):m.start()],
                                                              False, low[m.end():m.end() + 20]),
                              m.group(0).strip()))
        used.append(m.span())

    numbers = [k for k, t in types.items() if t in ("number", "integer")]
    counts = [k for k in numbers if k.endswith("_count")]
    heads = {_stem(n.split()[-1]) for c in cats for n in [c.replace("_", " "), *_nouns_of(tax, c)]}
    own = tuple(k for k in counts if _stem(k[:-6]) in heads)[:1]
    for m in _PACK.finditer(low):  # "24 pack" of golf balls: their ball_count
        if own and free(m):
            count(m, own, m.group("num") or m.group("num2"))
    for m in _NAMED_COUNT.finditer(low):  # "spf 30": spf_count (or a key named spf)
        keys = tuple(k for k in numbers if k in (m.group("thing") + "_count", m.group("thing")))
        unit_after = re.match(r"\s*([a-z]+)", low[m.end():])
        if keys and free(m) and not (unit_after and unit_after.group(1) in _UNIT_OF):
            count(m, keys, m.group("num"))
    for m in _NUM_COUNT.finditer(low):
        thing = m.group("thing")
        keys = tuple(k for k in counts if k.startswith(thing[:4]))
        if keys and free(m) and thing not in _UNIT_OF:
            count(m, keys, m.group("num"))
    return out


def _nouns_of(tax: Taxonomy, category: str) -> tuple[str, ...]:
    spec = tax.specs.get(category)
    return tuple(spec.nouns) if spec else ()


def _with_unit(m: re.Match[str], low: str, cats: Sequence[str], tax: Taxonomy) -> Constraint | None:
    """The constraint a number with a unit states ("65 inch", "rated up to 65 lbs"), or None
    when no attribute of these types has that unit."""
    unit = _UNIT_OF[m.group("unit")]
    before = low[max(0, m.start() - 20):m.start()]
    if unit == "in" and m.group("unit") == "in" and (re.search(r"size\s*$", before)
                                                      or re.match(r"\s+\d", low[m.end():])):
        return None  # "size 9 in black", "3 in 1"
    value = float(m.group("num"))
    keys = _keys_with(tax, cats, unit)
    if re.match(r"\s*old\b", low[m.end():]):  # "10 years old": an age, never a warranty
        keys = tuple(k for k in keys if "age" in k.split("_"))
    limits = tuple(k for k in keys if k.startswith(("max_", "min_")))
    if limits and _LIMIT.search(before):  # "rated up to 65 lbs", "for a 70 lb dog": the
        # upper limit where there is one (a car seat's max_weight_lb, not its min_)
        keys = tuple(k for k in limits if k.startswith("max_")) or limits
    elif limits and len(limits) < len(keys):  # "35 lb kettlebell": its own weight, and
        # "at least 50 lb" an adjustable one's top weight too; "under 10 lb" its lowest
        op0 = _op(before, bool(m.group("plus")), low[m.end():m.end() + 20])
        side = {">=": "max_", "<=": "min_"}.get(op0)
        keys = tuple(k for k in keys if k not in limits or (side and k.startswith(side)))
    if unit == "tb":
        keys, value = _keys_with(tax, cats, "gb"), value * 1024
    if not keys:
        return None
    op = _op(before, bool(m.group("plus")), low[m.end():m.end() + 20])
    return Constraint("number", keys, value, op, m.group(0).strip())


def _sizes(low: str, types: dict[str, str]) -> list[Constraint]:
    """Shoe and clothing sizes ("size 10", "in a kids 12c")."""
    size_keys = tuple(k for k in ("sizes", "size") if k in types)
    if not size_keys:
        return []
    out = []
    for m in _SIZE.finditer(low):
        v = m.group("v").replace(" ", "")
        out.append(Constraint("size", size_keys, _SIZE_WORDS.get(v, v.upper()), "=", m.group(0)))
    if not _SIZE.search(low):
        for m in _KIDS_SIZE.finditer(low):  # "in a kids 12c": a kids' size without "size"
            out.append(Constraint("size", size_keys, m.group("v").upper(), "=", m.group(0)))
        for m in _IN_SIZE.finditer(low):  # "leggings with pockets in a medium"
            v = m.group("v")
            out.append(Constraint("size", size_keys, _SIZE_WORDS.get(v, v.upper()), "=", m.group(0)))
    return out


def _negated(q: str, phrase: str) -> bool:
    """"no monthly fee", "without a c wire", "subscription free": the feature said, and not
    wanted."""
    p = re.escape(phrase)
    return bool(re.search(r"\b(?:no|not|non|without|never|avoid)\s+(?:\w+\s+)?" + p + r"\b", q)
                or re.search(r"\b" + p + r"\s*-?\s*free\b", q))


def _said_joined(q: str, key: str) -> str | None:
    """The two words of ``q`` that make the one-word ``key`` ("touch screen": touchscreen;
    words of three letters or more each), or None."""
    if "_" in key or len(key) < 7:
        return None
    ws = q.split()
    for a, b in itertools.pairwise(ws):
        if len(a) >= 3 and len(b) >= 3 and a + b == key:
            return f"{a} {b}"
    return None


def _features(q: str, low: str, types: dict[str, str]) -> list[Constraint]:
    """The boolean features the question asks for, by name, by another way to say it, or by
    the key's own words in any order; "waterproof" as a water rating."""
    out = []
    seen_features: set[str] = set()
    q_stems = {_stem(w) for w in q.split()}
    for k, t in types.items():
        if t != "boolean":
            continue
        for phrase in (k.replace("_", " "), *feature_words(k)):
            if _has(q, phrase) and not _negated(q, phrase):
                out.append(Constraint("feature", (k,), "true", "=", phrase))
                seen_features.add(k)
                break
        else:
            joined = _said_joined(q, k)  # "touch screen": touchscreen
            if joined:
                out.append(Constraint("feature", (k,), "true", "=", joined))
                seen_features.add(k)
                continue
            # the key's own words in any order ("quiet" for quiet_mode, "removes lead and
            # pfas" for removes_pfas), less the words that only glue a key's name together
            need = [w for w in k.split("_") if w not in _KEY_GLUE]
            if need and all(_stem(w) in q_stems for w in need) and not any(
                    f" {neg} {need[0]}" in q for neg in ("not", "non", "no", "without")):
                out.append(Constraint("feature", (k,), "true", "=", " ".join(need)))
                seen_features.add(k)
    if "waterproof" not in seen_features and "water_rating" in types and (
            _has(q, "waterproof") or _has(q, "water proof") or _WET.search(low)):
        out.append(Constraint("feature", ("water_rating",), "true", "=", "waterproof"))
    return out


def _values(question: str, q: str, cats: Sequence[str], tax: Taxonomy,
            taken: set[str]) -> list[Constraint]:
    """String specs the question names by value ("oled", "cast iron"), one per key, the keys
    in ``taken`` (already constrained) left out."""
    out = []
    q_compact = _compact(question)
    for c in cats:
        for k, vals in tax.values.get(c, {}).items():
            if k in ("gender", "color") or k in taken:
                continue
            v = _value_said(vals, q, q_compact)
            if v is not None:
                out.append(Constraint("value", (k,), v, "=", v))
                taken.add(k)
    return out


# ------------------------------------------------------------------ price floors and ranges

_AMOUNT = r"\$?\s*(\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s*(k\b)?\s*(?:dollars|usd|bucks)?"
_BETWEEN = re.compile(rf"\bbetween\s+{_AMOUNT}\s*(?:and|to|-)\s*{_AMOUNT}")
_RANGE = re.compile(r"\$\s*(\d{1,3}(?:,\d{3})+|\d+)\s*(k\b)?\s*(?:-|to)\s*\$?\s*"
                    r"(\d{1,3}(?:,\d{3})+|\d+)\s*(k\b)?")
_AND_UP = re.compile(r"(?:\$\s*)(\d{1,3}(?:,\d{3})+|\d+)\s*(k\b)?\s*(?:dollars\s+)?"
                     r"(?:and|or)\s+(?:up|above|over|more|higher)\b")
# not "no more than $900" (a cap); a bare thousands amount is money ("over 1k", not "over 20k
# mah")
_FLOOR = re.compile(r"\b(?<!no\s)(?<!not\s)(?:over|above|at\s+least|more\s+than|minimum\s+of|"
                    r"starting\s+at|no\s+less\s+than)\s+(?:\$\s*(\d{1,3}(?:,\d{3})+|\d+)\s*(k\b)?|"
                    r"(\d{1,3}(?:,\d{3})+|\d+)\s*(k\b)?\s*(?:dollars|usd|bucks)\b|"
                    r"(\d{1,3}(?:\.\d)?)(k)\b(?!\s*(?:mah|wh|w|watts?|gb|tb|lbs?|btu|rpm|mp|hz|"
                    r"v|mm|ft|miles?|km|steps?|pieces?)\b))")


def _amt(num: str | None, k: str | None) -> float:
    return float((num or "0").replace(",", "")) * (1000 if k else 1)


def parse_price_range(text: str) -> tuple[float | None, float | None]:
    """(floor, cap) in USD a question states as a floor or range ("over $100", "at least
    200 dollars", "between 50 and 80", "$50-$80", "over a grand"); (None, None) when it states
    neither."""
    low = spoken_amounts(text.lower())
    if (m := _BETWEEN.search(low)) or (m := _RANGE.search(low)):
        lo, hi = _amt(m.group(1), m.group(2)), _amt(m.group(3), m.group(4))
        return (min(lo, hi), max(lo, hi)) if hi > 0 else (None, None)
    if (m := _FLOOR.search(low)) is not None:
        return (_amt(m.group(1) or m.group(3) or m.group(5),
                     m.group(2) or m.group(4) or m.group(6)), None)
    if (m := _AND_UP.search(low)) is not None:  # "$400 and up", "150 dollars or more"
        return (_amt(m.group(1), m.group(2)), None)
    return (None, None)


# ------------------------------------------------------------------ relaxing

def meeting(products: Sequence[Product], constraints: Sequence[Constraint]) -> list[Product]:
    """The products meeting every one of ``constraints`` (order kept)."""
    return [p for p in products if all(c.met(p) for c in constraints)]


def relax(products: Sequence[Product], constraints: Sequence[Constraint],
          said: Sequence[Constraint] | None = None) -> tuple[list[Product], list[Constraint]]:
    """The products meeting the most important constraints that some products meet, and the
    constraints dropped for them: the fewest, the least important first (:data:`RELAX_RANK`),
    those of an earlier turn before those ``said`` in this one ("polarized sunglasses", then
    "any in tortoise?": tortoise ones first). Products missing a dropped number come nearest
    first."""
    met = meeting(products, constraints)
    if met or not constraints:
        return met, []
    cs = list(constraints)
    now = set(cs if said is None else said)
    order = sorted(range(len(cs)), key=lambda i: (cs[i] in now, RELAX_RANK[cs[i].kind], i))
    from itertools import combinations
    for n in range(1, len(cs) + 1):
        for drop in combinations(order, n):
            keep = [c for i, c in enumerate(cs) if i not in drop]
            found = meeting(products, keep)
            if found:
                dropped = [cs[i] for i in drop]
                nums = [c for c in dropped if c.kind == "number"]
                if nums:
                    found.sort(key=lambda p: tuple(c.distance(p) for c in nums))
                return found, dropped
    return [], cs
