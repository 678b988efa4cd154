"""The search interface every engine implements, and the parts engines share.

``Retriever.search(queries, filters, k)`` takes the planner's 1-3 search queries and its
filters (brand, max_price) and returns the k best products. Each query is searched on its own
(the planner writes one query per product it wants compared); the ranked lists are merged by
reciprocal rank fusion, so a product found by several queries rises, and each query keeps a
place in the top k.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rufus.retrieval.catalog import Product

RRF_K = 60
MAX_QUERIES = 3
MAX_QUERY_CHARS = 200
# Words that carry no product meaning in shopping queries; prices are filters, not text.
STOPWORDS = frozenset("""
a an and any are as at be best buy by can cheap cheapest could do does for from get good great
have i im in is it looking me my need of on or please recommend show some that the to top under
over below less than what which with want would you your dollars dollar usd price budget around
about find me""".split())
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")
_PRICE = re.compile(r"(?:\$\s*\d+(?:\.\d+)?|\b\d+(?:\.\d+)?\s*(?:dollars|usd|bucks)\b)")


@dataclass(frozen=True)
class Filters:
    """Hard constraints: results never violate them (an empty list rather than a wrong card)."""

    brand: str | None = None
    max_price: float | None = None
    min_price: float | None = None
    categories: tuple[str, ...] = ()  # product types (empty: any)
    models: tuple[str, ...] = ()  # product models (empty: any)

    @classmethod
    def from_plan(cls, filters: Mapping[str, Any] | None) -> Filters:
        f = filters or {}
        brand = f.get("brand")
        price = f.get("max_price")
        return cls(brand=str(brand) if brand else None,
                   max_price=float(price) if isinstance(price, int | float) and price >= 0 else None)


@dataclass(frozen=True)
class Hit:
    product: Product
    score: float


@runtime_checkable
class Retriever(Protocol):
    name: str

    def search(self, queries: Sequence[str], filters: Filters | None = None,
               k: int = 5) -> list[Product]:
        """The k best products for the queries, every one satisfying ``filters``."""
        ...


@runtime_checkable
class ProductSource(Protocol):
    """An engine that can list its catalog (what grounding builds its vocabulary from)."""

    def iter_products(self) -> Iterator[Product]:
        """Every indexed product, once each."""
        ...


def norm_brand(brand: str) -> str:
    """Brand key for filtering: case, spaces and punctuation ignored ("levis" = "Levi's")."""
    return re.sub(r"[^a-z0-9]", "", brand.lower())


def query_terms(query: str) -> list[str]:
    """Search terms of one query: lower case, prices and stopwords removed, order kept."""
    q = _PRICE.sub(" ", query.lower()[:MAX_QUERY_CHARS])
    seen: list[str] = []
    for t in _TOKEN.findall(q.replace("'", "")):
        if t not in STOPWORDS and t not in seen:
            seen.append(t)
    return seen


def check_queries(queries: Sequence[str], k: int) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not a string")
    if not 1 <= k <= 100:
        raise ValueError(f"k must be in [1, 100], got {k}")
    return [q for q in list(queries)[:MAX_QUERIES] if isinstance(q, str) and q.strip()]


def rerank(hits: list[Hit]) -> list[Hit]:
    """BM25 first; among near-equal text scores (identical titles differ only by length),
    the more reviewed product first, as a marketplace would."""
    return sorted(hits, key=lambda h: (-round(h.score, 1), -h.product.review_count, h.product.id))


def fuse(ranked: list[list[Hit]], k: int) -> list[Product]:
    """Reciprocal rank fusion of per-query lists (ties: first query's order)."""
    if len(ranked) == 1:
        return [h.product for h in ranked[0][:k]]
    score: dict[str, float] = {}
    first: dict[str, tuple[int, int]] = {}
    prods: dict[str, Product] = {}
    for qi, hits in enumerate(ranked):
        for r, h in enumerate(hits):
            pid = h.product.id
            score[pid] = score.get(pid, 0.0) + 1.0 / (RRF_K + r + 1)
            first.setdefault(pid, (r, qi))
            prods[pid] = h.product
    order = sorted(score, key=lambda p: (-score[p], first[p]))
    return [prods[p] for p in order[:k]]


def popularity(review_count: int) -> float:
    return math.log1p(max(review_count, 0))
