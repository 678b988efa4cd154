"""Build the product catalog and its search index: the default catalog (real product models
as data, data/catalog/) or the operator's own (validated, a bad row names its file, row and
field), written as JSON Lines and indexed into SQLite FTS5 (scripts/build_catalog.py;
scripts/setup.sh catalog, in the image too). The default catalog is checked first
(rufus.retrieval.catalog_data.check_catalog): a model under two types or spec sets, or
colours priced apart, fails the build."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rufus.retrieval import index_path
from rufus.retrieval.catalog import CatalogError, load_catalog, write_jsonl
from rufus.retrieval.catalog_data import check_catalog, default_catalog, default_categories
from rufus.retrieval.sqlite_fts import build_index


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--catalog", help="your own catalog (.jsonl or .csv) instead of the default one")
    ap.add_argument("--index", type=Path, default=index_path())
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        products = load_catalog(a.catalog) if a.catalog else list(default_catalog())
        categories = () if a.catalog else default_categories()
    except (CatalogError, FileNotFoundError) as exc:
        print(f"catalog error: {exc}", file=sys.stderr)
        return 2
    problems = check_catalog(products)
    for p in problems[:20]:
        print(f"catalog check: {p}", file=sys.stderr)
    if problems and not a.catalog:
        print(f"catalog error: {len(problems)} problems in the default catalog", file=sys.stderr)
        return 2
    t1 = time.monotonic()
    write_jsonl(products, a.index.with_suffix(".jsonl"))
    build_index(products, a.index, categories).close()
    cats = len({p.category for p in products})
    models = len({p.model for p in products if p.model})
    print(f"[build_catalog] {len(products)} listings of {models} models, {cats} categories "
          f"({'from ' + a.catalog if a.catalog else 'the default catalog, data/catalog/'}) in "
          f"{t1 - t0:.2f} s; index {a.index} in {time.monotonic() - t1:.2f} s", flush=True)
    return 0
