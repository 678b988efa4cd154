"""Product type first: which categories and which product models a question asks for.

A card of another product type must never be shown because it shares a side word ("Pro",
"Classic", "Full Size", "Laptop" in "laptop backpack"). So before searching, the question is
read for the product types it names (each category's nouns, the longest match winning:
"laptop backpack" is a backpack) and the product models it names ("weber spirit", "traeger
pro", "galaxy buds 2 pro"); search is then limited to those categories.

Which match is the product type: only the question's first phrase counts (up to "for",
"with", "under" ...: "backpack for my laptop" is a backpack), and a noun followed by an
accessory word ("phone case", "tv stand") is no product type of ours. Models are matched by
their words after the brand, split at letter-digit boundaries ("buds2" = "buds 2"): the
model's first word must be there, with its brand, a second of its words, or a first word no
other brand uses; among a line's models the best-covered wins ("macbook air m2" is the M2).

How the other words say which type: a word heading several types' nouns without being one
("speaker") names the one of them the rest of the question is about, and a noun right before
it is its modifier ("helmet cam"); a one-word noun heading other types' nouns ("camera") takes
the sense its other words clearly give it ("to keep an eye on the dog": a security camera); a
negated noun rules out the types it heads ("without a watch": no smartwatch either); a
product line after "my" is the customer's, not the one wanted ("with my macbook"); a person
named by what they love names the types of the interest ("a coffee lover": coffee makers).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import CategorySpec
from rufus.retrieval.spelling import common_words, edit_distance, stem1

_TOKEN = re.compile(r"[a-z]+|\d+(?:\.\d+)?")
# Words after a product noun that make it a modifier: the customer wants the accessory.
ACCESSORY = frozenset("""
case cases cover covers bag bags stand stands mount mounts charger chargers cable cables strap
straps band bands protector protectors accessory accessories part parts replacement
replacements pad pads tip tips holder holders sleeve sleeves skin skins remote remotes lens
lenses string strings table tables rack racks cleaner cleaners grinder grinders pod pods bean
beans filter filters battery batteries dock docks hook hooks light lights shelf shelves bin
bins box boxes tray trays lid lids liner liners brush brushes head heads refill refills
""".split())
LINE_MODELS = 2  # more models than this named equally: a product line, not models to compare
# The words that open a phrase naming what is wanted ("i'm looking | for a tent").
WANT_OPENERS = frozenset({"for", "like"})
# After an accessory word, these make it a verb: "covers a room", "holds the heat".
_VERB_OBJECT = frozenset({"a", "an", "the", "my", "your", "up", "more", "less", "well"})
# Words that end the first phrase of a question ("backpack | for my laptop").
PHRASE_END = frozenset("""
for with without under below over above in on to of by from near like than that who thats
at into between compatible fits fit sleeps holds keeps works rated has whose
inside within behind beside beneath underneath
""".split())
# A noun right after these is not wanted: "without a watch", "no tv".
NEGATIONS = frozenset({"without", "no", "not", "instead", "besides", "except"})
# A noun that is what the product acts on, not the product: "carry my laptop", "pack clothes",
# "keep my phone charged" (verb before it), "my phone dies" (after it).
OBJECT_BEFORE = frozenset("""
carry carrying pack packing store storing hold holding charge charging protect protecting
organize clean cleaning mount hang
""".split())
OBJECT_AFTER = frozenset("dies died dying dead charged broke broken".split())
# A verb of how a thing performs right after its noun says it is the customer's own ("the tv
# dialog sounds tinny": a soundbar is wanted), unless a relative word makes it a wish ("a
# speaker that sounds full").
JUDGED_AFTER = frozenset("sounds looks feels smells stopped quit leaks squeaks wobbles".split())
RELATIVES = frozenset({"that", "which", "who", "whose"})
# A one-word noun opening the question (or after "to") with one of these after it is a verb:
# "watch the driveway", "to monitor my blood pressure".
DETERMINERS = frozenset({"the", "a", "an", "my", "our", "your", "his", "her", "their", "this"})
# A cap on time says speed: "in under an hour", "less than 10 minutes" ask for "fast".
_DURATION = frozenset("second seconds minute minutes min mins hour hours hr hrs".split())
_DURATION_COUNT = frozenset({"a", "an", "one", "half", "few", "couple", "of"})
# "while" opens a clause of when the product is used, not what for ("walk while i'm on
# calls"), but not in "a while", "for a while".
WHILE = "while"
CHANGE_VERBS = frozenset("turn turning make making convert converting transform change".split())
# A product line after these, past the first phrase, is one the customer has, not the one
# wanted: "extra screen for working from home with my macbook" asks for a monitor.
POSSESSIVES = frozenset({"my", "our", "his", "her", "their", "your"})
# A person named by what they love ("a coffee lover", "tea enthusiasts"): the word before is
# the interest, and the types whose nouns have it are the gift ("fan" is a product type).
ENTHUSIASTS = frozenset("""
lover lovers enthusiast enthusiasts addict addicts junkie junkies buff buffs fanatic fanatics
aficionado aficionados connoisseur connoisseurs snob snobs nerd nerds geek geeks
""".split())
# A one-word noun that heads other types' nouns too ("camera": security camera, action
# camera) takes the sense of the one its other words score this many times higher
# ("good first camera" is no action camera for its "first person video": 1.75 times).
SENSE_LEAD = 2.0


# A need's words that say nothing of the product type (classify).
_NEED_STOP = frozenset("""
something thing things want need looking get buy good best great new old really time day days
help make makes keep like just also even every home house room use used using one two work
tired paying pay whats easiest easy way always lot lots stuff right now people who whos
someone somebody love loves starting start every thanks thank needed please hello write tell
joke question answer
""".split())
NOUN_WEIGHT, NEED_WEIGHT = 3, 2  # a noun's head word; a use's, a need's or a noun's other words
DESCRIPTION_WEIGHT = 0.5  # a model's words (its title, description and string specs)
IDF_POWER = 1.0
CLASSIFY_MIN = 2.0  # the nearest type's score, at least (tuned on the first held-out set)
CLASSIFY_COVER = 0.0  # share of a need's words the type must have (0.34-0.6 measured worse)
CLASSIFY_WORDS = 2  # and at least this many of them (one shared word is a coincidence)
CLASSIFY_LEAD = 1.0  # and at least as high as the next type's (1.3 measured worse: docs/catalog.md)


def _content(ws: Iterable[str]) -> list[str]:
    """The stems of a need's words that may say what it is (classify)."""
    return stems(w for w in ws if w not in STOPWORDS and w not in _NEED_STOP
                 and not w.isdigit() and len(w) > 2)


def _majority(counts: dict[str, Counter[str]], ok: Callable[[str], bool]) -> dict[str, str]:
    """word -> the category holding at least two thirds of its models/brands."""
    out = {}
    for w, c in counts.items():
        cat, n = c.most_common(1)[0]
        if ok(w) and n * 3 >= 2 * sum(c.values()):
            out[w] = cat
    return out


def _one_deleted(w: str) -> set[str]:
    """``w`` and ``w`` less any one letter: a symmetric-delete index of one edit."""
    return {w, *(w[:i] + w[i + 1:] for i in range(len(w)))}


def _in_order(seq: Sequence[str], st: Sequence[str]) -> bool:
    """Whether ``seq`` is said word for word in ``st``."""
    n = len(seq)
    return any(tuple(st[i:i + n]) == tuple(seq) for i in range(len(st) - n + 1))


def said_fast(ws: Sequence[str]) -> list[str]:
    """``ws`` with each cap on time ("under an hour", "less than 10 minutes", "within a
    few minutes") said as the need it is: "fast"."""
    out: list[str] = []
    i = 0
    while i < len(ws):
        cue = 2 if list(ws[i:i + 2]) == ["less", "than"] else 1 if ws[i] in ("under", "within") else 0
        j = i + cue
        while cue and j < len(ws) and j - i - cue < 3 and (ws[j] in _DURATION_COUNT or ws[j].isdigit()):
            j += 1
        if cue and j > i + cue and j < len(ws) and ws[j] in _DURATION:
            out.append("fast")
            i = j + 1
            continue
        out.append(ws[i])
        i += 1
    return out


def _as_verb(ws: Sequence[str], s: int, e: int) -> bool:
    """A one-word noun that opens the question (or follows "to") with an article or
    possessive after it is a verb: "watch the driveway", "to monitor my sleep"."""
    return e == s + 1 and (s == 0 or ws[s - 1] == "to") and e < len(ws) and ws[e] in DETERMINERS


def _judged(ws: Sequence[str], e: int) -> bool:
    """A verb of how it performs right after the noun ending at ``e`` (or a word on: "tv
    dialog sounds tinny"), not in a relative clause ("a speaker that sounds full")."""
    return e < len(ws) and ws[e] not in RELATIVES and bool(set(ws[e:e + 2]) & JUDGED_AFTER)


def during(ws: Sequence[str]) -> set[int]:
    """The positions of a "while" clause ("walk | while i'm on zoom calls"): when the product
    is used, not what it does. Not "a while", "for a while"."""
    for i, w in enumerate(ws):
        if w == WHILE and i > 0 and ws[i - 1] != "a":
            return set(range(i, len(ws)))
    return set()


def becomes(ws: Sequence[str]) -> list[str]:
    """The words after "into" when a verb of change comes before it ("turn the wall | into a
    movie screen", "make my garage into a gym"): what the product makes of the place."""
    for i, w in enumerate(ws):
        if w == "into" and set(ws[max(i - 6, 0):i]) & CHANGE_VERBS:
            return list(ws[i + 1:])
    return []


def tokens(text: str) -> list[str]:
    """Lower-case words and numbers, letters and digits apart ("buds2" -> "buds", "2";
    "wh-1000xm5" -> "wh", "1000", "xm", "5"), apostrophes dropped ("men's" -> "mens")."""
    t = text.lower().replace("'", "").replace("\u2019", "")
    return _TOKEN.findall(t)


def stems(ws: Iterable[str]) -> list[str]:
    return [stem1(w) if w.isalpha() else w for w in ws]


@dataclass(frozen=True)
class ModelName:
    model: str
    brand: str  # display
    category: str
    words: tuple[str, ...]  # the model's tokens after the brand's
    brand_words: tuple[str, ...] = ()  # the brand's tokens


@dataclass
class Resolution:
    """What a question names: its product types (category keys, in order) and the models it
    names (``models``: display names, in order); ``accessory``: it asks for an accessory of a
    product type (no category of ours)."""

    categories: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    accessory: bool = False
    inferred: bool = False  # the type is the nearest to a need, not named (Taxonomy.classify)
    brands: list[str] = field(default_factory=list)  # the brands of the product lines named
    need_words: int = 0  # inferred: how many of the need's words the type has
    line_models: list[str] = field(default_factory=list)  # a line's models ("apple watch")
    named_first: bool = False  # a type or model named in the first phrase ("tents for ...")


class Taxonomy:
    """The catalog's product types (nouns, names, spec keys and their types), brands per
    category and model names; built once per index (:meth:`from_products`)."""

    def __init__(self) -> None:
        self.specs: dict[str, CategorySpec] = {}
        self.attr_types: dict[str, dict[str, str]] = {}  # category -> key -> type
        self.values: dict[str, dict[str, set[str]]] = {}  # category -> string key -> values
        self.brands: dict[str, dict[str, str]] = {}  # category -> norm brand -> display
        self.count: dict[str, int] = {}
        self._texts: list[tuple[str, str]] = []  # (category, a model's title and description)
        self._nouns: list[tuple[tuple[str, ...], str]] = []  # stemmed noun -> category, longest first
        self._noun_words: set[str] = set()  # the stems of every noun
        self._fuzzy: dict[str, str] = {}  # one-word nouns (and "e reader" as "ereader")
        self._models: list[ModelName] = []
        self.model_brand: dict[str, str] = {}  # model -> its brand
        self._first: dict[str, set[str]] = {}  # a model's first word -> brands using it
        self._line_words: dict[str, str] = {}  # a product line's word -> its one category
        self._line_brand: dict[str, str] = {}  # a product line's word -> its one brand
        self._brand_words: dict[str, str] = {}  # a one-type brand's word -> its category
        self._doc: dict[str, Counter[str]] = {}  # category -> weighted stems (classify)
        self._df: dict[str, set[str]] = {}  # stem -> categories having it
        # a need phrase's content stems -> its categories (resolve: a need said in full)
        self._need_phrases: dict[frozenset[str], set[str]] = {}
        self._heads: dict[str, set[str]] = {}  # category -> its nouns' head stems
        self._head_types: dict[str, set[str]] = {}  # a noun's head stem -> categories
        self._noun_types: dict[str, set[str]] = {}  # any stem of a noun -> categories
        self._own: dict[str, set[str]] = {}  # category -> the stems of its nouns and needs
        self._need_deletes: dict[str, set[str]] = {}  # a need word's stem less a letter -> it
        self._need_by_word: dict[str, list[frozenset[str]]] = {}  # stem -> need phrases with it
        self._verbatim: dict[frozenset[str], tuple[str, ...]] = {}  # a common-words need, in full

    @classmethod
    def from_products(cls, products: Iterable[Product],
                      specs: Sequence[CategorySpec] = ()) -> Taxonomy:
        t = cls()
        t.specs = {s.key: s for s in specs}
        models: dict[str, ModelName] = {}
        for p in products:
            c = p.category
            t.count[c] = t.count.get(c, 0) + 1
            types = t.attr_types.setdefault(c, {})
            vals = t.values.setdefault(c, {})
            for k, v in p.attributes.items():
                kind = ("boolean" if isinstance(v, bool) else "list" if isinstance(v, list)
                        else "number" if isinstance(v, int | float) else "string")
                types.setdefault(k, kind)
                if isinstance(v, str):
                    vals.setdefault(k, set()).add(v)
            if p.brand:
                t.brands.setdefault(c, {}).setdefault(norm_brand(p.brand), p.brand)
            if p.model and p.model not in models:
                values = " ".join(v for v in p.attributes.values() if isinstance(v, str))
                t._texts.append((c, f"{p.title} {p.description} {values}"))
                ws = tokens(p.model)
                bw = tokens(p.brand)
                rest = ws[len(bw):] if ws[:len(bw)] == bw else ws
                if rest:
                    models[p.model] = ModelName(p.model, p.brand, c, tuple(rest), tuple(bw))
        nouns: dict[tuple[str, ...], str] = {}
        for c in t.count:
            spec = t.specs.get(c)
            own = list(spec.nouns) if spec else []
            own.append(c.replace("_", " "))
            if spec:
                own.append(spec.name)
            for n in own:
                key = tuple(stems(tokens(n)))
                if key and key not in nouns:
                    nouns[key] = c
        t._index_nouns(nouns)
        t._models = list(models.values())
        t.model_brand = {m.model: m.brand for m in t._models}
        firsts: dict[str, Counter[str]] = {}
        for m in t._models:
            t._first.setdefault(m.words[0], set()).add(norm_brand(m.brand))
            firsts.setdefault(m.words[0], Counter())[m.category] += 1
        t._line_words = _majority(firsts, t._namelike)
        line_brands: dict[str, set[str]] = {}
        for m in t._models:
            if m.words[0] in t._line_words:
                line_brands.setdefault(m.words[0], set()).add(m.brand)
        line_brands = {}
        for m in t._models:
            if t._namelike(m.words[0]):
                line_brands.setdefault(m.words[0], set()).add(m.brand)
        t._line_brand = {w: next(iter(b)) for w, b in line_brands.items() if len(b) == 1}
        brand_cats: dict[str, Counter[str]] = {}
        for c, bs in t.brands.items():
            for nb in bs:
                brand_cats.setdefault(nb, Counter())[c] += 1
        t._brand_words = {nb: c for nb, c in _majority(brand_cats, lambda w: len(w) > 2).items()
                          if sum(brand_cats[nb].values()) == 1 and nb not in common_words()}
        for c in t.count:
            doc = t._doc.setdefault(c, Counter())
            spec = t.specs.get(c)
            # a noun's head word weighs most ("chair" of "lawn chair"), its modifiers like
            # a need's words ("lawn" is no lawn mower)
            for noun in (*(spec.nouns if spec else ()), spec.name if spec else "", c.replace("_", " ")):
                ws = stems(tokens(noun))
                for i, w in enumerate(ws):
                    doc[w] += NOUN_WEIGHT if i == len(ws) - 1 else NEED_WEIGHT
            for w in stems(tokens(" ".join(spec.uses + spec.needs) if spec else "")):
                doc[w] += NEED_WEIGHT
            for need in (spec.needs if spec else ()):
                t._index_need(c, need)
        for p_cat, text in t._texts:
            for w in set(stems(tokens(text))):
                t._doc[p_cat][w] += DESCRIPTION_WEIGHT
        t._texts = []
        for w in t._need_by_word:  # typos of a need's words ("bagles"), one edit
            if len(w) >= 5 and w.isalpha():
                for d in _one_deleted(w):
                    t._need_deletes.setdefault(d, set()).add(w)
        for c, doc in t._doc.items():
            for w in doc:
                t._df.setdefault(w, set()).add(c)
        return t

    def _index_need(self, c: str, need: str) -> None:
        """Index one need phrase of ``c`` by its content stems. A need of common words only
        ("tell time", "work from home") keeps its plain words, to be matched only as said,
        word for word (:meth:`_need_said`): scattered, they say nothing."""
        key = frozenset(_content(tokens(need)))
        self._own.setdefault(c, set()).update(key)
        if not key:
            plain = [w for w in tokens(need) if w.isalpha() and len(w) > 2 and w not in STOPWORDS]
            if len(plain) < 2:
                return
            key = frozenset(stems(plain))
            self._verbatim[key] = tuple(stems(tokens(need)))
        if key not in self._need_phrases:
            for w in key:
                self._need_by_word.setdefault(w, []).append(key)
        self._need_phrases.setdefault(key, set()).add(c)

    def _index_nouns(self, nouns: dict[tuple[str, ...], str]) -> None:
        """The lookups of the nouns (stemmed noun -> category): longest first, by head word,
        by any word, and the one-word nouns a typo may stand for."""
        self._nouns = sorted(nouns.items(), key=lambda kv: -len(kv[0]))
        for key, c in nouns.items():
            self._heads.setdefault(c, set()).add(key[-1])
            self._head_types.setdefault(key[-1], set()).add(c)
            self._own.setdefault(c, set()).update(key)
            for w in key:
                self._noun_types.setdefault(w, set()).add(c)
        self._noun_words = {w for n in nouns for w in n}
        self._fuzzy = {("".join(n) if len(n) > 1 else n[0]): c for n, c in nouns.items()
                       if len("".join(n)) >= 5 and (len(n) == 1 or all(len(x) == 1 for x in n[:-1]))}

    # -------------------------------------------------------------- names
    def name(self, category: str) -> str:
        """What a customer reads for a category ("air fryers")."""
        spec = self.specs.get(category)
        if spec:
            return spec.name
        from rufus.retrieval.spelling import category_display
        return category_display(category)

    def noun(self, category: str) -> str:
        spec = self.specs.get(category)
        return spec.nouns[0] if spec and spec.nouns else category.replace("_", " ")

    def curated(self) -> bool:
        """Whether every category of the catalog has its nouns declared (the default catalog;
        a user catalog without category lines is not)."""
        return bool(self.count) and all(c in self.specs for c in self.count)

    def departments(self) -> list[str]:
        return list(dict.fromkeys(s.department for s in self.specs.values() if s.key in self.count))

    # -------------------------------------------------------------- resolution
    def _noun_matches(self, st: Sequence[str]) -> list[tuple[int, int, str]]:
        """(start, end, category) of each noun in ``st`` (stemmed tokens), longest first,
        never overlapping."""
        taken = [False] * len(st)
        out = []
        for noun, cat in self._nouns:
            n = len(noun)
            for i in range(len(st) - n + 1):
                if tuple(st[i:i + n]) == noun and not any(taken[i:i + n]):
                    out.append((i, i + n, cat))
                    for j in range(i, i + n):
                        taken[j] = True
        # a typo of a one-word noun ("treadmil", "sandles", "ereder" for "e-reader"): a word
        # no category's text has, within the typo distance of the noun's stem
        for i, w in enumerate(st):
            if taken[i] or len(w) < 5 or not w.isalpha() or w in self._df or w in common_words():
                continue
            best = min(((edit_distance(w, n), c) for n, c in self._fuzzy.items()
                        if abs(len(n) - len(w)) <= 1 and n[0] == w[0]), default=None)
            # one edit only: "dehumidifier" is two from "humidifier", and no typo of it
            if best is not None and best[0] <= 1:
                out.append((i, i + 1, best[1]))
                taken[i] = True
        return sorted(out)

    def models_in(self, ws: Sequence[str]) -> list[tuple[int, int, ModelName, bool]]:
        """(start, end, model, line) of every model ``ws`` (tokens) names, the brand before it
        included; see the module docstring. ``line``: a product line was named, more than
        :data:`LINE_MODELS` models equally ("apple watch"), not one model."""
        have = set(ws)
        starts: dict[str, list[int]] = {}
        for i, w in enumerate(ws):
            starts.setdefault(w, []).append(i)
        cands: dict[tuple[str, str], list[tuple[tuple[int, float], int, int, ModelName]]] = {}
        for m in self._models:
            first = m.words[0]
            bw = list(m.brand_words)
            if first not in have:
                if not bw or bw[0] not in have:
                    continue
                # the brand, then the name's last words: "sony xm4" (WH-1000XM4), "lg c4"
                # (OLED evo C4), "away carry-on" (The Carry-On)
                tail = self._tail(ws, bw, m.words)
                if tail is not None:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                continue
            best_run, at, branded = 0, -1, False
            for i in starts[first]:
                run = 0
                while run < len(m.words) and i + run < len(ws) and ws[i + run] == m.words[run]:
                    run += 1
                # the brand right before it ("jbl flip"): one word of the model is enough;
                # the longest run wins ("dyson v8 vs v15 detect": V15 Detect is the second)
                b = i >= len(bw) and ws[i - len(bw):i] == bw
                if (run, b) > (best_run, branded):
                    best_run, at, branded = run, i, b
            named_alone = (len(m.words) == 1 and len(first) > 4 and not first.isdigit()
                           and first not in common_words() and len(self._first.get(first, ())) == 1)
            # two words of the name in a row, one of them a name ("airpods pro"), not plain
            # words ("cast iron" is no Cast Iron Kettlebell, "dash cam" no Dash Cam Mini 2)
            run_ok = best_run >= 2 and not first.isdigit() and (any(
                self._namelike(w) or w.isdigit() for w in m.words[:best_run])
                # the whole name, not a type's words: "ticket to ride", not "orthopedic dog bed"
                or (best_run == len(m.words) >= 3 and not set(stems(m.words)) & self._noun_words))
            if not (branded or run_ok or named_alone):
                tail = self._tail(ws, bw, m.words)  # "g-shock ga2100 or dw5600e"
                if tail is not None:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                continue
            # the name's words said where it is named ("duo crisp" is no Duo 7-in-1 because
            # "10-in-1" came earlier in the question)
            near = set(ws[at:at + len(m.words) + 2])
            hits = sum(1 for w in m.words if w in near)
            score = (hits, hits / len(m.words))  # most words named, then the fewest unnamed
            start = at - len(bw) if branded else at
            if best_run < len(m.words) and m.words[-1] not in ws[start:at + best_run]:
                # "bowflex selecttech 552 vs 1090": 1090's number is said further on
                tail = self._tail(ws, bw, m.words)
                if tail is not None and tail[0] >= at + best_run:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                    continue
            cands.setdefault((norm_brand(m.brand), first), []).append((score, start, at + best_run, m))
        out = []
        for group in cands.values():
            # per place in the question, its best ("dyson v8 vs v15 detect": both)
            for sc, s, e, m in group:
                rivals = [g for g in group if g[1] < e and s < g[2]]
                best = max(g[0] for g in rivals)
                if sc == best:
                    out.append((s, e, m, len([g for g in rivals if g[0] == best]) > LINE_MODELS))
        # a name inside a longer one is the longer one's ("flip 6" of "galaxy z flip 6",
        # "series 9" of "oral-b io series 9")
        out = [x for x in out if not any(o[0] <= x[0] and x[1] <= o[1] and o[1] - o[0] > x[1] - x[0]
                                         for o in out)]
        return sorted(out, key=lambda x: x[0])

    @staticmethod
    def _tail(ws: Sequence[str], bw: Sequence[str], words: Sequence[str]) -> tuple[int, int] | None:
        """(start, end) of the brand followed by at least the name's last two words ("sony
        xm4"); or of the name's last words with a model number ("millennium falcon 75192",
        "dw5600e"), or the number alone where the brand is named too ("bowflex ... vs 1090")."""
        nb = len(bw)
        if not nb or len(words) < 2:
            return None
        for i in range(len(ws) - nb):
            if list(ws[i:i + nb]) != list(bw):
                continue
            for k in range(len(words) - 1, 1, -1):
                if list(ws[i + nb:i + nb + k]) == list(words[-k:]):
                    return i, i + nb + k
        branded = any(list(ws[i:i + nb]) == list(bw) for i in range(len(ws) - nb + 1))
        for k in range(len(words) - 1, 0, -1):
            tail = list(words[-k:])
            if not any(len(w) >= 3 and w.isdigit() for w in tail) or (k == 1 and not branded):
                continue
            for i in range(len(ws) - k + 1):
                if list(ws[i:i + k]) == tail:
                    return i, i + k
        return None

    def _namelike(self, w: str) -> bool:
        """A word that names (a product line's "airpods", "xps"), not a plain or type word."""
        return (not w.isdigit() and len(w) > 3 and w not in common_words()
                and stem1(w) not in self._noun_words and w not in STOPWORDS)

    def resolve(self, text: str, infer: bool = True) -> Resolution:
        """The product types and models ``text`` names (see the module docstring), from the
        strongest evidence found: a noun or model in the first phrase; a model anywhere; a
        noun in a phrase that names what is wanted ("looking | for a tent"); a product line
        or one-type brand; the nearest type to a need (:meth:`classify`); any noun."""
        ws = said_fast(self._base_degree(self._need_typos(tokens(text))))
        st = stems(ws)
        named = self.models_in(ws)
        models = [(s, e, m) for s, e, m, _line in named]
        lines = {m.model for s, e, m, line in named if line}
        in_model = {i for s, e, _ in models for i in range(s, e)}
        # a noun inside a model's name is the model's ("apple watch" is no analog watch)
        matches = [(s, e, c) for s, e, c in self._noun_matches(st)
                   if not in_model.intersection(range(s, e))]
        phrase, opener = self._phrases(ws)
        res = Resolution(models=list(dict.fromkeys(m.model for _, _, m in models if m.model not in lines)),
                         line_models=sorted(lines))
        owned = self._owned(ws, phrase)
        for i, w in enumerate(ws):  # a line's word names its brand ("xbox" Microsoft's)
            if (i not in in_model and i not in owned and w in self._line_brand
                    and self._line_brand[w] not in res.brands):
                res.brands.append(self._line_brand[w])
        ends = {s: e for s, e, _ in matches}
        bare = self._bare_heads(ws, st, matches, in_model)
        kept, acted_on, negated, excluded = self._read_nouns(ws, st, matches, phrase, bare, res)
        need, need_key, need_ws, main_ws = self._need_of(ws, negated, excluded)
        # a need said in full that holds the noun ("my phone dies", "netflix on an old tv")
        # names the type instead of the noun
        if need and len(need_key) > 1:
            kept = [(s, c) for s, c in kept if c == need or not set(st[s:ends[s]]) <= need_key]
        if need:  # "monitor so i can hear the baby": the need's own sense of the noun
            kept = [(s, need if st[ends[s] - 1] in self._heads.get(need, ()) else c)
                    for s, c in kept]
        else:  # "camera to keep an eye on the dog": the sense its other words give it
            kept = [(s, self._sense(st[s:ends[s]], c, need_ws, excluded)) for s, c in kept]
        firsts = [c for s, c in kept if phrase[s] == 0] + [m.category for s, _, m in models
                                                           if phrase[s] == 0]
        res.named_first = bool(firsts)
        if res.accessory and not [c for s, c in kept if phrase[s] == 0]:
            return Resolution(accessory=True)
        # said from the first phrase on, its words together ("surround sound", "light for
        # reading" whose "for" is the need's own; not "moving our 2 year old out")
        at = [i for i, w in enumerate(st) if w in need_key]
        first_said = bool(at) and phrase[min(at)] == 0 and need_key <= {st[i] for i in at} and (
            max(at) - min(at) < len(need_key) + 1)
        chosen = (firsts or [m.category for _, _, m in models]
                  # "surround sound for the living room tv": the need said first, not the tv
                  or ([need] if need and len(need_key) > 1 and first_said else []))
        if not chosen:  # "little speaker i can clip on my bike": a word heading types' nouns
            chosen = self._head_named(bare, phrase, ws, negated, excluded)
            res.named_first = bool(chosen)
        # "surround sound for the living room tv": the need said, not the tv ("for my tv": the
        # customer's own)
        chosen = chosen or [c for s, c in kept if opener[phrase[s]] in WANT_OPENERS and s not in owned]
        if not chosen:  # a product line ("macbook", "kindle") or a one-type brand ("vitamix")
            chosen = self._lines_named(ws, in_model | owned)
        if not chosen and infer:  # "gift for a coffee lover": the types of the interest
            chosen = self._interest(ws, st, need_ws, excluded)
            res.inferred, res.need_words = bool(chosen), 2 if chosen else 0
        if not chosen and infer:  # a need ("boil water for tea"): the nearest type
            chosen = self._nearest(need_ws, main_ws, becomes(ws), excluded)
            res.inferred = bool(chosen)
            if chosen:
                res.need_words = len({w for w in _content(need_ws) if w in self._doc[chosen[0]]})
        if not chosen and owned:  # only a line the customer has ("for my macbook")
            chosen = self._lines_named(ws, in_model)
        if not chosen and need:  # "allergies", "starting to shave": a need said in full
            chosen = [need]
            res.inferred = True
            res.need_words = 2
        if not chosen:
            chosen = [c for _, c in kept] or [c for _, c in acted_on]
        res.categories = list(dict.fromkeys(chosen))
        return res

    def _need_of(self, ws: Sequence[str], negated: set[int], excluded: set[str]
                 ) -> tuple[str | None, frozenset[str], list[str], list[str]]:
        """The need said in full (:meth:`_need_said`) and its stems, the words a need is read
        from (a negated noun's count toward none) and those of the main clause (no "while"
        clause: :func:`during`). A need said only in the "while" clause is when, not what:
        "walk while i'm on zoom calls" asks for no headset."""
        when = during(ws)
        need_ws = [w for i, w in enumerate(ws) if i not in negated]
        main_ws = [w for i, w in enumerate(ws) if i not in negated and i not in when]
        need, key = self._need_said(stems(need_ws), excluded, need_ws)
        if when and key and not key & set(stems(main_ws)) and _content(main_ws):
            need, key = None, frozenset()
        return need, key, need_ws, main_ws

    def _nearest(self, need_ws: Sequence[str], main_ws: Sequence[str], made: Sequence[str],
                 excluded: set[str]) -> list[str]:
        """The nearest type (:meth:`classify`). What a place or thing is turned into says it
        first ("turn the wall into a movie screen": a projector, whatever "living room" says
        of TVs). With a "while" clause, the main clause says what the product does and the
        rest picks among the types it scores ("cleans the floors while i'm at work": a robot
        vacuum; "walk while i'm on zoom calls": a treadmill, no headset)."""
        chosen = self.classify(made, excluded) if made else []
        if not chosen and len(main_ws) < len(need_ws) and _content(main_ws):
            does = {c for c, v in self.classify_scores(main_ws) if v > 0}
            chosen = self.classify(need_ws, excluded | (set(self._doc) - does))
        return chosen or self.classify(need_ws, excluded)

    @staticmethod
    def _phrases(ws: Sequence[str]) -> tuple[list[int], list[str]]:
        """The phrase of each token (its index) and the word that opened each phrase ("for",
        "on", ...; "" for the first)."""
        phrase, opener, n = [], [""], 0
        for i, w in enumerate(ws):
            if w in PHRASE_END and i > 0:
                n += 1
                opener.append(w)
            phrase.append(n)
        return phrase, opener

    def _read_nouns(self, ws: Sequence[str], st: Sequence[str], matches: Sequence[tuple[int, int, str]],
                    phrase: Sequence[int], bare: dict[int, set[str]], res: Resolution
                    ) -> tuple[list[tuple[int, str]], list[tuple[int, str]], set[int], set[str]]:
        """How each noun of the question is meant: (start, type) of the nouns wanted, of those
        acted on ("carry my laptop"), the positions of the negated ones and the types these
        exclude. Sets ``res.accessory`` for an accessory in the first phrase ("phone case");
        narrows ``bare`` to a compound's types ("helmet cam")."""
        kept: list[tuple[int, str]] = []
        acted_on: list[tuple[int, str]] = []
        negated: set[int] = set()
        excluded: set[str] = set()
        for s, e, cat in matches:
            nxt = ws[e] if e < len(ws) else ""
            after = ws[e + 1] if e + 1 < len(ws) else ""
            # "phone case", "tv stand for ...": the accessory; "camera battery powered": not
            # ... but "covers a bigger room", "stands up to": a verb, its object after it
            if nxt in ACCESSORY and (not after or after in PHRASE_END or after in STOPWORDS) and (
                    after not in _VERB_OBJECT):
                if phrase[s] == 0:
                    res.accessory = True
                continue
            before = ws[max(s - 3, 0):s]
            if set(before) & NEGATIONS:
                negated.update(range(s, e))
                # "without wearing a watch": not the watch, nor the types it heads ("gps watch")
                excluded |= {cat} | self._head_types.get(st[e - 1], set())
                continue
            if e in bare:  # "helmet cam for": a modifier of the word after it that ends
                # the noun group, when that word's types have it ("helmet camera" is an action
                # camera's noun); "camera battery powered" is a camera
                mine = {c for c in bare[e] if set(st[s:e]) & self._own.get(c, set())}
                if mine and (not after or after in PHRASE_END or after in STOPWORDS):
                    bare[e] = mine
                    continue
                del bare[e]
            same_phrase = [w for i, w in enumerate(ws[:s]) if phrase[i] == phrase[s]]
            if (set(same_phrase) & OBJECT_BEFORE or set(ws[e:e + 3]) & OBJECT_AFTER
                    or _judged(ws, e) or _as_verb(ws, s, e)):
                acted_on.append((s, cat))  # "carry my laptop": the laptop is carried
                continue
            kept.append((s, cat))
        return kept, acted_on, negated, excluded

    def _base_degree(self, ws: list[str]) -> list[str]:
        """``ws`` with the base of each comparative or superlative said after it when a need
        has that base ("faster" -> "faster fast", "quietest" -> "quietest quiet"): "dry my
        hair faster" says the need "dry hair fast". English words only (no typo: "projecter"),
        no type's noun ("speaker")."""
        out: list[str] = []
        for w in ws:
            out.append(w)
            if (len(w) < 5 or not w.endswith(("er", "est")) or stem1(w) in self._noun_words
                    or w not in common_words()):
                continue
            root = w[:-2] if w.endswith("er") else w[:-3]
            forms = [root[:-1] + "y" if root.endswith("i") else "", root, root + "e",
                     root[:-1] if len(root) > 3 and root[-1] == root[-2] else ""]
            base = next((f for f in forms if len(f) > 2 and stem1(f) in self._need_by_word), None)
            if base:
                out.append(base)
        return out

    def _need_typos(self, ws: list[str]) -> list[str]:
        """``ws`` with each typo of a need's word replaced by it ("bagles every morning" says
        "bagels", a toaster's need): a word of five letters or more that no type's text has
        and no common word, one edit from exactly one need word with its first letter."""
        out = ws
        for i, w in enumerate(ws):
            s = stem1(w)
            if len(s) < 5 or not s.isalpha() or s in self._df or w in common_words():
                continue
            near = {c for d in _one_deleted(s) for c in self._need_deletes.get(d, ()) if c[0] == s[0]}
            near = {c for c in near if edit_distance(s, c) <= 1}
            if len(near) == 1:
                out = out if out is not ws else list(ws)
                out[i] = near.pop()
        return out

    @staticmethod
    def _owned(ws: Sequence[str], phrase: Sequence[int]) -> set[int]:
        """Positions of the words right after a possessive past the first phrase ("with my
        macbook"): what the customer has, which the wanted product goes with."""
        return {i for i in range(1, len(ws)) if phrase[i] > 0 and ws[i - 1] in POSSESSIVES}

    def _lines_named(self, ws: Sequence[str], skip: Iterable[int]) -> list[str]:
        """The types of the product lines ("macbook", "kindle") and one-type brands
        ("vitamix") in ``ws``, the positions in ``skip`` left out."""
        out, skip = [], set(skip)
        for i, w in enumerate(ws):
            if i in skip:
                continue
            grams = [g for k in (3, 2, 1) for g in ("".join(ws[i:i + k]),
                                                     "".join(ws[i:i + k]).removesuffix("s"))]
            c = next((self._brand_words[g] for g in grams if g in self._brand_words), None)
            c = c or self._line_words.get(w)
            if c:
                out.append(c)
        return out

    def _bare_heads(self, ws: Sequence[str], st: Sequence[str], matches: Sequence[tuple[int, int, str]],
                    in_model: set[int]) -> dict[int, set[str]]:
        """Position -> types, of each word that heads types' nouns without being one
        ("speaker", "shoes"): it names the types it is said of as much as a noun's head word
        (bluetooth and smart speakers, soundbars; every kind of shoe), though none alone. Not
        inside a noun or model, not negated, no verb ("driving" is no drive), not an
        accessory's modifier ("speaker stand")."""
        taken = in_model | {i for s, e, _ in matches for i in range(s, e)}
        out = {}
        for i, w in enumerate(st):
            if (w not in self._head_types or i in taken or not ws[i].isalpha()
                    or ws[i] in STOPWORDS or (ws[i].endswith(("ing", "ed")) and w != ws[i])
                    or set(ws[max(i - 3, 0):i]) & NEGATIONS
                    or (i + 1 < len(ws) and ws[i + 1] in ACCESSORY)):
                continue
            out[i] = {c for c in self._df.get(w, ()) if self._doc[c][w] >= NOUN_WEIGHT}
        return out

    def _ranked_among(self, cats: Iterable[str], ws: Sequence[str]) -> list[tuple[str, float]]:
        """``cats`` by their :meth:`classify_scores` for ``ws``, best first (0 when none)."""
        scores = dict(self.classify_scores(ws))
        return sorted(((c, scores.get(c, 0.0)) for c in cats), key=lambda cs: (-cs[1], cs[0]))

    def _head_named(self, bare: dict[int, set[str]], phrase: Sequence[int], ws: Sequence[str],
                    negated: set[int], excluded: set[str]) -> list[str]:
        """The type that a bare head word of the first phrase names ("little speaker i can
        clip on my bike": a bluetooth speaker) that the question's other words score best;
        none when they score none ("shoes for my wedding": no type of shoe is said)."""
        best: tuple[float, str] = (0.0, "")
        for i in sorted(bare):
            cats = bare[i] - excluded
            if phrase[i] or not cats:
                continue
            other = [w for j, w in enumerate(ws) if j != i and j not in negated]
            cat, score = self._ranked_among(cats, other)[0]
            best = max(best, (score, cat))
        return [best[1]] if best[0] > 0 else []

    def _sense(self, noun: Sequence[str], cat: str, ws: Sequence[str], excluded: set[str]) -> str:
        """A one-word noun heading other types' nouns too ("camera") is the one of them its
        other words score :data:`SENSE_LEAD` times higher than ``cat`` ("camera to keep an
        eye on the dog" is a security camera), else ``cat``."""
        if len(noun) != 1 or len(self._head_types.get(noun[0], ())) < 2:
            return cat
        ranked = self._ranked_among(self._head_types[noun[0]] - excluded, ws)
        own = dict(ranked).get(cat, 0.0)
        best, score = ranked[0] if ranked else (cat, 0.0)
        return best if score >= max(CLASSIFY_MIN, SENSE_LEAD * own) else cat

    def _interest(self, ws: Sequence[str], st: Sequence[str], need_ws: Sequence[str],
                  excluded: set[str]) -> list[str]:
        """The type for a person named by what they love ("gift for a coffee lover"): among
        the types whose nouns have the word before (coffee makers), the best scored."""
        for i in range(1, len(ws)):
            if ws[i] in ENTHUSIASTS and ws[i - 1] not in STOPWORDS:
                cats = self._noun_types.get(st[i - 1], set()) - excluded
                if cats:
                    return [self._ranked_among(cats, need_ws)[0][0]]
        return []

    def _need_said(self, st: Sequence[str], excluded: Iterable[str] = (),
                   ws: Sequence[str] = ()) -> tuple[str | None, frozenset[str]]:
        """The type whose need phrase the question says in full (every content word of it),
        the longest such phrase first, and that phrase's stems; (None, empty) when none is.
        The ``excluded`` types (a negated noun's) have none. Of tied phrases, the one said
        most tightly, then first ("light for reading | in bed" is a lamp, no e-reader); of
        types sharing it, the one the question's words ``ws`` (else ``st``) score best ("dry my hair":
        a hair dryer, not a towel)."""
        have = set(st)
        found: dict[frozenset[str], set[str]] = {}
        for key in {k for w in have for k in self._need_by_word.get(w, ())}:
            cats = self._need_phrases[key] - set(excluded)
            # one word is a need only when few types have it ("allergies", not "work")
            if (not cats or not key <= have
                    or (len(key) == 1 and len(self._df.get(next(iter(key)), ())) > 3)
                    or (key in self._verbatim and not _in_order(self._verbatim[key], st))):
                continue
            found[key] = cats
        if not found:
            return None, frozenset()
        longest = max(len(k) for k in found)

        def place(key: frozenset[str]) -> tuple[int, int]:
            at = [st.index(w) for w in key]
            return max(at) - min(at), min(at)

        tied = [k for k in found if len(k) == longest]
        best = min(place(k) for k in tied)
        keys = [k for k in tied if place(k) == best]
        cats = {c for k in keys for c in found[k]}
        cat = next(iter(cats)) if len(cats) == 1 else self._ranked_among(cats, ws or st)[0][0]
        return cat, next(k for k in keys if cat in found[k])

    def classify(self, ws: Sequence[str], excluded: Iterable[str] = ()) -> list[str]:
        """The nearest type to the need ``ws`` says (:meth:`classify_scores`), the
        ``excluded`` types (a negated noun's) left out; none when it is not clear."""
        out = set(excluded)
        ranked = [cs for cs in self.classify_scores(ws) if cs[0] not in out]
        if not ranked or ranked[0][1] < CLASSIFY_MIN:
            return []
        if len(ranked) > 1 and ranked[0][1] < CLASSIFY_LEAD * ranked[1][1]:
            return []
        # most of the need's words must be the type's: one shared word ("lawn" of "lawn
        # chair") does not make a lawn mower a camping chair
        content = set(_content(ws))
        doc = self._doc[ranked[0][0]]
        have = {w for w in content if w in doc}
        if content and (len(have) < CLASSIFY_COVER * len(content)
                        or len(have) < min(CLASSIFY_WORDS, len(content))):
            return []
        return [ranked[0][0]]

    def classify_scores(self, ws: Sequence[str]) -> list[tuple[str, float]]:
        """The category whose words (nouns and names, uses, types and descriptions of its
        models) best match the stems ``st``, when it leads the next by :data:`CLASSIFY_LEAD`
        and scores at least :data:`CLASSIFY_MIN`; else none."""
        qs = set(_content(ws))
        score: dict[str, float] = {}
        n = max(len(self._doc), 1)
        for w in qs:
            df = len(self._df.get(w, ()))
            if not df:
                continue
            idf = math.log(1 + n / df) ** IDF_POWER  # >1: one rare word ("shave") outweighs
            # several common ones ("who", "starting")
            for c in self._df[w]:
                tf = self._doc[c][w]
                score[c] = score.get(c, 0.0) + idf * tf / (tf + 1.0)
        return sorted(score.items(), key=lambda kv: -kv[1])

    def near(self, text: str, n: int = 3) -> list[str]:
        """Categories whose nouns or names share a word (or a typo of one) with ``text``,
        nearest first; empty when none does."""
        from rufus.retrieval.spelling import edit_distance, max_typo_distance
        qs = [w for w in stems(tokens(text)) if w not in STOPWORDS and not w.isdigit() and len(w) > 2]
        score: dict[str, float] = {}
        for noun, cat in self._nouns:
            for w in qs:
                for nw in noun:
                    if w == nw:
                        s = 2.0 / len(noun)
                    elif (lim := max_typo_distance(nw)) and edit_distance(w, nw) <= lim:
                        s = 1.0 / len(noun)
                    else:
                        continue
                    score[cat] = max(score.get(cat, 0.0), s)
        return sorted(score, key=lambda c: (-score[c], -self.count.get(c, 0)))[:n]
