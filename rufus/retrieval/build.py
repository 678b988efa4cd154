"""Build the product catalog and its search index: the generated catalog or the operator's
own (validated, a bad row names its file, row and field), written as JSON Lines and indexed
into SQLite FTS5 (scripts/build_catalog.py; scripts/setup.sh catalog, in the image too)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rufus.retrieval import index_path
from rufus.retrieval.catalog import (
    DEFAULT_SEED,
    DEFAULT_SIZE,
    CatalogError,
    generate_catalog,
    load_catalog,
    write_jsonl,
)
from rufus.retrieval.sqlite_fts import build_index


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--catalog", help="your own catalog (.jsonl or .csv) instead of the generated one")
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--index", type=Path, default=index_path())
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        products = load_catalog(a.catalog) if a.catalog else generate_catalog(a.size, a.seed)
    except (CatalogError, FileNotFoundError) as exc:
        print(f"catalog error: {exc}", file=sys.stderr)
        return 2
    t1 = time.monotonic()
    write_jsonl(products, a.index.with_suffix(".jsonl"))
    build_index(products, a.index).close()
    cats = len({p.category for p in products})
    print(f"[build_catalog] {len(products)} products, {cats} categories "
          f"({'from ' + a.catalog if a.catalog else f'generated, seed {a.seed}'}) in {t1 - t0:.2f} s; "
          f"index {a.index} in {time.monotonic() - t1:.2f} s", flush=True)
    return 0

