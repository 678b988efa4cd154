"""The catalog's own words, built once per index: which words it knows, what a typo of one is,
which names are its brands, whether a listing is what a query asks for, and which categories a
query is near. The grounded search (rufus/retrieval/search.py) asks it; it searches nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.catalog import Product
from rufus.retrieval.query import GENERIC, Ask, product_phrase
from rufus.retrieval.spelling import (
    _QUERY_WORD,
    CONTRACTIONS,
    _deletes,
    category_display,
    common_words,
    edit_distance,
    max_typo_distance,
    stem1,
    words,
)


class Vocabulary:
    """The catalog's own words (titles, brands, categories and descriptions, since FTS5
    indexes all four), built once per index: what counts as a known word, what a typo's
    correction is, which names are brands, and which categories a query is near."""

    def __init__(self) -> None:
        self.freq: Counter[str] = Counter()  # word -> products containing it
        self.brands: dict[str, str] = {}  # norm_brand(brand) -> display brand
        self.brand_count: Counter[str] = Counter()  # norm_brand(brand) -> products
        self._cats: dict[str, int] = {}  # word -> bit mask of the categories it occurs in
        self._stems: set[str] = set()
        self._title_stems: set[str] = set()
        self._stem_cats: dict[str, int] = {}  # Porter step-1 stem -> category mask
        # correction -> (frequency, category mask, derived singular)
        self._targets: dict[str, tuple[int, int, bool]] = {}
        self._deletes: dict[str, list[str]] = {}  # symmetric-delete index of the targets
        self.categories: list[str] = []  # category keys, first seen first
        self.category_count: Counter[str] = Counter()
        self._category_words: list[Counter[str]] = []  # per category: stem -> products

    @classmethod
    def from_products(cls, products: Iterable[Product]) -> Vocabulary:
        """One pass over the listings (every one: the catalog's words are all it knows)."""
        v = cls()
        cat_index: dict[str, int] = {}
        for p in products:
            ci = cat_index.get(p.category)
            if ci is None:
                ci = cat_index[p.category] = len(v.categories)
                v.categories.append(p.category)
                v._category_words.append(Counter())
            bit = 1 << ci
            v.category_count[p.category] += 1
            nb = norm_brand(p.brand)
            if nb:
                v.brands.setdefault(nb, p.brand)
                v.brand_count[nb] += 1
            cat_text = p.category.replace("_", " ")
            ws = set(words(f"{p.title} {p.brand} {cat_text} {p.description}"))
            v.freq.update(ws)
            for w in ws:
                v._cats[w] = v._cats.get(w, 0) | bit
            v._category_words[ci].update(set(words(f"{p.title} {cat_text}")))
        v._index()
        return v

    def _index(self) -> None:
        """The lookups built from the counts: stems, typo targets and their delete index,
        so that :meth:`correct` and :meth:`fits` cost a few dict reads per word."""
        stemmed = []
        for counts in self._category_words:  # word -> stem once per word, not per product
            c: Counter[str] = Counter()
            for w, n in counts.items():
                c[stem1(w)] += n
            stemmed.append(c)
        self._category_words = stemmed
        # stems of titles and categories: a product word only descriptions have ("frying
        # pan" in a cookware set's) is looked for in descriptions too (Vocabulary.fits)
        self._title_stems = {w for c in stemmed for w in c}
        self._stem_cats = {}
        for w, m in self._cats.items():
            s = stem1(w)
            self._stem_cats[s] = self._stem_cats.get(s, 0) | m
        self._stems = set(self._stem_cats)
        brand_words = {w for b in self.brands.values() for w in words(b)}
        targets: dict[str, tuple[int, int, bool]] = {}
        for w, n in self.freq.items():
            if len(w) < 3 or not w.isalpha() or w in STOPWORDS:
                continue
            targets[w] = (n, self._cats[w], False)
        for w, n in self.freq.items():
            # the singular of a plural the catalog has ("beginners" -> "beginner"): FTS5 still
            # matches it, so "beginer" can become "beginner"; ranked after real words, and
            # never from a brand ("adidas" is not a plural)
            if (w in targets and len(w) > 4 and w.endswith("s") and w not in brand_words
                    and not w.endswith(("ss", "us", "is", "ies"))):
                single = w[:-2] if w.endswith("sses") else w[:-1]
                if single not in targets or targets[single][2]:
                    f1, m1, _ = targets.get(single, (0, 0, True))
                    targets[single] = (f1 + n, m1 | self._cats[w], True)
        self._targets = targets
        deletes: dict[str, list[str]] = {}
        for w in targets:
            for d in _deletes(w, 2):
                deletes.setdefault(d, []).append(w)
        self._deletes = deletes

    # -------------------------------------------------------------- words
    def known(self, word: str) -> bool:
        """In the catalog as written or as FTS5's stemmer sees it ("shoe" for "shoes")."""
        return word in self.freq or stem1(word) in self._stems

    def _mask(self, word: str) -> int:
        """The categories ``word`` occurs in (as a bit mask): a correction must share one."""
        if word in self._cats:
            return self._cats[word]
        if word in self._targets:
            return self._targets[word][1]
        return self._stem_cats.get(stem1(word), 0)

    def correct(self, term: str, context: Sequence[str] = ()) -> str | None:
        """The catalog word ``term`` is a typo of, or None (known, a common English word,
        too short, a number, a stopword, or nothing close). Closest first, then the most
        frequent. ``context``: the query's other words; when some are known, a correction
        must share a category with one of them, so "warm jacket" does not become "wars
        jacket" (LEGO Star Wars)."""
        t = term.lower().replace("'", "").replace("\u2019", "")
        limit = max_typo_distance(t)
        if (not limit or not t.isalpha() or t in STOPWORDS or self.known(t)
                or t in common_words() or t in CONTRACTIONS):
            return None
        found: set[str] = set()
        for d in _deletes(t, limit):
            found.update(self._deletes.get(d, ()))
        ranked = []
        for c in found:
            if abs(len(c) - len(t)) <= limit and (dist := edit_distance(t, c)) <= limit:
                freq, _mask, derived = self._targets[c]
                ranked.append((dist, derived, -freq, c))
        ranked.sort()
        masks = [m for w in {w.lower() for w in context} - {t} if (m := self._mask(w))]
        for *_rank, cand in ranked:
            if not masks or any(self._targets[cand][1] & m for m in masks):
                return cand
        return None

    def spell(self, query: str, keep: Callable[[str], bool] | None = None
              ) -> tuple[str, dict[str, str]]:
        """``query`` with each typo replaced by its catalog word (other words and order kept),
        and the corrections made (typo, lower case -> word): the search says each one. A
        word ``keep`` says is known elsewhere (a need's: "fender bender") is no typo."""
        context = [w for w in words(query) if w not in STOPWORDS]
        corrected: dict[str, str] = {}
        parts: list[str] = []
        at = 0
        for m in _QUERY_WORD.finditer(query):
            if keep is not None and keep(m.group(0).lower()):
                continue
            fixed = self.correct(m.group(0), context)
            if fixed is not None:
                parts += [query[at:m.start()], fixed]
                at = m.end()
                corrected[m.group(0).lower()] = fixed
        parts.append(query[at:])
        return "".join(parts), corrected

    def brand(self, name: str) -> str | None:
        """The catalog brand ``name`` names (case, spaces and punctuation ignored, a leading
        "the" optional), or a typo of one (same distance rule as words), else None."""
        n = norm_brand(name)
        if not n:
            return None
        no_the = norm_brand(name.strip()[4:]) if name.strip().lower().startswith("the ") else n
        for key in (n, no_the, "the" + n):
            if key in self.brands:
                return self.brands[key]
        limit = max_typo_distance(n)
        if not limit or n.isdigit():
            return None
        best = min(((d, -self.brand_count[b], b) for b in self.brands
                    if len(b) >= 4 and abs(len(b) - len(n)) <= limit
                    and (d := edit_distance(n, b)) <= limit), default=None)
        return self.brands[best[2]] if best else None

    def ask(self, query: str) -> Ask:
        """What ``query`` asks for (:class:`Ask`): the last word of its product phrase that
        is no brand, no generic word ("gifts") and not a single letter; a catalog brand
        named in the phrase (one word or two: "new balance")."""
        phrase = product_phrase(query)
        brand = None
        for i, w in enumerate(phrase):
            for key in (w + phrase[i + 1] if i + 1 < len(phrase) else None, w):
                if key and key in self.brands:
                    brand = brand or self.brands[key]
        brand_words = {w for w in phrase if w in self.brands}
        heads = [w for w in phrase if len(w) > 1 and w not in brand_words]
        while heads and heads[-1] in GENERIC:
            heads.pop()
        return Ask(head=heads[-1] if heads else None, brand=brand)

    def fits(self, product: Product, asks: Sequence[Ask], brand: str | None = None) -> bool:
        """Whether ``product`` is what one of ``asks`` asks for. Search matches any one word,
        so "kids bike 16 inch" found iPhone 16 and "dog harness for a 70 lb dog" SPF 70
        sunscreen: a card must have the product word in its title or category (as FTS5
        stems it). A product word the catalog lacks (a product line: "brooks adrenaline
        gts") is met by the brand named with it (or ``brand``, the plan's), else by nothing.
        A query that names no product word ("gifts for teachers") takes every result."""
        if not asks:
            return True
        have: set[str] | None = None  # the title's and category's stems, once
        described: set[str] | None = None  # the description's, once, only if needed
        for a in asks:
            if a.head is None:
                return True
            if self.known(a.head):
                if have is None:
                    text = f"{product.title} {product.category.replace('_', ' ')}"
                    have = {stem1(w) for w in words(text)}
                head = stem1(a.head)
                if head in have:
                    return True
                if head not in self._title_stems:
                    if described is None:
                        described = {stem1(w) for w in words(product.description)}
                    if head in described:
                        return True
            elif (a.brand or brand) and norm_brand(product.brand) == norm_brand(a.brand or brand or ""):
                return True
        return False

    def categories_near(self, terms: Sequence[str], n: int = 3) -> list[str]:
        """Display names of the (at most ``n``) categories nearest to ``terms``: the share of
        each category's products with a term in the title (plus one when the category's name
        has it); none when no category has a term (not the largest ones whatever was asked)."""
        stems = {stem1(w) for t in terms for w in words(t) if w not in STOPWORDS}
        score: dict[str, float] = {}
        for i, key in enumerate(self.categories):
            key_stems = {stem1(w) for w in words(key.replace("_", " "))}
            s = sum(self._category_words[i][t] / self.category_count[key] + (t in key_stems)
                    for t in stems)
            if s > 0:
                score[key] = s
        near = sorted(score, key=lambda c: -score[c])[:n]
        return [category_display(k) for k in near]
