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

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import CategorySpec
from rufus.retrieval.model_names import ModelIndex, ModelName, name_aliases
from rufus.retrieval.needs import NOUN_WEIGHT, NeedIndex, WordWeights, content_stems
from rufus.retrieval.question_words import (
    ACCESSORY,
    NEGATIONS,
    OBJECT_AFTER,
    OBJECT_BEFORE,
    PHRASE_END,
    POSSESSIVES,
    VERB_OBJECT,
    WANT_OPENERS,
    as_verb,
    becomes,
    judged,
    said_fast,
    stems,
    tokens,
)
from rufus.retrieval.spelling import common_words, edit_distance

__all__ = ["ModelName", "Resolution", "Taxonomy", "said_fast", "tokens"]


def _majority(counts: dict[str, Counter[str]], ok: Callable[[str], bool]) -> dict[str, str]:
    """word -> the category holding at least two thirds of its models/brands."""
    out = {}
    for w, c in counts.items():
        cat, n = c.most_common(1)[0]
        if ok(w) and n * 3 >= 2 * sum(c.values()):
            out[w] = cat
    return out


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


SIZE_OF = frozenset({"size", "sized", "style", "styled"})


def _together(at: Sequence[int], n: int) -> bool:
    """Whether the positions ``at`` of a phrase's ``n`` content words are said together: no
    more than two other words among them ("screen that looks like paper")."""
    return max(at) - min(at) <= n + 1


class Taxonomy(NeedIndex, ModelIndex):
    """The catalog's product types (nouns, names, spec keys and their types), brands per
    category and model names; built once per index (:meth:`from_products`). Needs are read by
    :class:`NeedIndex` (rufus/retrieval/needs.py), model names by :class:`ModelIndex`
    (rufus/retrieval/model_names.py)."""

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
        self._owners: dict[str, set[str]] = {}  # a name's word -> the brands using it
        self._word_models: dict[str, int] = {}  # a name's word -> how many models have it
        self._word_texts: dict[str, int] = {}  # a name's word -> how many models' texts say it
        self.model_brand: dict[str, str] = {}  # model -> its brand
        self._first: dict[str, set[str]] = {}  # a model's first word -> brands using it
        self._first_models: dict[str, set[str]] = {}  # a model's first word -> the models
        self._by_brand_word: dict[tuple[str, str], set[str]] = {}  # (brand, word) -> models
        self._line_words: dict[str, str] = {}  # a product line's word -> its one category
        self._line_brand: dict[str, str] = {}  # a product line's word -> its one brand
        self._brand_words: dict[str, str] = {}  # a one-type brand's word -> its category
        self._doc: dict[str, WordWeights] = {}  # category -> weighted stems (classify)
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
        """One pass over the listings, then the lookups ``resolve`` reads."""
        t = cls()
        t.specs = {s.key: s for s in specs}
        models = t._read_listings(products)
        t._index_nouns(t._declared_nouns())
        t._index_models(list(models.values()))
        t._index_brands()
        t._index_docs()
        return t

    def _read_listings(self, products: Iterable[Product]) -> dict[str, ModelName]:
        """Counts, attribute types and values, brands per category; each model's name."""
        models: dict[str, ModelName] = {}
        for p in products:
            c = p.category
            self.count[c] = self.count.get(c, 0) + 1
            types = self.attr_types.setdefault(c, {})
            vals = self.values.setdefault(c, {})
            for k, v in p.attributes.items():
                kind = ("boolean" if isinstance(v, bool) else "list" if isinstance(v, list)
                        else "number" if isinstance(v, int | float) else "string")
                types.setdefault(k, kind)
                if isinstance(v, str):
                    vals.setdefault(k, set()).add(v)
            if p.brand:
                self.brands.setdefault(c, {}).setdefault(norm_brand(p.brand), p.brand)
            if p.model and p.model not in models:
                values = " ".join(v for v in p.attributes.values() if isinstance(v, str))
                self._texts.append((c, f"{p.title} {p.description} {values}"))
                ws = tokens(p.model)
                bw = tokens(p.brand)
                rest = ws[len(bw):] if ws[:len(bw)] == bw else ws
                if rest:
                    models[p.model] = ModelName(p.model, p.brand, c, tuple(rest), tuple(bw))
        return models

    def _declared_nouns(self) -> dict[tuple[str, ...], str]:
        """Stemmed noun -> category: each type's declared nouns, its key and its name."""
        nouns: dict[tuple[str, ...], str] = {}
        for c in self.count:
            spec = self.specs.get(c)
            own = list(spec.nouns) if spec else []
            own.append(c.replace("_", " "))
            if spec:
                own.append(spec.name)
            for n in own:
                key = tuple(stems(tokens(n)))
                if key and key not in nouns:
                    nouns[key] = c
        return nouns

    def _index_models(self, models: list[ModelName]) -> None:
        """The models (and the other names shoppers give them), their brands, and the
        product lines' words (one category, one brand)."""
        models = [*models, *(a for m in models for a in name_aliases(m))]
        self._models = models
        self._index_words(models, [t for _, t in self._texts])
        self.model_brand = {m.model: m.brand for m in models}
        firsts: dict[str, Counter[str]] = {}
        for m in models:
            self._first.setdefault(m.words[0], set()).add(norm_brand(m.brand))
            self._first_models.setdefault(m.words[0], set()).add(m.model)
            for x in m.words:
                self._by_brand_word.setdefault((norm_brand(m.brand), x), set()).add(m.model)
            firsts.setdefault(m.words[0], Counter())[m.category] += 1
        self._line_words = _majority(firsts, self._namelike)
        line_brands: dict[str, set[str]] = {}
        for m in models:
            if self._namelike(m.words[0]):
                line_brands.setdefault(m.words[0], set()).add(m.brand)
        self._line_brand = {w: next(iter(b)) for w, b in line_brands.items() if len(b) == 1}

    def _index_brands(self) -> None:
        """The brands that sell one product type here ("vitamix"): naming one names it."""
        brand_cats: dict[str, Counter[str]] = {}
        for c, bs in self.brands.items():
            for nb in bs:
                brand_cats.setdefault(nb, Counter())[c] += 1
        self._brand_words = {nb: c for nb, c in _majority(brand_cats, lambda w: len(w) > 2).items()
                             if sum(brand_cats[nb].values()) == 1 and nb not in common_words()}

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
        """The first noun a category is called by ("air fryer"): how a sentence names one."""
        spec = self.specs.get(category)
        return spec.nouns[0] if spec and spec.nouns else category.replace("_", " ")

    def curated(self) -> bool:
        """Whether every category of the catalog has its nouns declared (the default catalog;
        a user catalog without category lines is not)."""
        return bool(self.count) and all(c in self.specs for c in self.count)

    def departments(self) -> list[str]:
        """The departments of the catalog's types, first seen first (the no-results reply)."""
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

    @staticmethod
    def _not_for(models: list[tuple[int, int, ModelName]], kept: Sequence[tuple[int, str]],
                 res: Resolution) -> list[tuple[int, int, ModelName]]:
        """The models named, less those whose name, shared by several models, comes right
        before a noun of another type ("ps5 controller", "iphone charger": what the thing is
        for, not what is wanted; "nanit pro camera", one model, is it); ``res.models`` too."""
        nouns = dict(kept)
        span = Counter((s, e) for s, e, _ in models)
        gone = {m.model for s, e, m in models if span[s, e] > 1 and e in nouns and nouns[e] != m.category}
        res.models = [x for x in res.models if x not in gone]
        return [x for x in models if x[2].model not in gone]

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
        # a phrase word inside a noun ("carry on") opens no phrase
        phrase, opener = self._phrases(ws, {i for s, e, _ in matches for i in range(s + 1, e)})
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
        kept = self._kept_senses(kept, st, ends, need, need_key, need_ws, excluded)
        models = self._not_for(models, kept, res)
        # a need said in full, several words ("fender bender", "disney plus"): its words name
        # no model or product line
        need_at = {i for i, w in enumerate(st) if w in need_key} if need and len(need_key) > 1 \
            else set()
        if need_at:
            inside = {m.model for s, e, m in models if set(range(s, e)) <= need_at}
            models = [x for x in models if x[2].model not in inside]
            res.models = [x for x in res.models if x not in inside]
        firsts = [c for s, c in kept if phrase[s] == 0] + [m.category for s, _, m in models
                                                           if phrase[s] == 0]
        # "our bedroom tv is 10 years old, what do i plug into it", "my tv speakers are so
        # quiet": the customer's own thing first; what is wanted is the need said in full,
        # else the type the question's words score far above the one owned
        if firsts and all(set(ws[max(0, s - 2):s]) & POSSESSIVES for s, c in kept
                          if phrase[s] == 0) and not any(phrase[s] == 0 for s, _, _ in models):
            firsts = self._for_owned(firsts, need, need_ws, excluded)
        res.named_first = bool(firsts)
        # an accessory asked for ("case for my airpods"), unless the first phrase names what
        # is wanted ("sonos arc or bose smart soundbar? my tv stand is tiny")
        if res.accessory and not firsts:
            return Resolution(accessory=True)
        # said from the first phrase on, its words together ("surround sound", "light for
        # reading" whose "for" is the need's own; not "moving our 2 year old out")
        at = [i for i, w in enumerate(st) if w in need_key]
        first_said = bool(at) and phrase[min(at)] == 0 and need_key <= {st[i] for i in at} and (
            _together(at, len(need_key)))
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
            chosen = self._lines_named(ws, in_model | owned | need_at)
        if not chosen and infer:
            chosen = self._inferred(res, ws, st, (need, need_key, need_at, need_ws, main_ws),
                                    excluded)
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

    def _kept_senses(self, kept: list[tuple[int, str]], st: Sequence[str], ends: dict[int, int],
                     need: str | None, need_key: set[str] | frozenset[str],
                     need_ws: Sequence[str], excluded: set[str]) -> list[tuple[int, str]]:
        """The nouns kept, each in the sense the question gives it."""
        # a need said in full, its words together, that holds the noun ("my phone dies",
        # "netflix on an old tv") names the type instead of the noun (not "i travel a lot for
        # work, want a laptop", whose words the need "travel with laptop" has far apart)
        at = [i for i, w in enumerate(st) if w in need_key]
        if need and len(need_key) > 1 and at and _together(at, len(need_key)):
            kept = [(s, c) for s, c in kept if c == need or not set(st[s:ends[s]]) <= need_key]
        if need:  # "monitor so i can hear the baby": the need's own sense of the noun
            return [(s, need if st[ends[s] - 1] in self._heads.get(need, ()) else c)
                    for s, c in kept]
        # "camera to keep an eye on the dog": the sense its other words give it
        return [(s, self._sense(st[s:ends[s]], c, need_ws, excluded)) for s, c in kept]

    def _inferred(self, res: Resolution, ws: Sequence[str], st: Sequence[str],
                  need_of: tuple[Any, ...], excluded: set[str]) -> list[str]:
        """Types inferred where the question names none: an interest's, a need said in full
        that scores near the top, or the nearest type to the need (``res`` says which)."""
        need, need_key, need_at, need_ws, main_ws = need_of
        chosen = self._interest(ws, st, need_ws, excluded)  # "gift for a coffee lover"
        if chosen:
            res.inferred, res.need_words = True, 2
            return chosen
        if need and need_at and self._need_near(need, need_key, need_ws):
            # a need said in full, several of its words ("keep an eye on her": a baby
            # monitor), whose type the question's words score about as high as the nearest
            res.inferred, res.need_words = True, 2
            return [need]
        chosen = self._nearest(need_ws, main_ws, becomes(ws), excluded)  # "boil water for tea"
        res.inferred = bool(chosen)
        if chosen:
            res.need_words = len({w for w in content_stems(need_ws) if w in self._doc[chosen[0]]})
        return chosen

    @staticmethod
    def _phrases(ws: Sequence[str], inside: set[int] | frozenset[int] = frozenset()
                 ) -> tuple[list[int], list[str]]:
        """The phrase of each token (its index) and the word that opened each phrase ("for",
        "on", ...; "" for the first); a word at an ``inside`` position opens none."""
        phrase, opener, n = [], [""], 0
        for i, w in enumerate(ws):
            if w in PHRASE_END and i > 0 and i not in inside:
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
                    after not in VERB_OBJECT):
                if phrase[s] == 0:
                    res.accessory = True
                continue
            # "carry-on size backpack", "queen sized comforter": a noun that sizes the one
            # after it is its modifier, not what is wanted
            if nxt in SIZE_OF and any(e < s2 <= e + 2 and phrase[s2] == phrase[s]
                                      for s2, _, _ in matches):
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
            # the words before it in its phrase, another noun's own left out ("carry on
            # sized backpack" carries nothing)
            same_phrase = [w for i, w in enumerate(ws[:s]) if phrase[i] == phrase[s]
                           and not any(s2 <= i < e2 for s2, e2, _ in matches)]
            if (set(same_phrase) & OBJECT_BEFORE or set(ws[e:e + 3]) & OBJECT_AFTER
                    or judged(ws, e) or as_verb(ws, s, e)):
                acted_on.append((s, cat))  # "carry my laptop": the laptop is carried
                continue
            kept.append((s, cat))
        return kept, acted_on, negated, excluded

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

    def _head_named(self, bare: dict[int, set[str]], phrase: Sequence[int], ws: Sequence[str],
                    negated: set[int], excluded: set[str]) -> list[str]:
        """The type that a bare head word of the first phrase names ("little speaker i can
        clip on my bike": a bluetooth speaker) that the question's other words score best;
        none when they score none ("shoes for my wedding": no type of shoe is said)."""
        best: tuple[float, str] = (0.0, "")
        for i in sorted(bare):
            cats = bare[i] - excluded
            if phrase[i] or not cats or (i and ws[i - 1] in POSSESSIVES):
                continue  # "my bag is getting heavy": the customer's own, not what is wanted
            other = [w for j, w in enumerate(ws) if j != i and j not in negated]
            cat, score = self._ranked_among(cats, other)[0]
            best = max(best, (score, cat))
        return [best[1]] if best[0] > 0 else []

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
