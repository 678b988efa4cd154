"""Product type first: search within the product types and models the question names
(rufus/retrieval/taxonomy.py), its stated constraints met (rufus/retrieval/constraints.py).
A card of another type must never be shown because it shares a side word, so when the
question names a type of this catalog only listings of that type are candidates; the
keyword search (rufus/retrieval/search.py) is for catalogs whose types are unknown."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rufus.retrieval import constraints
from rufus.retrieval.base import STOPWORDS, Filters, Retriever, norm_brand
from rufus.retrieval.catalog import Product
from rufus.retrieval.constraints import parse_price_range
from rufus.retrieval.outcome import Found
from rufus.retrieval.query import product_phrase
from rufus.retrieval.search_notes import constraint_note, relax_note
from rufus.retrieval.spelling import common_words, words
from rufus.retrieval.taxonomy import Resolution, Taxonomy
from rufus.retrieval.taxonomy import tokens as taxonomy_tokens
from rufus.retrieval.vocabulary import Vocabulary

# A follow-up that refers to the earlier products ("any of those", "only ones that ...").
_ANAPHOR = re.compile(r"\b(?:ones|those|these|them|they|any\s+of|any\s+(?:with|that|for|in)|"
                      r"any\s+\w+\s+ones|just\s+the|only\s+the)\b|^\s*which\s+(?:work|are|is|have|come)\b")


@dataclass(frozen=True)
class BrandChoice:
    """The plan's brand after the customer's own words had their say: the filter (None:
    dropped), the brands the question names (brand constraints), and why it changed."""

    brand: str | None
    named: list[str]
    unsaid: list[str]  # ["brand"]: the plan's filter, dropped
    retract: bool  # the plan's brand "typo" of a brand these types do not sell was none


class TypedSearch:
    """The search within named product types. ``typo``, in :meth:`search`: the plan's brand
    as written and the catalog brand it was corrected to, when it was a typo of one."""

    # How many listings of the named product types the typed search looks at: every listing
    # of a type in the default catalog (at most ~60), the best 100 in a larger one.
    POOL = 100

    def __init__(self, retriever: Retriever, vocabulary: Vocabulary, taxonomy: Taxonomy) -> None:
        self.retriever = retriever
        self.vocabulary = vocabulary
        self.taxonomy = taxonomy

    def search(self, qs: list[str], question: str, requested: Filters, k: int,
               earlier: Sequence[str] = (), typo: tuple[str, str] = ("", "")) -> Found | None:
        """The listings of the types the question names, its constraints met (the fewest
        relaxed when none meets them all); None when it names no type of this catalog."""
        if not self.taxonomy.count:
            return None
        named = self.types_named(qs, question, earlier, typo)
        if named is None:
            return None
        res, text = named
        cats = tuple(res.categories)
        lo, hi = parse_price_range(question)
        max_price = requested.max_price if requested.max_price is not None else hi
        choice = self._brand(requested.brand, res, text, cats, question, earlier, typo)
        requested = dataclasses.replace(requested, brand=choice.brand)
        cons = constraints.parse(text, cats, self.taxonomy, choice.named)
        f = Filters(brand=choice.brand, max_price=max_price, min_price=lo, categories=cats)
        pool, f, relaxed = self._pool(qs, res.models, f)
        if res.line_models:  # "apple watch": that line's models, when it has some here
            pool = [p for p in pool if p.model in res.line_models] or pool
        stated = dataclasses.replace(requested, max_price=max_price, min_price=lo, categories=cats)
        notes = [n for n in [relax_note(stated, relaxed)] if n]
        said = cons if text == question else constraints.parse(question, cats, self.taxonomy, choice.named)
        found, dropped = constraints.relax(pool, cons, said)
        if dropped:
            name = self.taxonomy.name(cats[0]) if len(cats) == 1 else "products"
            notes.append(constraint_note(name, dropped, len(cons) > len(dropped)))
        found = self._named_first(found, pool, res.models)
        return Found(products=found[:k], queries=qs, filters=f, relaxed=choice.unsaid + relaxed,
                     notes=notes, retract_brand=choice.retract, requested=stated,
                     categories=list(cats), constraints=[c for c in cons if c not in dropped],
                     dropped=dropped, models=list(res.models))

    def types_named(self, qs: list[str], question: str, earlier: Sequence[str],
                    typo: tuple[str, str]) -> tuple[Resolution, str] | None:
        """What the question names (else a follow-up's earlier turn, else the plan's queries)
        and the text it was read from; None when it names no type."""
        tax = self.taxonomy
        # the customer's words first; spelling corrected only when they name no type
        # (a correction may turn a word the catalog lacks into one it has: "wrecking")
        spelled, _ = self.vocabulary.spell(question, keep=tax.need_word)
        if typo[0] and not norm_brand(typo[0]).startswith(norm_brand(typo[1])):
            # "vitamx 5200" (not "ecobee3 lite")
            spelled = re.sub(rf"\b{re.escape(typo[0])}\b", typo[1].lower(), spelled, flags=re.I)
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
        # a short follow-up: few words besides numbers and stopwords ("anything in size 10.5
        # for under $150?")
        short = len([w for w in words(question) if w not in STOPWORDS
                     and not re.fullmatch(r"[\d.]+", w)]) <= 6
        if earlier and res.categories and not res.named_first and not res.models and (
                _ANAPHOR.search(question.lower()) or (res.inferred and short)):
            # ... or a short follow-up naming no type ("women's size 8 please")
            # "any of those that work with an iphone?", "do they make them in a kids 12c?":
            # a follow-up about the earlier turn's products, whatever type a side word names
            res, text = self._first_resolved(reversed(earlier), res, text)
        if not res.categories and not res.accessory and not unknown:
            # a follow-up naming no type: the customer's earlier turn before the plan's
            # queries ("cordless only, under 500" after a vacuum: not the plan's drills)
            texts = [*reversed(earlier), *qs] if earlier and short else [*qs, *reversed(earlier)]
            res, text = self._first_resolved(texts, res, text)
        return (res, text) if res.categories else None

    def _first_resolved(self, texts: Iterable[str], res: Resolution,
                        text: str) -> tuple[Resolution, str]:
        """The first of ``texts`` naming a type, its words added to ``text``; else as was."""
        for q in texts:
            r = self.taxonomy.resolve(q)
            if r.categories:
                return r, f"{text} {q}"
        return res, text

    def _brand(self, plan_brand: str | None, res: Resolution, text: str, cats: Sequence[str],
               question: str, earlier: Sequence[str], typo: tuple[str, str]) -> BrandChoice:
        """Whether the plan's brand still filters, given the brands the question names."""
        tax = self.taxonomy
        named = list(dict.fromkeys(self._brands_named(text, cats) + res.brands))
        said = {norm_brand(b) for b in named} | {norm_brand(tax.model_brand[m]) for m in res.models}
        sold = {nb for c in cats for nb in tax.brands.get(c, {})}
        if not plan_brand:
            return BrandChoice(None, named, [], False)
        if (said and norm_brand(plan_brand) not in said) or (typo[0] and norm_brand(plan_brand) not in sold):
            # the customer's own words win over the plan's brand ("motorola razr" is no
            # Razer), and a brand "typo" of a brand these types do not sell was none
            return BrandChoice(None, named, ["brand"], bool(typo[0]))
        if len({norm_brand(tax.model_brand[m]) for m in res.models}) > 1:
            # "yeti roadie 48 or the coleman xtreme": models of two brands, no brand filter
            return BrandChoice(None, named, ["brand"], False)
        if earlier and not said and norm_brand(plan_brand) not in norm_brand(
                " ".join([question, *earlier])):
            # a follow-up's plan brand the customer never wrote: the planner took it from
            # the earlier answer's products ("any with wireless charging?" is no Jabra search)
            return BrandChoice(None, named, ["brand"], False)
        return BrandChoice(plan_brand, [], [], False)  # it filters; the question's are the same

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

    def _pool(self, qs: list[str], models: Sequence[str], f: Filters
              ) -> tuple[list[Product], Filters, list[str]]:
        """The listings of ``f``'s product types: the named models', then the query's best,
        then the most reviewed; the plan's brand, then its price bounds relaxed when none is
        left (the filters applied and those relaxed)."""
        steps: list[tuple[Filters, list[str]]] = [(f, [])]
        if f.brand:
            steps.append((dataclasses.replace(f, brand=None), ["brand"]))
        if f.max_price is not None or f.min_price is not None:
            steps.append((dataclasses.replace(f, max_price=None, min_price=None), ["max_price"]))
            if f.brand:
                steps.append((dataclasses.replace(f, brand=None, max_price=None, min_price=None),
                              ["brand", "max_price"]))
        for step, relaxed in steps:
            pool = self._listings(qs, models, step)
            if pool:
                return pool, step, relaxed
        return [], steps[-1][0], steps[-1][1]

    def _listings(self, qs: list[str], models: Sequence[str], step: Filters) -> list[Product]:
        """The listings meeting ``step``'s filters, at most :attr:`POOL` (see :meth:`_pool`)."""
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
        return [p for p in seen.values() if p.category in step.categories
                and (step.max_price is None or p.price <= step.max_price)
                and (step.min_price is None or p.price >= step.min_price)
                and (step.brand is None or norm_brand(p.brand) == norm_brand(step.brand))]

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
