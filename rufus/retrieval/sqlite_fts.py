"""Default engine: SQLite FTS5 (BM25), embedded, in the standard library's sqlite3.

Chosen over tantivy with the numbers in docs/benchmarks.md (scripts/bench_retrieval.py):
same relevance, no extra dependency, the index is one file that any process opens
read-only. Title, brand, category and description are indexed with the Porter stemmer
("shoes" finds "shoe"); BM25 column weights favour the title and brand. Filters are plain
SQL on the products table, so a result can never violate them.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from rufus.retrieval.base import Filters, Hit, check_queries, fuse, norm_brand, query_terms, rerank
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import CategorySpec, default_categories

# bm25() weights per FTS column: title, brand, category, description.
WEIGHTS = (4.0, 3.0, 2.0, 1.0)
CANDIDATES = 50  # per query, before the popularity tie-break and fusion

SCHEMA = """
CREATE TABLE products (
  rowid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, title TEXT NOT NULL, brand TEXT NOT NULL,
  brand_norm TEXT NOT NULL, category TEXT NOT NULL, category_text TEXT NOT NULL,
  price REAL NOT NULL, rating REAL NOT NULL, review_count INTEGER NOT NULL,
  description TEXT NOT NULL, url TEXT NOT NULL,
  image_url TEXT NOT NULL, attributes TEXT NOT NULL, model TEXT NOT NULL);
CREATE INDEX products_brand ON products(brand_norm, price);
CREATE INDEX products_category ON products(category, price);
CREATE INDEX products_model ON products(model);
CREATE TABLE categories (key TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE VIRTUAL TABLE products_fts USING fts5(
  title, brand, category_text, description, content='products', content_rowid='rowid',
  tokenize='porter unicode61 remove_diacritics 2');
"""
COLS = "p.id, p.title, p.brand, p.category, p.price, p.rating, p.review_count, p.description, " \
       "p.url, p.image_url, p.attributes, p.model"


def _product(row: tuple) -> Product:
    (pid, title, brand, cat, price, rating, reviews, desc, url, image, attrs, model) = row
    return Product(id=pid, title=title, brand=brand, category=cat, price=price, rating=rating,
                   review_count=reviews, description=desc, url=url, image_url=image,
                   attributes=json.loads(attrs), model=model)


def build_index(products: Sequence[Product], path: str | Path = ":memory:",
                categories: Sequence[CategorySpec] = ()) -> sqlite3.Connection:
    """Create the index (replacing a file at ``path``); returns the open connection.
    ``categories``: the product types' nouns and spec keys (rufus.retrieval.taxonomy), kept
    in the index so that a process opening it reads the same taxonomy."""
    if str(path) != ":memory:":
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(p) + suffix).unlink(missing_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.executescript(SCHEMA)
    conn.executemany(
        "INSERT INTO products VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [(i + 1, p.id, p.title, p.brand, norm_brand(p.brand), p.category, p.category.replace("_", " "),
          p.price, p.rating, p.review_count, p.description, p.url, p.image_url,
          json.dumps(p.attributes), p.model) for i, p in enumerate(products)])
    conn.executemany("INSERT INTO categories VALUES (?, ?)",
                     [(c.key, json.dumps(dataclasses.asdict(c))) for c in categories])
    conn.execute("INSERT INTO products_fts(products_fts) VALUES ('rebuild')")
    conn.execute("INSERT INTO products_fts(products_fts) VALUES ('optimize')")
    conn.commit()
    return conn


class SqliteFtsRetriever:
    """BM25 over FTS5. Thread-safe: one connection, searches serialized by a lock (each
    takes about a millisecond; see docs/benchmarks.md)."""

    name = "sqlite-fts5"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    @classmethod
    def build(cls, products: Sequence[Product], path: str | Path = ":memory:",
              categories: Sequence[CategorySpec] | None = None) -> SqliteFtsRetriever:
        """``categories`` default to the default catalog's for the categories it shares."""
        if categories is None:
            present = {p.category for p in products}
            categories = [c for c in default_categories() if c.key in present]
        return cls(build_index(products, path, categories))

    def categories(self) -> list[CategorySpec]:
        """The product types stored with the index (empty for an index without them)."""
        with self.lock:
            rows = self.conn.execute("SELECT spec FROM categories ORDER BY rowid").fetchall()
        out = []
        for (spec,) in rows:
            d = json.loads(spec)
            out.append(CategorySpec(**{**d, "nouns": tuple(d["nouns"]), "uses": tuple(d["uses"]),
                                       "needs": tuple(d.get("needs", ()))}))
        return out

    @classmethod
    def open(cls, path: str | Path) -> SqliteFtsRetriever:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"search index {p} not found: run `python scripts/build_catalog.py`")
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, check_same_thread=False)
        return cls(conn)

    def __len__(self) -> int:
        with self.lock:
            return int(self.conn.execute("SELECT count(*) FROM products").fetchone()[0])

    def get(self, pid: str) -> Product | None:
        with self.lock:
            row = self.conn.execute(f"SELECT {COLS} FROM products p WHERE p.id = ?", (pid,)).fetchone()
        return _product(row) if row else None

    def iter_products(self, batch: int = 2000) -> Iterator[Product]:
        """Every product in index order, read in batches so searches wait for one batch at
        most (grounding builds its vocabulary from this once)."""
        last = 0
        while True:
            with self.lock:
                rows = self.conn.execute(
                    f"SELECT p.rowid, {COLS} FROM products p WHERE p.rowid > ? ORDER BY p.rowid LIMIT ?",
                    (last, batch)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            for r in rows:
                yield _product(r[1:])

    def _one(self, query: str, filters: Filters, limit: int) -> list[Hit]:
        terms = query_terms(query)
        where: list[str] = []
        args: list[str | float] = []  # SQL parameters: text, prices, the limit
        if filters.brand:
            where.append("p.brand_norm = ?")
            args.append(norm_brand(filters.brand))
        if filters.max_price is not None:
            where.append("p.price <= ?")
            args.append(filters.max_price)
        if filters.min_price is not None:
            where.append("p.price >= ?")
            args.append(filters.min_price)
        for col, values in (("p.category", filters.categories), ("p.model", filters.models)):
            if values:
                where.append(f"{col} IN ({','.join('?' * len(values))})")
                args.extend(values)
        if not terms:  # nothing to match on (e.g. "any under $60?"): most reviewed first
            sql = (f"SELECT {COLS}, 0.0 FROM products p "
                   f"{'WHERE ' + ' AND '.join(where) if where else ''} "
                   "ORDER BY p.review_count DESC LIMIT ?")
        else:
            match = " OR ".join('"' + t + '"' for t in terms)
            w = ", ".join(str(x) for x in WEIGHTS)
            # Rank inside FTS5 first (top-N by BM25, then fetch those rows) unless a filter
            # must see every match: joining all matches first costs ~2x (measured).
            ranked = ("SELECT rowid, bm25(products_fts, {w}) AS s FROM products_fts "
                      "WHERE products_fts MATCH ? {order}").format(
                          w=w, order="" if where else "ORDER BY s LIMIT ?")
            sql = (f"SELECT {COLS}, -m.s FROM ({ranked}) m JOIN products p ON p.rowid = m.rowid"
                   + (" WHERE " + " AND ".join(where) if where else "")
                   + " ORDER BY m.s LIMIT ?")
            if not where:
                args.append(limit)
            args.insert(0, match)
        with self.lock:
            rows = self.conn.execute(sql, (*args, limit)).fetchall()
        return rerank([Hit(_product(r[:-1]), float(r[-1])) for r in rows])

    def search(self, queries: Sequence[str], filters: Filters | None = None,
               k: int = 5) -> list[Product]:
        qs = check_queries(queries, k)
        f = filters or Filters()
        if not qs:
            qs = [""]
        return fuse([self._one(q, f, max(CANDIDATES, k)) for q in qs], k)
