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

Before 4, a question naming a product type of the catalog is searched within that type
(rufus/retrieval/typed_search.py). Each step returns what it found (:class:`Found`); the
outcome's notes and corrections are written once, from the grounding and that step.

At every step a result must be what the query asks for (:meth:`Vocabulary.fits`): search
matches any one word, and "kids bike 16 inch" found iPhone 16.

When even that finds nothing, :meth:`GroundedSearch.no_results_reply` is the reply (never
model text): what was searched and which catalog categories are nearest.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rufus.retrieval.base import (
    MAX_QUERY_CHARS,
    Filters,
    ProductSource,
    Retriever,
    check_queries,
    norm_brand,
    query_terms,
)
from rufus.retrieval.catalog import Product
from rufus.retrieval.constraints import parse_price_range
from rufus.retrieval.outcome import Found, SearchOutcome
from rufus.retrieval.price import stated_max_price
from rufus.retrieval.query import Ask, stems_of, without_generic
from rufus.retrieval.search_notes import (
    brand_note,
    currency_note,
    nothing_matched_note,
    relax_note,
    safe,
    typo_note,
    without_filters,
)
from rufus.retrieval.spelling import stem1, words
from rufus.retrieval.taxonomy import Taxonomy
from rufus.retrieval.typed_search import TypedSearch
from rufus.retrieval.vocabulary import Vocabulary

__all__ = ["NEED_WORDS_FOR_SEARCH", "Found", "Grounded", "GroundedSearch", "SearchOutcome"]

# A question the planner took for small talk is searched when it names a product type, or
# describes a need with this many of a type's words (Taxonomy.classify).
NEED_WORDS_FOR_SEARCH = 2


@dataclass(frozen=True)
class Grounded:
    """The plan grounded in the catalog, before any search (steps 1-3): what to search, with
    which filters, and what grounding changed. The brand's correction is kept apart from the
    words': a later step may find that the plan's brand "typo" was no typo and retract it."""

    queries: list[str]
    requested: Filters  # the grounded filters: a catalog brand, the stated price cap
    plan_brand: str | None = None  # the plan's brand, as written
    brand_typo: str = ""  # the plan's brand (lower case), when it was a typo of the brand
    price_note: str = ""
    corrected: dict[str, str] = field(default_factory=dict)  # the queries' typos -> words

    def corrections(self, retract_brand: bool = False) -> dict[str, str]:
        """Every correction grounding made (the brand's first), the brand's retracted."""
        out = {self.brand_typo: self.requested.brand or ""} if self.brand_typo else {}
        out.update(self.corrected)
        if retract_brand:
            out.pop(self.brand_typo, None)
        return out

    def notes(self, retract_brand: bool = False) -> list[str]:
        """What grounding says it changed, in the order of its steps."""
        brand = [brand_note(self.requested.brand or "", self.plan_brand or "")
                 ] if self.brand_typo and not retract_brand else []
        price = [self.price_note] if self.price_note else []
        return brand + price + [typo_note(word, typo) for typo, word in self.corrected.items()]


def _with_words(query: str, extra: Sequence[str]) -> str:
    """``query`` with the words of ``extra`` it does not have yet, at the end."""
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
        asked = stems_of(question)
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

    # -------------------------------------------------------------- the steps
    def search(self, queries: Sequence[str], plan_filters: Mapping[str, Any] | None, question: str,
               k: int, earlier: Sequence[str] = ()) -> SearchOutcome:
        """``earlier``: the customer's earlier turns, oldest first; a follow-up that names no
        product type ("any of those in size 9?") searches the type the last of them named."""
        g = self.ground(queries, plan_filters, question, k)
        typo = (g.brand_typo, g.corrections()[g.brand_typo]) if g.brand_typo else ("", "")
        # 4. product type first: the types and models the question names (else its plan's
        # queries: a follow-up's), searched within those types, its constraints applied
        found = TypedSearch(self.retriever, self.vocabulary, self.taxonomy).search(
            g.queries, question, g.requested, k, earlier, typo)
        if found is None and self.taxonomy.curated():
            # every type of this catalog is known by its nouns: a question naming none of them
            # (nor a model, line, brand or need) asks for what the catalog does not carry;
            # searching its other words would only bring side-word cards ("powerbeats pro")
            found = Found([], g.queries, g.requested)
        if found is None:
            found = self._by_keywords(g, question, k)
        return self._outcome(g, found)

    @staticmethod
    def _outcome(g: Grounded, found: Found) -> SearchOutcome:
        """The search's outcome: the step's cards, the notes and corrections written once."""
        corrected = g.corrections(found.retract_brand)
        corrected.update(found.corrected)
        return SearchOutcome(
            products=found.products, queries=found.queries, filters=found.filters,
            corrected=corrected, relaxed=found.relaxed,
            notes=g.notes(found.retract_brand) + found.notes,
            requested=g.requested if found.requested is None else found.requested,
            categories=found.categories, constraints=found.constraints, dropped=found.dropped,
            models=found.models)

    def ground(self, queries: Sequence[str], plan_filters: Mapping[str, Any] | None, question: str,
               k: int) -> Grounded:
        """Steps 1-3: the plan's brand, price cap and words checked against the catalog."""
        vocab = self.vocabulary
        qs = check_queries(queries, k) or [question[:MAX_QUERY_CHARS]]
        plan = Filters.from_plan(plan_filters)
        # 1. brand: a catalog brand (or a typo of one) filters; anything else is query words
        brand = vocab.brand(plan.brand) if plan.brand else None
        brand_typo = ""
        if plan.brand and brand is None:
            qs = [_with_words(q, query_terms(plan.brand)) for q in qs]
        elif plan.brand and brand and norm_brand(brand) != norm_brand(plan.brand):
            brand_typo = plan.brand.lower()
        # 2. price: the cap stated in the question wins ("under 1k" is 1000, not the plan's 1.0)
        max_price, cap = stated_max_price(plan.max_price, question)
        price_note = currency_note(cap) if cap is not None and cap.currency != "USD" else ""
        lo, _hi = parse_price_range(question)
        if cap is None and lo is not None and max_price is not None and max_price <= lo:
            max_price = None  # "$400 and up": the plan read the floor as a cap
        # 3. typos
        fixed: dict[str, str] = {}
        spelled = []
        keep = self.taxonomy.need_word if self.taxonomy.curated() else None
        for q in qs:
            text, corrected = vocab.spell(q, keep=keep)
            spelled.append(text)
            fixed.update(corrected)
        return Grounded(queries=spelled, requested=Filters(brand=brand, max_price=max_price),
                        plan_brand=plan.brand, brand_typo=brand_typo, price_note=price_note,
                        corrected=fixed)

    def _by_keywords(self, g: Grounded, question: str, k: int) -> Found:
        """Steps 4 and 5 where no product type is named: the queries the catalog covers, then
        the filters relaxed, then the question's own words."""
        covered = [q for q in g.queries if self.covers(q)]
        qs = covered or g.queries
        asks = [self.vocabulary.ask(q) for q in qs]
        qs = [without_generic(q, a) for q, a in zip(qs, asks, strict=True)]
        found = self._search(qs, g.requested, k, asks) if covered else []
        if found:
            return Found(found, qs, g.requested)
        relaxed = self._relaxed(g, qs, asks, k) if covered else None
        return relaxed or self._last_try(g, qs, asks, question, k, bool(covered))

    def _relaxed(self, g: Grounded, qs: list[str], asks: Sequence[Ask], k: int) -> Found | None:
        """4. relax: the brand, then the price cap, then both. The brand's words are not added
        to the queries: the filtered search matches any one query word (OR), so it came
        back empty only if none of the brand's products has any query word; the brand's
        words could then only pull in its other products ("dyson laptop" -> Dyson vacuums)."""
        brand, max_price = g.requested.brand, g.requested.max_price
        steps: list[tuple[Filters, list[str]]] = []
        if brand:
            steps.append((Filters(max_price=max_price), ["brand"]))
        if max_price is not None:
            steps.append((Filters(brand=brand), ["max_price"]))
        if brand and max_price is not None:
            steps.append((Filters(), ["brand", "max_price"]))
        for f, relaxed in steps:
            # a "typo" of a brand that has none of it was no typo ("razr" is not Razer):
            # its words are query words, as for any name that is no brand
            retract = bool(g.brand_typo) and "brand" in relaxed
            step_qs = [_with_words(q, query_terms(g.plan_brand or "")) for q in qs] if retract else qs
            found = self._search(step_qs, f, k, asks)
            if found:
                note = (relax_note(Filters(max_price=max_price), relaxed[1:]) if retract
                        else relax_note(g.requested, relaxed))
                return Found(found, step_qs, f, relaxed, notes=[note] if note else [],
                             retract_brand=retract)
        return None

    def _last_try(self, g: Grounded, qs: list[str], asks: Sequence[Ask], question: str, k: int,
                  covered: bool) -> Found:
        """5. the question's own content words, corrected, no filters; not when the customer
        asked for what the catalog lacks ("books like the hunger games" found gaming monitors)."""
        dropped = [n for n, v in (("brand", g.requested.brand), ("max_price", g.requested.max_price))
                   if v is not None and covered]
        last, fixed = self.vocabulary.spell(" ".join(query_terms(question)))
        if not (last and all(query_terms(q) != last.split() for q in qs) and self.covers(last)
                and (covered or not self.lacks_what_was_asked(qs, question))):
            return Found([], qs, Filters(), dropped)
        # judged by what the plan asks for when those are the customer's words, else
        # by the question's own product phrase (the plan's words were made up)
        asked = stems_of(question)
        mine = [a for a in asks if a.head and stem1(a.head) in asked]
        found = self._search([last], Filters(), k, mine or [self.vocabulary.ask(question)])
        if found:
            return Found(found, [last], Filters(), dropped, notes=[nothing_matched_note(qs, last)],
                         corrected=fixed)
        return Found([], [*qs, last], Filters(), dropped)

    # -------------------------------------------------------------- around the search
    def names_a_type(self, question: str) -> bool:
        """Whether ``question`` names (or describes the need for) a product type of this
        catalog (rufus/retrieval/taxonomy.py): a curated catalog only."""
        tax = self.taxonomy
        if not tax.curated():
            return False
        res = tax.resolve(self.vocabulary.spell(question, keep=tax.need_word)[0])
        # a need, only when several of its words are the type's ("thanks, that's all i
        # needed" shares one with humidifiers)
        return bool(res.categories) and not res.accessory and (
            not res.inferred or res.need_words >= NEED_WORDS_FOR_SEARCH)

    def no_results_reply(self, outcome: SearchOutcome, question: str) -> str:
        """The reply when nothing matched, written by the system (never by the model): what
        was searched, which filters were dropped, and the nearest catalog categories."""
        shown = [" ".join(query_terms(q)) for q in outcome.queries]
        shown = list(dict.fromkeys(safe(s, 60) for s in shown if s))[:3]
        what = " or ".join(f'"{s}"' for s in shown) if shown else "your search"
        even = without_filters(outcome.requested, outcome.relaxed)
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
