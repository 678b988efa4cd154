"""Ground the planner's search plan in the catalog before searching, so a plan never hides
products the catalog has.

Retrieval applies the plan's filters as hard constraints, and FTS5 matches words exactly
(after stemming). Measured failures that left customers with no product cards: a brand
filter that is no brand ("wireles") or a product line ("adrenaline"), a price cap misread
from "under 1k" as 1.0, and typos ("vaccum") that match nothing. :class:`GroundedSearch`
fixes each with the catalog's own data and says, in system-written notes, what it changed:

1. brand: the catalog's brand (or a typo of one) is the filter; anything else becomes query words;
2. price: the cap the customer stated in the question wins over the plan's (currencies converted);
3. typos: query words unknown to the catalog are corrected against its vocabulary;
4. relaxation: if nothing matches, the brand filter, the price cap, then both are dropped;
5. last try: the question's own content words, no filters.

At every step a result must be what the query asks for (:meth:`Vocabulary.fits`): search
matches any one word, and "kids bike 16 inch" found iPhone 16.

When even that finds nothing, :meth:`GroundedSearch.no_results_reply` is the reply (never
model text): what was searched and which catalog categories are nearest.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rufus.retrieval import constraints
from rufus.retrieval.base import (
    MAX_QUERY_CHARS,
    STOPWORDS,
    Filters,
    ProductSource,
    Retriever,
    check_queries,
    norm_brand,
    query_terms,
)
from rufus.retrieval.catalog import Product
from rufus.retrieval.constraints import Constraint, parse_price_range
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
from rufus.retrieval.taxonomy import Taxonomy
from rufus.retrieval.taxonomy import tokens as taxonomy_tokens

# ------------------------------------------------------------------ stated price caps

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
    r"person|people|players?|years?|yrs?|months?|weeks?|days?|hours?|hrs?|minutes?|mins?|"
    r"percent|degrees?|sq|x|series|gen|th|st|nd|rd)(?![a-z])|%)")


@dataclass(frozen=True)
class Price:
    """A price stated in text."""

    amount: float  # in the stated currency
    currency: str  # "USD", "EUR", "GBP", ...
    usd: float  # converted with USD_PER (the catalog is in USD)


def _currency(marker: str | None) -> str:
    return _CURRENCY_OF.get(re.sub(r"\s+", " ", marker), "USD") if marker else "USD"


def parse_price_cap(text: str) -> Price | None:
    """The first price cap stated in ``text`` ("under $80", "below 50 dollars", "under 1k",
    "$1,200 max", "less than 1.5k", "budget of 300", "under €30"), or None. Only amounts
    with a cap cue count: "65 inch tv", "gts 23", "iphone 15", "size 10" are not caps, and
    neither is a cue before a spec ("under 65 inch", "under 20 pounds")."""
    low = text.lower().replace("\u2019", "'")
    for m in _MENTION.finditer(low):
        pre, post = m.group("pre"), m.group("post")
        before, after = low[:m.start()], low[m.end():]
        if not (_CUE_BEFORE.search(before) or _CUE_AFTER.match(after)):
            continue
        if not (pre or post) and _UNIT.match(after):
            continue
        # "1,200" is grouped thousands (matched first); "1,5k" and "9,99" a decimal comma
        amount = float(m.group("num").replace(",", "") + (m.group("dec") or "").replace(",", "."))
        if m.group("k"):
            amount *= 1000
        cur = _currency(pre) if pre else _currency(post)
        return Price(amount=amount, currency=cur, usd=round(amount * USD_PER[cur], 2))
    return None



# ------------------------------------------------------------------ what a query asks for

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
_GENERIC = frozenset("""
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


def _stems_of(text: str) -> set[str]:
    """The search terms of ``text`` as FTS5 stems them: the customer's own words."""
    return {stem1(w) for w in query_terms(text)}


def without_generic(query: str, ask: Ask) -> str:
    """``query`` without the generic words of its product phrase when it names a product
    ("camping essentials" -> "camping": "essentials" found Amazon Essentials T-shirts)."""
    if ask.head is None:
        return query
    phrase = set(product_phrase(query))
    kept = [w for w in query.split() if not (w.lower() in _GENERIC and w.lower() in phrase)]
    return " ".join(kept) if kept else query


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
        while heads and heads[-1] in _GENERIC:
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


# ------------------------------------------------------------------ the search

# A question the planner took for small talk is searched when it names a product type, or
# describes a need with this many of a type's words (Taxonomy.classify).
NEED_WORDS_FOR_SEARCH = 2


# A follow-up that refers to the earlier products ("any of those", "only ones that ...").
_ANAPHOR = re.compile(r"\b(?:ones|those|these|them|they|any\s+of|any\s+(?:with|that|for|in)|"
                      r"any\s+\w+\s+ones|just\s+the|only\s+the)\b|^\s*which\s+(?:work|are|is|have|come)\b")


@dataclass(frozen=True)
class SearchOutcome:
    products: list[Product]
    queries: list[str]  # the queries finally searched (after grounding / spelling)
    filters: Filters  # the filters finally applied
    corrected: dict[str, str] = field(default_factory=dict)  # typo -> correction applied
    relaxed: list[str] = field(default_factory=list)  # plan filters dropped, "brand" before "max_price"
    notes: list[str] = field(default_factory=list)  # customer-facing, system-written
    requested: Filters = field(default_factory=Filters)  # the grounded filters before relaxing
    categories: list[str] = field(default_factory=list)  # product types searched (empty: any)
    constraints: list[Constraint] = field(default_factory=list)  # stated, and met by every card
    dropped: list[Constraint] = field(default_factory=list)  # stated, relaxed: no card met them
    models: list[str] = field(default_factory=list)  # the models the question names, in order


def _money(usd: float) -> str:
    return f"${usd:,.0f}" if abs(usd - round(usd)) < 0.005 else f"${usd:,.2f}"


def _safe(text: str, limit: int = 40) -> str:
    """Plan or customer text shown in a system-written sentence: words only, short."""
    s = " ".join(re.sub(r"[^\w\s'&.-]", " ", text).split())
    return s if len(s) <= limit else s[:limit - 3].rstrip() + "..."


def _with_words(query: str, extra: Sequence[str]) -> str:
    have = set(words(query))
    add = [w for w in extra if w not in have]
    return " ".join([query.strip(), *add]) if add else query


class GroundedSearch:
    """The plan's search, grounded in the catalog (see the module docstring). Thread-safe;
    the vocabulary is built once, on first use, from the retriever's products unless given."""

    def __init__(self, retriever: Retriever, vocabulary: Vocabulary | None = None,
                 taxonomy: Taxonomy | None = None) -> None:
        if vocabulary is None and not isinstance(retriever, ProductSource):
            raise TypeError(f"{type(retriever).__name__} cannot list its products "
                            "(no iter_products()): pass a Vocabulary")
        self.retriever = retriever
        self._vocabulary = vocabulary
        self._taxonomy = taxonomy
        self._lock = threading.Lock()

    @property
    def taxonomy(self) -> Taxonomy:
        """The product types (rufus/retrieval/taxonomy.py), built on first use with the
        vocabulary; empty where the engine cannot list its products."""
        if self._taxonomy is None:
            with self._lock:
                if self._taxonomy is None:
                    if isinstance(self.retriever, ProductSource):
                        cats = getattr(self.retriever, "categories", None)
                        specs = cats() if callable(cats) else []
                        self._taxonomy = Taxonomy.from_products(self.retriever.iter_products(), specs)
                    else:
                        self._taxonomy = Taxonomy()
        return self._taxonomy

    @property
    def vocabulary(self) -> Vocabulary:
        """Built on first use (about 0.5 s for 24,000 products from the SQLite index); read it
        at start-up to keep that off the first request."""
        if self._vocabulary is None:
            with self._lock:
                if self._vocabulary is None:
                    assert isinstance(self.retriever, ProductSource)
                    self._vocabulary = Vocabulary.from_products(self.retriever.iter_products())
        return self._vocabulary

    def spell(self, query: str, corrected: dict[str, str]) -> str:
        """``query`` with each typo replaced by its catalog word (other words and order kept);
        records the corrections in ``corrected``."""
        vocab = self.vocabulary
        context = [w for w in words(query) if w not in STOPWORDS]

        def fix(m: re.Match[str]) -> str:
            fixed = vocab.correct(m.group(0), context)
            if fixed is None:
                return m.group(0)
            corrected[m.group(0).lower()] = fixed
            return fixed

        return _QUERY_WORD.sub(fix, query)

    def covers(self, query: str) -> bool:
        """Whether the catalog can have what ``query`` asks for. Search matches any one query
        word, so "dewalt cordless drill" in a catalog without drills would find cordless
        vacuums and "dyson purifier" Dyson vacuums: a query whose product word (its last
        content word) the catalog does not have, and that has fewer known words other than
        brand names than unknown ones, covers nothing; the customer gets the no-results reply
        instead of unrelated cards. Numbers do not count."""
        terms = [t for t in query_terms(query) if not any(c.isdigit() for c in t)]
        if not terms:
            return True
        vocab = self.vocabulary
        unknown = [t for t in terms if not vocab.known(t)]
        if terms[-1] not in unknown:
            return True
        known = [t for t in terms if t not in unknown and norm_brand(t) not in vocab.brands]
        return len(known) >= len(unknown)

    def lacks_what_was_asked(self, queries: Sequence[str], question: str) -> bool:
        """Whether a word of ``queries`` that the catalog does not have is the customer's own
        (in the question, as FTS5 stems it): then the catalog lacks what was asked for, and
        other words of the question would only find unrelated products. A word the planner
        made up is not the customer's, and the question's words may still find the product."""
        asked = _stems_of(question)
        vocab = self.vocabulary
        terms = [t for q in queries for t in query_terms(q)]
        if any(norm_brand(t) in vocab.brands for t in terms):
            return False  # a catalog brand's product line ("gopro hero 12"): it has the brand
        return any(stem1(t) in asked for t in terms
                   if not any(c.isdigit() for c in t) and not vocab.known(t))

    # How many results a search takes before the relevance check keeps ``k`` of them.
    OVERFETCH = 4

    def _search(self, queries: Sequence[str], f: Filters, k: int, asks: Sequence[Ask]) -> list[Product]:
        """The engine's results that are what the plan's queries ask for
        (:meth:`Vocabulary.fits`), best first, at most ``k``."""
        vocab = self.vocabulary
        n = min(100, k * self.OVERFETCH)
        kept = [p for p in self.retriever.search(queries, f, n) if vocab.fits(p, asks, f.brand)]
        heads = list(dict.fromkeys(a.head for a in asks if a.head and vocab.known(a.head)))
        if not kept and heads:
            # the product words alone: in "stainless steel water bottle" the rarer words
            # ranked a hundred coffee makers above every bottle
            kept = [p for p in self.retriever.search(heads, f, n) if vocab.fits(p, asks, f.brand)]
        return kept[:k]

    def search(self, queries: Sequence[str], plan_filters: dict | None, question: str,
               k: int, earlier: Sequence[str] = ()) -> SearchOutcome:
        """``earlier``: the customer's earlier turns, oldest first; a follow-up that names no
        product type ("any of those in size 9?") searches the type the last of them named."""
        vocab = self.vocabulary
        qs = check_queries(queries, k) or [question[:MAX_QUERY_CHARS]]
        plan = Filters.from_plan(plan_filters)
        corrected: dict[str, str] = {}
        notes: list[str] = []
        # 1. brand: a catalog brand (or a typo of one) filters; anything else is query words
        brand = vocab.brand(plan.brand) if plan.brand else None
        brand_typo = brand_note = ""
        if plan.brand and brand is None:
            qs = [_with_words(q, query_terms(plan.brand)) for q in qs]
        elif plan.brand and brand and norm_brand(brand) != norm_brand(plan.brand):
            brand_typo = plan.brand.lower()
            corrected[brand_typo] = brand
            brand_note = f'Showing {brand} products (you wrote "{_safe(plan.brand)}").'
            notes.append(brand_note)
        # 2. price: the cap stated in the question wins ("under 1k" is 1000, not the plan's 1.0)
        max_price = plan.max_price
        cap = parse_price_cap(question)
        if cap is not None:
            if max_price is None or abs(max_price - cap.usd) > 0.005:
                max_price = cap.usd
            if cap.currency != "USD":
                notes.append(f"Prices are in US dollars: {cap.amount:,g} {cap.currency} is about "
                             f"{_money(round(cap.usd))}.")
        lo, _hi = parse_price_range(question)
        if cap is None and lo is not None and max_price is not None and max_price <= lo:
            max_price = None  # "$400 and up": the plan read the floor as a cap
        # 3. typos
        fixed: dict[str, str] = {}
        qs = [self.spell(q, fixed) for q in qs]
        for typo, word in fixed.items():
            notes.append(f'Showing results for "{word}" (you wrote "{_safe(typo)}").')
        corrected.update(fixed)
        requested = Filters(brand=brand, max_price=max_price)

        def outcome(products: list[Product], searched: list[str], f: Filters,
                    relaxed: list[str]) -> SearchOutcome:
            return SearchOutcome(products=products, queries=searched, filters=f, corrected=corrected,
                                 relaxed=relaxed, notes=notes, requested=requested)

        # 4. product type first: the types and models the question names (else its plan's
        # queries: a follow-up's), searched within those types, its constraints applied
        typed = self._typed(qs, question, requested, k, notes, corrected, earlier,
                            (brand_typo, brand_note))
        if typed is not None:
            return typed
        if self.taxonomy.curated():
            # every type of this catalog is known by its nouns: a question naming none of them
            # (nor a model, line, brand or need) asks for what the catalog does not carry;
            # searching its other words would only bring side-word cards ("powerbeats pro")
            return outcome([], qs, requested, [])

        covered = [q for q in qs if self.covers(q)]
        if covered:
            qs = covered
        asks = [vocab.ask(q) for q in qs]
        qs = [without_generic(q, a) for q, a in zip(qs, asks, strict=True)]
        found = self._search(qs, requested, k, asks) if covered else []
        if found:
            return outcome(found, qs, requested, [])
        # 4. relax: the brand, then the price cap, then both. The brand's words are not added
        # to the queries: the filtered search matches any one query word (OR), so it came
        # back empty only if none of the brand's products has any query word; the brand's
        # words could then only pull in its other products ("dyson laptop" -> Dyson vacuums).
        # (none when the queries' words are not in the catalog: no filter makes them match)
        steps: list[tuple[Filters, list[str]]] = []
        if covered and brand:
            steps.append((Filters(max_price=max_price), ["brand"]))
        if covered and max_price is not None:
            steps.append((Filters(brand=brand), ["max_price"]))
        if covered and brand and max_price is not None:
            steps.append((Filters(), ["brand", "max_price"]))
        for f, relaxed in steps:
            step_qs = qs
            if brand_typo and "brand" in relaxed:
                # a "typo" of a brand that has none of it was no typo ("razr" is not Razer):
                # its words are query words, as for any name that is no brand
                step_qs = [_with_words(q, query_terms(plan.brand or "")) for q in qs]
            found = self._search(step_qs, f, k, asks)
            if found:
                if brand_typo and "brand" in relaxed:
                    corrected.pop(brand_typo, None)
                    notes.remove(brand_note)
                    relaxed_note = self._relax_note(Filters(max_price=max_price), relaxed[1:])
                else:
                    relaxed_note = self._relax_note(requested, relaxed)
                if relaxed_note:
                    notes.append(relaxed_note)
                return outcome(found, step_qs, f, relaxed)
        dropped = [n for n, v in (("brand", brand), ("max_price", max_price))
                   if v is not None and covered]
        # 5. the question's own content words, corrected, no filters; not when the customer
        # asked for what the catalog lacks ("books like the hunger games" found gaming monitors)
        q_fixed: dict[str, str] = {}
        last = self.spell(" ".join(query_terms(question)), q_fixed)
        searched = qs
        if (last and all(query_terms(q) != last.split() for q in qs) and self.covers(last)
                and (covered or not self.lacks_what_was_asked(qs, question))):
            # judged by what the plan asks for when those are the customer's words, else
            # by the question's own product phrase (the plan's words were made up)
            asked = _stems_of(question)
            mine = [a for a in asks if a.head and stem1(a.head) in asked]
            found = self._search([last], Filters(), k, mine or [vocab.ask(question)])
            if found:
                corrected.update(q_fixed)
                shown = ", ".join(f'"{_safe(q)}"' for q in qs)
                notes.append(f'Nothing matched {shown}; showing results for "{_safe(last, 60)}".')
                return outcome(found, [last], Filters(), dropped)
            searched = [*qs, last]
        return outcome([], searched, Filters(), dropped)

    # How many listings of the named product types the typed search looks at: every listing
    # of a type in the default catalog (at most ~60), the best 100 in a larger one.
    POOL = 100

    def _typed(self, qs: list[str], question: str, requested: Filters, k: int,
               notes: list[str], corrected: dict[str, str], earlier: Sequence[str] = (),
               typo: tuple[str, str] = ("", "")) -> SearchOutcome | None:
        """Search within the product types the question names, its stated constraints met
        (rufus/retrieval/constraints.py); None when it names no type of this catalog."""
        tax = self.taxonomy
        if not tax.count:
            return None
        # the customer's words first; spelling corrected only when they name no type
        # (a correction may turn a word the catalog lacks into one it has: "wrecking")
        spelled = self.spell(question, {})
        if typo[0] and typo[1] in notes and not norm_brand(typo[0]).startswith(
                norm_brand(corrected.get(typo[0], "-"))):  # "vitamx 5200" (not "ecobee3 lite")
            spelled = re.sub(rf"\b{re.escape(typo[0])}\b", corrected.get(typo[0], typo[0]).lower(),
                             spelled, flags=re.I)
        # a keyword query whose product word the catalog has never seen ("lawn mower",
        # "books like the hunger games"): no nearest type for it, nor a noun further on
        head = product_phrase(question)[-1:]
        unknown = (bool(head) and len(words(question)) <= 5 and not self.vocabulary.known(head[0])
                   and head[0] not in common_words()
                   # "vitamx 5200 wattage": a model named, the unknown word asks of it
                   and not tax.models_in(taxonomy_tokens(spelled)))
        if unknown:  # only a type or model the product phrase itself names
            res, text = tax.resolve(" ".join(product_phrase(spelled)), infer=False), spelled
        else:
            res, text = tax.resolve(spelled), spelled
        if earlier and res.categories and not res.named_first and not res.models and (
                _ANAPHOR.search(question.lower()) or (res.inferred and len(words(question)) <= 6)):
            # ... or a short follow-up naming no type ("women's size 8 please")
            # "any of those that work with an iphone?", "do they make them in a kids 12c?":
            # a follow-up about the earlier turn's products, whatever type a side word names
            for q in reversed(earlier):
                r = tax.resolve(q)
                if r.categories:
                    res, text = r, f"{text} {q}"
                    break
        if not res.categories and not res.accessory:
            for q in [*qs, *reversed(earlier)] if not unknown else ():
                r = tax.resolve(q)
                if r.categories:
                    res, text = r, f"{text} {q}"
                    break
        if not res.categories:
            return None
        cats = tuple(res.categories)
        lo, hi = parse_price_range(question)
        max_price = requested.max_price if requested.max_price is not None else hi
        named = list(dict.fromkeys(self._brands_named(text, cats) + res.brands))
        said = {norm_brand(b) for b in named} | {norm_brand(tax.model_brand[m]) for m in res.models}
        sold = {nb for c in cats for nb in tax.brands.get(c, {})}
        plan_brand, unsaid = requested.brand, []
        if plan_brand and ((said and norm_brand(plan_brand) not in said)
                           or (typo[0] and norm_brand(plan_brand) not in sold)):
            # the customer's own words win over the plan's brand ("motorola razr" is no
            # Razer), and a brand "typo" of a brand these types do not sell was none
            plan_brand = None
            if typo[0]:
                corrected.pop(typo[0], None)
                if typo[1] in notes:
                    notes.remove(typo[1])
            unsaid = ["brand"]  # the plan's filter, dropped
            requested = dataclasses.replace(requested, brand=None)
        if plan_brand and len({norm_brand(tax.model_brand[m]) for m in res.models}) > 1:
            # "yeti roadie 48 or the coleman xtreme": models of two brands, no brand filter
            plan_brand, unsaid = None, ["brand"]
            requested = dataclasses.replace(requested, brand=None)
        if plan_brand and earlier and not said and norm_brand(plan_brand) not in norm_brand(
                " ".join([question, *earlier])):
            # a follow-up's plan brand the customer never wrote: the planner took it from
            # the earlier answer's products ("any with wireless charging?" is no Jabra search)
            plan_brand, unsaid = None, ["brand"]
            requested = dataclasses.replace(requested, brand=None)
        if plan_brand:
            named = []  # the plan's brand filters; the question's are the same
        cons = constraints.parse(text, cats, tax, named)
        f = Filters(brand=plan_brand, max_price=max_price, min_price=lo, categories=cats)
        pool, f, relaxed = self._typed_pool(qs, res.models, f)
        if res.line_models:  # "apple watch": that line's models, when it has some here
            pool = [p for p in pool if p.model in res.line_models] or pool
        stated = dataclasses.replace(requested, max_price=max_price, min_price=lo, categories=cats)
        if relaxed:
            note = self._relax_note(stated, relaxed)
            if note:
                notes.append(note)
        found, dropped = constraints.relax(pool, cons)
        if dropped:
            notes.append(self._constraint_note(cats, dropped, len(cons) > len(dropped)))
        found = self._named_first(found, pool, res.models)
        return SearchOutcome(products=found[:k], queries=qs, filters=f, corrected=corrected,
                             relaxed=unsaid + relaxed, notes=notes, requested=stated,
                             categories=list(cats),
                             constraints=[c for c in cons if c not in dropped], dropped=dropped,
                             models=list(res.models))

    def names_a_type(self, question: str) -> bool:
        """Whether ``question`` names (or describes the need for) a product type of this
        catalog (rufus/retrieval/taxonomy.py): a curated catalog only."""
        tax = self.taxonomy
        if not tax.curated():
            return False
        res = tax.resolve(self.spell(question, {}))
        # a need, only when several of its words are the type's ("thanks, that's all i
        # needed" shares one with humidifiers)
        return bool(res.categories) and not res.accessory and (
            not res.inferred or res.need_words >= NEED_WORDS_FOR_SEARCH)

    def _brands_named(self, text: str, cats: Sequence[str]) -> list[str]:
        """Catalog brands of these product types that ``text`` names ("ninja", "the north
        face", "ray bans"), as one to three words, a plural "s" allowed."""
        ws = words(text)
        grams = {g for i in range(len(ws)) for k in (1, 2, 3)
                 for g in ("".join(ws[i:i + k]), "".join(ws[i:i + k]).removesuffix("s"))}
        out = []
        for c in cats:
            for nb, display in self.taxonomy.brands.get(c, {}).items():
                if nb in grams and display not in out:
                    out.append(display)
        return out

    def _typed_pool(self, qs: list[str], models: Sequence[str], f: Filters
                    ) -> tuple[list[Product], Filters, list[str]]:
        """The listings of ``f``'s product types: the named models', then the query's best,
        then the most reviewed; the plan's brand, then its price bounds relaxed when none is
        left (the filters applied and those relaxed)."""
        steps = [(f, [])]
        if f.brand:
            steps.append((dataclasses.replace(f, brand=None), ["brand"]))
        if f.max_price is not None or f.min_price is not None:
            steps.append((dataclasses.replace(f, max_price=None, min_price=None), ["max_price"]))
            if f.brand:
                steps.append((dataclasses.replace(f, brand=None, max_price=None, min_price=None),
                              ["brand", "max_price"]))
        for step, relaxed in steps:
            seen: dict[str, Product] = {}
            if models:
                by_model = dataclasses.replace(step, models=tuple(models))
                for p in self.retriever.search(list(models)[:3], by_model, 30):
                    seen.setdefault(p.id, p)
            for batch in (qs, [""]):
                for p in self.retriever.search(batch, step, self.POOL):
                    if len(seen) >= self.POOL:
                        break
                    seen.setdefault(p.id, p)
            pool = [p for p in seen.values() if p.category in step.categories
                    and (step.max_price is None or p.price <= step.max_price)
                    and (step.min_price is None or p.price >= step.min_price)
                    and (step.brand is None or norm_brand(p.brand) == norm_brand(step.brand))]
            if pool:
                return pool, step, relaxed
        return [], steps[-1][0], steps[-1][1]

    @staticmethod
    def _named_first(found: list[Product], pool: list[Product], models: Sequence[str]) -> list[Product]:
        """The models the question names first, in its order (each its best listing; one
        that meets none of the constraints still shown: the customer asked for it)."""
        if not models:
            return found
        head = []
        for m in models:
            mine = [p for p in found if p.model == m] or [p for p in pool if p.model == m]
            if mine:
                head.append(mine[0])
        return head + [p for p in found if p not in head]

    def _constraint_note(self, cats: Sequence[str], dropped: Sequence[Constraint], rest: bool) -> str:
        """What relaxing ``dropped`` means for the customer, ahead of the first pick."""
        name = self.taxonomy.name(cats[0]) if len(cats) == 1 else "products"
        said = " and ".join(f'"{_safe(c.text)}"' for c in dropped)
        also = " with the rest of your search" if rest else ""
        if all(c.kind == "number" for c in dropped):
            return f"No {name} in the catalog match {said}{also}; showing the closest."
        return f"No {name} in the catalog match {said}{also}; showing {name} without it."

    @staticmethod
    def _relax_note(f: Filters, relaxed: list[str]) -> str:
        """What relaxing ``relaxed`` (of the filters ``f``) means for the customer."""
        if not relaxed:
            return ""
        price = _money(f.max_price) if f.max_price is not None else ""
        if relaxed == ["max_price"]:
            who = f"{f.brand} products" if f.brand else "results"
            return f"No {who} under {price}; showing {who} at any price."
        if relaxed == ["brand"]:
            under = f" under {price}" if price else ""
            return f"No {f.brand} products match your search{under}; showing other brands."
        return f"No {f.brand} products under {price}; showing results from all brands at any price."

    def no_results_reply(self, outcome: SearchOutcome, question: str) -> str:
        """The reply when nothing matched, written by the system (never by the model): what
        was searched, which filters were dropped, and the nearest catalog categories."""
        shown = [" ".join(query_terms(q)) for q in outcome.queries]
        shown = list(dict.fromkeys(_safe(s, 60) for s in shown if s))[:3]
        what = " or ".join(f'"{s}"' for s in shown) if shown else "your search"
        req = outcome.requested
        without = []
        if "brand" in outcome.relaxed:
            without.append(f"the {req.brand} brand filter" if req.brand else "the brand filter")
        if "max_price" in outcome.relaxed:
            without.append(f"the {_money(req.max_price)} price cap" if req.max_price is not None
                           else "the price cap")
        even = f", even without {' and '.join(without)}" if without else ""
        return (f"I couldn't find any products for {what} in our catalog{even}. "
                f"{self.nearest(outcome, question)}").rstrip()

    def nearest(self, outcome: SearchOutcome, question: str) -> str:
        """The sentence naming the catalog's product types nearest to what was asked (by the
        types' nouns, then the titles' words), or its departments when none is near."""
        tax = self.taxonomy
        text = " ".join([question, *outcome.queries])
        near = [tax.name(c) for c in tax.near(text, 3)]
        if not near:
            near = self.vocabulary.categories_near([*outcome.queries, question], 3)
        if near:
            return f"The catalog has: {', '.join(near)}."
        deps = tax.departments()
        if deps:
            said = ", ".join(deps[:-1]) + " and " + deps[-1] if len(deps) > 1 else deps[0]
            return f"The catalog has {len(tax.count)} product types in {said}; nothing near this."
        return ""
