"""Which of a card's attributes a question asks about, and how its value reads.

"bose quietcomfort 45 battery life", "is the manduka prolite latex free?", "how heavy is the
weber spirit", "does the sony wh-1000xm5 support multipoint?": the question's words are
mapped to attribute keys in one place (:func:`asked_keys`), from

- the key's own words (``dishwasher_safe``: "dishwasher" and "safe"; ``works_with_mac``:
  "mac"), one typo allowed in a word of five letters or more ("dishwaser");
- its unit (``battery_hours``: "how many hours");
- the other ways customers say a key (rufus.retrieval.constraints.feature_words: a hand
  table and data/catalog/phrases.jsonl) and
  a question (:data:`ASK_WORDS`: "how long does it last", "how heavy", "made of").

A value is written by :func:`value_text` ("24 hours", "1.2 lb", "yes"), its name by
:func:`label` ("battery life"), and which way is better by :func:`better` (a comparison's
"which lasts longer"). No per-category table: a user catalog whose keys follow
data/catalog/SCHEMA.md (unit in the suffix, features as booleans) gets the same.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from rufus.retrieval.catalog import AttrValue
from rufus.retrieval.constraints import _KEY_GLUE, _SLEEPS, UNITS, WORD_NUMBERS, feature_words
from rufus.retrieval.spelling import edit_distance, stem1

# Question phrases -> words of the keys they ask about (matched against a key's words).
ASK_WORDS: dict[str, tuple[str, ...]] = {
    "battery life": ("battery", "runtime"), "on a charge": ("battery", "runtime"),
    "on one charge": ("battery", "runtime"), "on a single charge": ("battery", "runtime"),
    "how long does it last": ("battery", "runtime"), "how long do they last": ("battery", "runtime"),
    "how long does the battery": ("battery",), "battery last": ("battery",),
    "playtime": ("battery",), "play time": ("battery",), "playback": ("battery",),
    "run time": ("runtime", "battery"), "lasts longer": ("battery", "runtime"),
    "last longer": ("battery", "runtime"), "longer lasting": ("battery", "runtime"),
    "how heavy": ("weight",), "weigh": ("weight",), "weighs": ("weight",), "heavy": ("weight",),
    "lighter": ("weight",), "lightest": ("weight",), "heavier": ("weight",),
    "how much does it hold": ("capacity",), "how much can it hold": ("capacity",),
    "how big": ("capacity", "screen", "size"), "how large": ("capacity", "screen", "size"),
    "bigger": ("capacity", "screen"), "holds more": ("capacity",),
    "screen size": ("screen",), "display size": ("screen", "display"),
    "big is the screen": ("screen",), "guarantee": ("warranty",), "warrantee": ("warranty",),
    "water resistant": ("waterproof", "water"), "water resistance": ("waterproof", "water"),
    "swim": ("waterproof", "water"), "swimming": ("waterproof", "water"),
    "ip rating": ("water",), "in the rain": ("waterproof", "water"),
    "in the shower": ("waterproof", "water", "wet"), "in the bath": ("waterproof", "water", "wet"),
    "made of": ("material",), "made from": ("material",), "what material": ("material",),
    "how powerful": ("wattage", "power", "motor"), "watts": ("wattage", "power"),
    "how thick": ("thickness",), "thick": ("thickness",), "how tall": ("height",),
    "how loud": ("noise", "decibel"), "how quiet": ("noise", "decibel", "quiet"),
    "quieter": ("noise", "decibel", "quiet"), "memory": ("ram", "storage"),
    "how much storage": ("storage",), "refresh rate": ("refresh",),
    "megapixels": ("sensor",), "resolution": ("resolution",), "how bright": ("brightness", "lumens"),
    "two devices": ("multipoint", "multi"), "2 devices": ("multipoint", "multi"),
    "at the same time": ("multipoint", "multi"), "phone and laptop": ("multipoint", "multi"),
    "swivel": ("rotating", "swivel"), "rotate": ("rotating",), "spin around": ("rotating",),
    "how deep": ("depth",), "deeper": ("depth",), "underwater": ("depth", "waterproof"),
    "dive": ("depth", "waterproof"), "diving": ("depth", "waterproof"),
    "scuba": ("depth", "waterproof"), "snorkel": ("depth", "waterproof"),
    "snorkeling": ("depth", "waterproof"), "submerge": ("depth", "waterproof"),
    "stays up": ("flight",), "stay up": ("flight",), "flight time": ("flight",),
    "fly for": ("flight",), "how high": ("height",), "goes up to": ("height",),
    "wet": ("wet", "dry"), "how firm": ("firmness",), "firm": ("firmness",),
    "in the air": ("flight",), "farther": ("range",), "further": ("range",),
    "reach": ("range",), "range": ("range",), "cooking space": ("cooking", "area"),
    "warmer": ("temp", "warmth"), "how warm": ("temp", "warmth"),
    "try": ("trial",), "trial": ("trial",), "charge my phone": ("charges", "devices"),
    "charge a phone": ("charges", "devices"), "charge other devices": ("charges", "devices"),
    "set the temperature": ("variable", "temperature"),
    "adjust the temperature": ("variable", "temperature"), "square footage": ("coverage",),
    "square feet": ("coverage",), "cover": ("coverage",),
    "how big a room": ("coverage",), "filter out": ("removes",), "remove": ("removes",),
    "built in": ("integrated", "built"), "thicker": ("thickness", "height"),
    "taller": ("height",), "goes taller": ("height",), "powerful": ("wattage", "power", "motor"),
    "more powerful": ("wattage", "power", "motor"),
    "goes heavier": ("max", "weight"), "more pieces": ("piece",), "pieces": ("piece",),
    "how many players": ("players",), "players": ("players",), "how many people": ("people", "capacity"),
    "iphone": ("iphone",), "android": ("android",), "alexa": ("alexa",), "mac": ("mac",),
    "macbook": ("mac",), "homekit": ("homekit",), "dishwasher": ("dishwasher",),
    "oven": ("oven",), "induction": ("induction",), "latex": ("latex",),
    "at night": ("night", "vision"), "in the dark": ("night", "vision"),
    "narrower": ("width",), "narrowest": ("width",), "wider": ("width",), "how wide": ("width",),
}
_ONE_WORD_ASKS = {p: k for p, k in ASK_WORDS.items() if " " not in p and len(p) >= 5}
# "weight limit", "how much can it hold": a key's "max" said
_SAYS_MAX = frozenset({"limit", "max", "maximum", "most", "hold", "holds", "support", "supports"})
# "wifi 6 or 6e": the Wi-Fi standard
_WIFI = re.compile(r"\bwi\s*-?\s*fi\s*\d|\b6e\b")
# "how long does the first one run", "how long will it last": battery or run time.
_ASK_PATTERNS = ((re.compile(r"\bhow\s+long\s+(?:does|dose|dos|do|will|can|would)\b.{0,40}"
                              r"\b(?:run|last|go|play)\b"),
                  ("battery", "runtime")),)
# "how long does a round take", "which runs longer": a duration asked (keys in these units)
_DURATION = re.compile(r"\bhow\s+long\s+(?:does|dose|dos|do|will|can|would|is\s+it\s+good\s+for)\b|"
                       r"\b(?:run|last|play|go|stay|work|take)(?:s|es|ing)?\s+(?:\w+\s+)?long(?:er|est)?\b")
_TAKES_TO = re.compile(r"\btak(?:e|es|ing)\s+(?:\w+\s+)?to\s+(?:fully\s+)?([a-z]+)")
_DURATION_UNITS = frozenset({"hours", "minutes", "days", "weeks", "s"})
# "for a family of 6", "sleeps 4", "a group of 5" (rufus.retrieval.constraints), "with 5
# people": a head count
_HEADCOUNT = re.compile(_SLEEPS.pattern + r"|\b\d{1,2}\s+(?:people|persons|players|guests|adults|kids)\b")
_PEOPLE_WORDS = ("people", "players", "persons", "sleeps", "seats", "riders", "guests")
# What a unit measures, as customers ask it ("more heat": BTU; "how bright": lumens).
_MEASURES = {"btu": ("heat", "hotter", "hot"), "lumens": ("bright", "brighter", "brightest"),
             "w": ("power", "powerful"), "mph": ("speed", "fast", "faster"),
             "ppm": ("fast", "faster", "speed"), "mbps": ("fast", "faster", "speed"),
             "rpm": ("speed", "speeds"), "mah": ("battery",), "mp": ("megapixel", "megapixels"),
             "people": _PEOPLE_WORDS}
# Unit names too plain to ask for a key alone ("in", "h", "man", "degrees").
_WEAK_UNITS = frozenset({"in", "h", "l", "g", "w", "v", "f", "man", "min", "hr", "degree",
                         "degrees", "°", "'", '"', "fast", "speed"})
# Words before the things a count key counts ("how many pieces", "more modes").
_COUNTING = frozenset({"many", "more", "most", "fewer", "fewest", "number"})
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Units customers write for a key's unit suffix, plus words a number key may be asked by.
_UNIT_WORDS = {u: set(al) for u, al in UNITS.items()}
# A key's words that a question need not say ("battery_hours" is asked as "battery").
_GLUE = _KEY_GLUE | {"count", "size", "rating", "type", "level", "max", "min", "required", "time", "safe"}
# How a unit reads after a number.
UNIT_TEXT = {
    "in": " inches", "ft": " ft", "mm": " mm", "cm": " cm", "qt": " qt", "oz": " oz",
    "l": " L", "cups": " cups", "lb": " lb", "lbs": " lb", "g": " g", "hours": " hours",
    "minutes": " minutes", "people": " people", "gb": " GB", "tb": " TB", "w": " W", "v": " V",
    "mah": " mAh", "hz": " Hz", "mp": " MP", "years": " years", "btu": " BTU",
    "sqft": " sq ft", "cuft": " cu ft", "f": "°F", "mph": " mph", "hp": " hp",
    "lumens": " lumens", "km": " km", "days": " days", "weeks": " weeks",
    "gallons": " gallons", "percent": "%", "rpm": " rpm", "ms": " ms", "dpi": " DPI",
    "ppm": " ppm", "mbps": " Mbps", "s": " s", "pa": " Pa", "cfm": " CFM", "nights": " nights",
    "gsm": " gsm", "bar": " bar", "sqin": " sq in", "deg": "°", "count": "",
}
# Names that read better than the key's words.
LABELS = {"battery": "battery life", "weight": "weight", "screen": "screen size",
          "capacity": "capacity", "warranty": "warranty", "water rating": "water rating",
          "runtime": "run time", "ram": "RAM", "storage": "storage", "refresh": "refresh rate",
          "sensor": "sensor resolution", "noise cancelling": "noise cancelling"}
# Keys whose smaller value is better (a comparison's pick): weights, noise, thickness of a
# laptop, price. Everything else numeric: larger is better (battery, capacity, warranty).
_LOWER_BETTER = ("weight", "noise", "decibel", "db", "price", "drop")
# A time it takes to do something (a response, a charge, a boil): shorter is better, and
# "faster" / "quicker" mean shorter; not a time it keeps going (battery, run, play, flight).
_TIME_TO = ("response", "latency", "lag", "charge", "charging", "recharge", "boil", "heat",
            "preheat", "setup", "dry", "drying", "cook", "brew")
# Comparative words and which way they point ("lighter": lower weight).
_LOWER = ("lighter", "lightest", "cheaper", "cheapest", "quieter", "quietest", "smaller",
          "smallest", "thinner", "compact", "narrower", "narrowest", "slimmer", "slimmest")
_HIGHER = ("longer", "longest", "bigger", "biggest", "larger", "largest", "more", "most",
           "heavier", "louder", "brighter", "faster", "higher", "deeper", "taller", "stronger",
           "thicker", "powerful", "farther", "further")
_TOKEN = re.compile(r"[a-z0-9]+")


@functools.lru_cache(maxsize=256)
def _how_many(units: frozenset[str]) -> re.Pattern[str]:
    return re.compile(r"\bhow\s+many\s+(?:" + "|".join(map(re.escape, sorted(units))) + r")s?\b")


def unit_of(key: str) -> str:
    """A number key's unit suffix ("battery_hours" -> "hours"), "" when it has none."""
    tail = key.rsplit("_", 1)[-1] if "_" in key else ""
    return tail if tail in UNIT_TEXT else ""


def key_words(key: str) -> list[str]:
    """A key's own words, its unit suffix left out ("battery_hours" -> ["battery"])."""
    ws = key.split("_")
    if unit_of(key):
        ws = ws[:-1]
    return [w for w in ws if w]


def label(key: str) -> str:
    """A key as a customer reads it: "battery_hours" -> "battery life"."""
    words = " ".join(key_words(key)) or key.replace("_", " ")
    if unit_of(key) == "mah":
        return "battery capacity"  # mAh is no battery life
    return LABELS.get(words, words)


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def value_text(key: str, value: AttrValue) -> str:
    """How a card's value reads: "24 hours", "1.2 lb", "yes"/"no", "IPX4", "7, 8, 9"."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, int | float):
        unit = unit_of(key)
        if unit == "gb" and value >= 1024 and value % 1024 == 0:
            return f"{int(value) // 1024} TB"
        text = UNIT_TEXT.get(unit, "")
        if value == 1 and text.endswith("s") and text not in (" lbs",):
            text = text[:-1]  # "1 year", "1 hour"
        return _num(value) + text
    return str(value)


@functools.lru_cache(maxsize=4096)
def _stem_tuple(text: str) -> tuple[str, ...]:
    return tuple(stem1(w) for w in _TOKEN.findall(text.lower()))


def _stems(text: str) -> list[str]:
    return list(_stem_tuple(text))


def typo_of(q: str, w: str) -> bool:
    """``q`` is ``w`` with one typo (words of five letters or more, same first letter)."""
    return (len(w) >= 5 and len(q) >= 5 and abs(len(q) - len(w)) <= 1 and q[:1] == w[:1]
            and edit_distance(q, w) <= 1)


def _has_word(words: set[str], w: str) -> bool:
    """``w`` (a key's word, stemmed) in the question's words, or one typo of it."""
    return w in words or any(typo_of(q, w) or (len(w) >= 4 and q.startswith(w) and len(q) - len(w) <= 3)
                             or (len(q) >= 4 and w.startswith(q) and len(w) - len(q) <= 4)
                             for q in words)  # "printer" says "print", "fold" "foldable"


@functools.lru_cache(maxsize=4096)
def _own_words(key: str) -> list[str]:
    return [stem1(w) for w in key_words(key) if w not in _GLUE]


def _hints(q: str, raw: set[str], skip: frozenset[str]) -> set[str]:
    """The key words the question's phrases ask about (:data:`ASK_WORDS`, their one-typo
    forms, the Wi-Fi standard, "how long does it run", a head count)."""
    hinted: set[str] = set()
    for phrase, kws in ASK_WORDS.items():
        if f" {phrase} " in q and not set(_stems(phrase)) <= skip:
            hinted.update(kws)
    for w in raw:  # "ligher", "wieght", "hevy": one typo of a one-word phrase
        for phrase, kws in _ONE_WORD_ASKS.items():
            if w != phrase and (typo_of(w, phrase) or (
                    len(w) == 4 and len(phrase) == 5 and w[0] == phrase[0]
                    and edit_distance(w, phrase) == 1)):
                hinted.update(kws)
    if _WIFI.search(q):
        hinted.update(("wifi", "standard"))
    for pat, kws in _ASK_PATTERNS:
        if pat.search(q):
            hinted.update(kws)
    if _HEADCOUNT.search(q):  # "for a family of 6", "seats 4": how many people it takes
        hinted.update(_PEOPLE_WORDS)
    return {stem1(h) for h in hinted}


def _unit_asks(key: str, unit: str, q: str) -> tuple[set[str], bool]:
    """The words that ask for a key in ``unit`` (the unit's names, "lumens", "hours", and
    the quantity it measures, "heat" for BTU), and whether ``q`` asks a duration in it
    ("how long does a round take", "which runs longer": hours, minutes)."""
    units = _UNIT_WORDS.get(unit, {unit} if unit and unit != "count" else set())
    duration = unit in _DURATION_UNITS and bool(_DURATION.search(q))
    doing = _TAKES_TO.search(q)  # "how long does it take to recharge": that, not its run time
    if duration and doing:
        verb = {doing.group(1), stem1(doing.group(1))}
        duration = any(_has_word(verb, w) for w in _own_words(key))
    return units | set(_MEASURES.get(unit, ())), duration


def _counted(key: str, q: str) -> bool:
    """"how many cards", "more modes", "the most pieces": a count of one of the key's own
    words (``card_capacity_count``, ``brushing_modes_count``), its glue words too."""
    ws = _TOKEN.findall(q)
    own = {stem1(w) for w in key_words(key) if w != "count"}
    return any(w in _COUNTING and any(stem1(x) in own for x in ws[i + 1:i + 3])
               for i, w in enumerate(ws))


# Words a phrase matches without ("on an airplane" says "on a plane"'s "on ... plane").
_ARTICLES = frozenset({"a", "an", "the", "my", "your", "our", "its", "their", "this", "that"})


@functools.lru_cache(maxsize=8192)
def _phrase_words(phrase: str) -> tuple[str, ...]:
    return tuple(w for w in _TOKEN.findall(phrase) if w not in _ARTICLES)


@functools.lru_cache(maxsize=256)
def _loose_words(q: str, skip: frozenset[str]) -> tuple[str, ...]:
    """``q``'s words less articles and the product name's (read once per question, not per
    key and phrase)."""
    return tuple(w for w in q.split() if w not in _ARTICLES and stem1(w) not in skip)


def _loosely_in(phrase: str, q: str, skip: frozenset[str]) -> bool:
    """``phrase`` said in ``q`` less articles and possessives, each word as said or with one
    typo ("montly fee", "charge my macbok"), or its words run together with one typo
    ("hotswapable" for "hot swappable"); never by a word of the product's name (``skip``:
    its stems; "Ninja Foodi DualZone" asks no "dual zone")."""
    want = _phrase_words(phrase)
    ws = _loose_words(q, skip)
    if not want or not ws:
        return False
    if len(want) > 1:
        joined = "".join(want)
        if any(w == joined or typo_of(w, joined) for w in ws):
            return True
    n = len(want)
    return any(all(a == b or typo_of(a, b) for a, b in zip(ws[i:i + n], want, strict=True))
               for i in range(len(ws) - n + 1))


def _several(thing: str, q: str) -> bool:
    """"3 cats", "two devices", "several users": more than one ``thing`` said."""
    return bool(re.search(r"\b(?:[2-9]|" + "|".join(WORD_NUMBERS) + r"|multiple|several|more\s+than\s+one)\s+"
                          + re.escape(stem1(thing)) + r"s?\b", q))


def _unit_typos(raw: set[str], units: set[str]) -> set[str]:
    """The unit words (five letters or more) that ``raw`` says with one typo."""
    return {u for u in units if len(u) >= 5 and any(w != u and typo_of(w, u) for w in raw)}


def _key_score(key: str, q: str, raw: set[str], words: set[str], hint: set[str],
               skip: frozenset[str]) -> float:
    """How strongly ``q`` asks about ``key`` (0: not at all); see :func:`asked_keys`."""
    own = _own_words(key)
    unit = unit_of(key)
    if not own and unit:  # "max_dpi": its unit is its word
        own = [unit]
    score = 0.0
    if own and all(_has_word(words, w) for w in own):
        score = 2.0 + len(own) + 0.1 * len(own)  # the key naming more of what is said first
    elif own and all(w in hint or _has_word(words, w) for w in own) and set(own) & hint:
        # "how heavy" -> weight_lb; "filter out pfas" -> removes_pfas; "how loud" is no
        # noise_cancelling (its "cancelling" is neither said nor hinted)
        score = 2.0 + 0.5 * len(own)
    elif len(own) >= 2 and own[-1] in hint:
        score = 1.75  # "how deep does it go": waterproof_depth_ft, a depth (its head word)
    elif key.endswith("_type") and re.search(r"\b(?:kind|type|sort)\s+of\b", q):
        score = 2.5  # "what kind of shaver is it": shaver_type
    # a key's words the question does not say ("max" of max_weight_lb when "weight" is
    # asked): the plainer key first
    if score > 0:
        # "for a group of 6": a head count asks what it takes at most
        said = raw | ({"max"} if raw & _SAYS_MAX or _HEADCOUNT.search(q) else set())
        if raw & {"more", "most"}:
            said |= {"max"}  # "which takes more players": the most it takes, not the fewest
        score -= 0.25 * sum(1 for w in key_words(key) if w in _GLUE and w not in said and w != unit)
    if key.startswith("multi_") and _several(key.removeprefix("multi_"), q):
        score = max(score, 3.0)  # "a house with 3 cats": multi_cat
    if key.endswith("_count") and _counted(key, q):
        score = max(score, 3.0)  # "how many cards fit": card_capacity_count; "more modes"
    for phrase in feature_words(key):
        if not set(_stems(phrase)) <= skip and (f" {phrase} " in q or _loosely_in(phrase, q, skip)):
            score = max(score, 3.0 + len(phrase.split()))  # not the name's words
    units, duration = _unit_asks(key, unit, q)
    typed = _unit_typos(raw, units)  # "how many lumins", "which is brigher"
    said_unit = bool(raw & units or {w.removesuffix("s") for w in raw} & units or typed) or duration
    strong = duration or bool(raw & (units - _WEAK_UNITS) or typed - _WEAK_UNITS)
    if score and unit and said_unit:
        score += 1.0  # "how many hours": the key in hours over the one in minutes
    elif not score and units and (_how_many(frozenset(units)).search(q) or strong):
        score = 1.5  # "in lumens", "how many nights", "more heat" (BTU), "how long does it run"
    return score


def asked_keys(question: str, keys: Iterable[str], ignore: Sequence[str] = ()) -> list[str]:
    """The keys of ``keys`` (a card's attribute keys) that ``question`` asks about, the best
    match first; ``ignore``: text whose words ask nothing (the product's own name, "jbl flip
    6": no key is asked by a word of it)."""
    low = question.lower().replace("colour", "color").replace("grey", "gray")
    q = " " + " ".join(_TOKEN.findall(low)) + " "
    skip = frozenset(_stems(" ".join(ignore)))
    toks = _TOKEN.findall(q)
    # a name's words, and typos of them ("momentum 4 wirless"), ask nothing
    named = [w for w in toks if stem1(w) in skip or any(typo_of(w, x) for x in skip)]
    raw = {w for w in toks if w not in named}
    raw |= {a + b for a, b in itertools.pairwise(toks)
            if a not in named and b not in named}  # "wi fi", "shut off": wifi, shutoff
    words = {stem1(w) for w in raw} | raw
    hint = _hints(q, raw, skip)
    scored: list[tuple[float, str]] = []
    for key in keys:
        if key in ("color", "colors", "sizes", "gender"):
            continue  # variant axes: asked through colour and size words (rufus.assistant)
        score = _key_score(key, q, raw, words, hint, skip)
        if score > 0:
            scored.append((score, key))
    return [k for _, k in sorted(scored, key=lambda x: -x[0])]


def value_keys(question: str, attributes: Mapping[str, AttrValue], ignore: Sequence[str] = ()) -> list[str]:
    """Keys whose list or text value holds a number the question says ("can it play 78s":
    speeds_rpm [33 1/3, 45, 78]); numbers of ``ignore`` (the product's name) say nothing."""
    skip = set(_NUMBER.findall(" ".join(ignore).lower()))
    nums = [n for n in _NUMBER.findall(question.lower()) if n not in skip]
    out = []
    for k, v in attributes.items():
        items = v if isinstance(v, list) else [v] if isinstance(v, str) else []
        if nums and any(n in _NUMBER.findall(str(x)) for x in items for n in nums):
            out.append(k)
    return out


def better(key: str, question: str = "") -> int:
    """Which way is better for a comparison's pick on ``key``: +1 larger (or true), -1
    smaller; the question's own comparative wins ("lighter", "bigger")."""
    ws = _TOKEN.findall(question.lower())
    if "temp" in key and any(w.startswith("warm") for w in ws):
        return -1  # a sleeping bag's lower temperature rating keeps you warmer
    if unit_of(key) in _DURATION_UNITS | {"ms"} and any(w in key_words(key) for w in _TIME_TO):
        longer = any(w in ("longer", "longest", "slower", "slowest") for w in ws)
        return 1 if longer else -1  # "faster response time": the lower one
    for w in ws:  # "ligher" too
        if w in _LOWER or any(typo_of(w, x) for x in _LOWER):
            return -1
        if w in _HIGHER or any(typo_of(w, x) for x in _HIGHER if x not in ("more", "most")):
            return 1
    return -1 if any(w in key for w in _LOWER_BETTER) else 1


def differing(attrs: Sequence[Mapping[str, AttrValue]], skip: Iterable[str] = ()) -> list[str]:
    """Keys on which the cards differ (one stating it and another not counts), in the first
    card's key order, then the others'; variant axes and ``skip`` left out."""
    out: list[str] = []
    skipped = set(skip) | {"color", "colors"}
    for a in attrs:
        for k in a:
            if k in out or k in skipped:
                continue
            vals = [a2.get(k) for a2 in attrs]
            if any(v != vals[0] for v in vals[1:]):
                out.append(k)
    return out
