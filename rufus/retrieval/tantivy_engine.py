"""tantivy (Rust, BM25) behind the same interface: the comparison engine of
scripts/bench_retrieval.py. Same fields, stemming (en_stem), boosts and filters as the SQLite
engine, so the benchmark compares engines, not ranking recipes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from rufus.retrieval.base import Filters, Hit, check_queries, fuse, norm_brand, query_terms, rerank
from rufus.retrieval.catalog import Product
from rufus.retrieval.sqlite_fts import CANDIDATES, WEIGHTS

TEXT_FIELDS = ("title", "brand", "category", "description")


class TantivyRetriever:
    name = "tantivy"

    def __init__(self, index: Any, schema: Any) -> None:
        import tantivy

        self.tantivy = tantivy
        self.index = index
        self.schema = schema
        self.searcher = index.searcher()

    @classmethod
    def build(cls, products: Sequence[Product], path: str | None = None) -> TantivyRetriever:
        import tantivy

        sb = tantivy.SchemaBuilder()
        for f in TEXT_FIELDS:
            sb.add_text_field(f, stored=True, tokenizer_name="en_stem")
        sb.add_text_field("brand_norm", stored=False, tokenizer_name="raw")
        sb.add_text_field("category_key", stored=False, tokenizer_name="raw")
        sb.add_text_field("model_key", stored=False, tokenizer_name="raw")
        sb.add_float_field("price", stored=True, indexed=True, fast=True)
        sb.add_text_field("doc", stored=True, tokenizer_name="raw", index_option="basic")
        schema = sb.build()
        index = tantivy.Index(schema, path=path)
        writer = index.writer(heap_size=64_000_000, num_threads=1)
        for p in products:
            writer.add_document(tantivy.Document(
                title=p.title, brand=p.brand, category=p.category.replace("_", " "),
                description=p.description, brand_norm=norm_brand(p.brand), price=p.price,
                category_key=p.category, model_key=p.model,
                doc=json.dumps(p.to_json())))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        return cls(index, schema)

    def iter_products(self) -> Iterator[Product]:
        """Every indexed product (index order, not a ranking)."""
        n = self.searcher.num_docs
        if not n:
            return
        for _score, addr in self.searcher.search(self.tantivy.Query.all_query(), n, count=False).hits:
            yield Product(**json.loads(self.searcher.doc(addr)["doc"][0]))

    def _one(self, query: str, filters: Filters, limit: int) -> list[Hit]:
        t = self.tantivy
        terms = query_terms(query)
        must: list[tuple[Any, Any]] = []
        if terms:
            text = self.index.parse_query(
                " ".join(terms), list(TEXT_FIELDS),
                field_boosts=dict(zip(TEXT_FIELDS, WEIGHTS, strict=True)))
            must.append((t.Occur.Must, text))
        if filters.brand:
            must.append((t.Occur.Must, t.Query.term_query(self.schema, "brand_norm",
                                                          norm_brand(filters.brand))))
        if filters.max_price is not None or filters.min_price is not None:
            lo = float(filters.min_price) if filters.min_price is not None else None
            hi = float(filters.max_price) if filters.max_price is not None else None
            must.append((t.Occur.Must, t.Query.range_query(
                self.schema, "price", t.FieldType.Float, lo, hi)))
        for field_name, values in (("category_key", filters.categories), ("model_key", filters.models)):
            if values:
                any_of = [(t.Occur.Should, t.Query.term_query(self.schema, field_name, v)) for v in values]
                must.append((t.Occur.Must, t.Query.boolean_query(any_of)))
        q = t.Query.boolean_query(must) if must else t.Query.all_query()
        res = self.searcher.search(q, limit, count=False)
        hits = []
        for score, addr in res.hits:
            doc = json.loads(self.searcher.doc(addr)["doc"][0])
            hits.append(Hit(Product(**doc), float(score) if terms else 0.0))
        if not terms:
            hits.sort(key=lambda h: -h.product.review_count)
        return rerank(hits)

    def search(self, queries: Sequence[str], filters: Filters | None = None,
               k: int = 5) -> list[Product]:
        qs = check_queries(queries, k) or [""]
        f = filters or Filters()
        return fuse([self._one(q, f, max(CANDIDATES, k)) for q in qs], k)
