"""OpenSearch behind the same interface: the engine to move to at scale (sharded index,
replicas, updates while serving). Written against opensearch-py 3.x (``OpenSearch.search``,
``indices.create``, ``helpers.bulk``); BM25 ``multi_match`` with the SQLite engine's field
boosts, filters as ``bool.filter`` clauses (no effect on scores), one ``msearch`` round trip
for the planner's 1-3 queries.

UNTESTED against a server: no OpenSearch server is installable here. Unit-tested against a
fake client that checks the request bodies (tests/unit/test_retrieval.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rufus.retrieval.base import Filters, Hit, check_queries, fuse, norm_brand, query_terms, rerank
from rufus.retrieval.catalog import Product
from rufus.retrieval.sqlite_fts import CANDIDATES, WEIGHTS

try:  # import-guarded: only needed when this engine is chosen
    from opensearchpy import OpenSearch, helpers
except ImportError:  # pragma: no cover - opensearch-py is pinned in requirements.lock
    OpenSearch = None  # type: ignore[assignment,misc]
    helpers = None  # type: ignore[assignment]

INDEX_BODY: dict[str, Any] = {
    "settings": {"analysis": {"analyzer": {"product_text": {
        "type": "custom", "tokenizer": "standard",
        "filter": ["lowercase", "asciifolding", "porter_stem"]}}}},
    "mappings": {"properties": {
        "id": {"type": "keyword"},
        "title": {"type": "text", "analyzer": "product_text"},
        "brand": {"type": "text", "analyzer": "product_text"},
        "brand_norm": {"type": "keyword"},
        "category": {"type": "keyword"},
        "category_text": {"type": "text", "analyzer": "product_text"},
        "description": {"type": "text", "analyzer": "product_text"},
        "price": {"type": "float"},
        "rating": {"type": "float"},
        "review_count": {"type": "integer"},
        "url": {"type": "keyword", "index": False},
        "image_url": {"type": "keyword", "index": False},
        "attributes": {"type": "object", "enabled": False},
    }},
}
FIELDS = [f"{f}^{w:g}" for f, w in zip(("title", "brand", "category_text", "description"), WEIGHTS,
                                       strict=True)]


def _source(p: Product) -> dict[str, Any]:
    d = p.to_json()
    d["brand_norm"] = norm_brand(p.brand)
    d["category_text"] = p.category.replace("_", " ")
    return d


def query_body(query: str, filters: Filters, size: int) -> dict[str, Any]:
    """The search request for one query (public for tests and for operators to inspect)."""
    flt: list[dict[str, Any]] = []
    if filters.brand:
        flt.append({"term": {"brand_norm": norm_brand(filters.brand)}})
    if filters.max_price is not None:
        flt.append({"range": {"price": {"lte": float(filters.max_price)}}})
    terms = query_terms(query)
    must: dict[str, Any] = ({"multi_match": {"query": " ".join(terms), "fields": FIELDS,
                                             "type": "most_fields", "operator": "or"}}
                            if terms else {"match_all": {}})
    body: dict[str, Any] = {"size": size, "query": {"bool": {"must": [must], "filter": flt}},
                            "track_total_hits": False}
    if not terms:
        body["sort"] = [{"review_count": "desc"}]
    return body


class OpenSearchRetriever:
    name = "opensearch"

    def __init__(self, client: Any, index: str = "rufus-products") -> None:
        self.client = client
        self.index = index

    @classmethod
    def connect(cls, hosts: str | list[str], index: str = "rufus-products",
                **kwargs: Any) -> OpenSearchRetriever:
        """``hosts`` e.g. "https://search.internal:9200"; credentials via kwargs
        (``http_auth``) from the environment, never from client requests."""
        if OpenSearch is None:
            raise RuntimeError("opensearch-py is not installed (pip install opensearch-py)")
        return cls(OpenSearch(hosts=hosts, **kwargs), index)

    def create_index(self, products: Sequence[Product], recreate: bool = False) -> int:
        """Create the index with the mapping above and bulk-load the catalog."""
        if recreate and self.client.indices.exists(index=self.index):
            self.client.indices.delete(index=self.index)
        if not self.client.indices.exists(index=self.index):
            self.client.indices.create(index=self.index, body=INDEX_BODY)

        def actions() -> Iterator[dict[str, Any]]:
            for p in products:
                yield {"_index": self.index, "_id": p.id, "_source": _source(p)}

        bulk = helpers.bulk if helpers is not None else None
        if bulk is None:
            raise RuntimeError("opensearch-py is not installed")
        ok, _ = bulk(self.client, actions(), chunk_size=2000, refresh="wait_for")
        return int(ok)

    def search(self, queries: Sequence[str], filters: Filters | None = None,
               k: int = 5) -> list[Product]:
        qs = check_queries(queries, k) or [""]
        f = filters or Filters()
        body: list[dict[str, Any]] = []
        for q in qs:
            body += [{"index": self.index}, query_body(q, f, max(CANDIDATES, k))]
        resp = self.client.msearch(body=body)
        ranked = []
        for r in resp["responses"]:
            if "error" in r:
                raise RuntimeError(f"opensearch query failed: {r['error']}")
            hits = []
            for h in r["hits"]["hits"]:
                src = dict(h["_source"])
                src.pop("brand_norm", None)
                src.pop("category_text", None)
                hits.append(Hit(Product(**src), float(h.get("_score") or 0.0)))
            ranked.append(rerank(hits))
        return fuse(ranked, k)
