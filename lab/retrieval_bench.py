"""Retrieval engines compared on the default catalog, behind scripts/bench_retrieval.py:
index build time, query latency and relevance (recall@5, nDCG@5) of each engine on the same
products and the same labelled queries.

``--scale N`` measures the cost at N times the catalog's size: every listing also appears as
N - 1 clones (new ids, model name and title suffixed " #1" ... " #N-1"); the labelled queries
are then labelled again over the larger catalog from the same specs (a clone meets the same
constraints as its listing, so it is as relevant)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from lab.loadgen import pct_nearest as pct
from rufus.retrieval.base import Filters
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import default_catalog
from rufus.retrieval.relevance import RELEVANCE_PATH, build_relevance, evaluate, load_relevance


def scaled_catalog(products: Sequence[Product], scale: int) -> list[Product]:
    """``products`` ``scale`` times over: each listing, then its clones #1 .. #scale-1 (new
    id, and the model name suffixed " #i" in the model, title and URL)."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    out = list(products)
    for i in range(1, scale):
        for p in products:
            pid = f"{p.id}-{i}"
            model = f"{p.model} #{i}"
            title = (model + p.title[len(p.model):] if p.model and p.title.startswith(p.model)
                     else f"{p.title} #{i}")
            out.append(dataclasses.replace(
                p, id=pid, model=model, title=title, url=p.url.replace(p.id, pid),
                image_url=p.image_url.replace(p.id, pid), attributes=dict(p.attributes)))
    return out


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1, metavar="N",
                    help="measure at N times the catalog's size (each listing cloned N-1 times)")
    ap.add_argument("--repeat", type=int, default=5, help="passes over the queries for latency")
    ap.add_argument("--engines", nargs="+", default=["sqlite-fts5", "tantivy"])
    ap.add_argument("--write-relevance", action="store_true",
                    help=f"regenerate {RELEVANCE_PATH.name} from the default catalog first")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args(argv)
    if a.scale < 1:
        ap.error(f"--scale must be >= 1, got {a.scale}")
    base = list(default_catalog())
    if a.write_relevance:
        items = build_relevance(base)
        RELEVANCE_PATH.parent.mkdir(parents=True, exist_ok=True)
        RELEVANCE_PATH.write_text("".join(json.dumps(i, separators=(",", ":")) + "\n" for i in items))
        print(f"wrote {len(items)} queries to {RELEVANCE_PATH}")
    products = scaled_catalog(base, a.scale)
    # At scale 1 the committed set; larger, the same specs labelled over the larger catalog.
    items = load_relevance() if a.scale == 1 else build_relevance(products)
    print(f"catalog: {len(products)} products (default catalog x{a.scale}, "
          f"{len({p.category for p in products})} categories); {len(items)} labelled queries; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.engines:
            t0 = time.perf_counter()
            if name == "sqlite-fts5":
                from rufus.retrieval.sqlite_fts import SqliteFtsRetriever

                eng = SqliteFtsRetriever.build(products, Path(tmp) / "idx.sqlite")
            elif name == "tantivy":
                from rufus.retrieval.tantivy_engine import TantivyRetriever

                os.makedirs(Path(tmp) / "tantivy")
                eng = TantivyRetriever.build(products, str(Path(tmp) / "tantivy"))
            else:
                raise SystemExit(f"unknown engine {name}")
            build_s = time.perf_counter() - t0
            rel = evaluate(lambda q, f, e=eng: [p.id for p in e.search([q], f)], items)
            lat = []
            for _ in range(a.repeat):
                for it in items:
                    f = Filters.from_plan(it["filters"])
                    t = time.perf_counter()
                    eng.search([it["query"]], f, k=5)
                    lat.append(time.perf_counter() - t)
            # the planner's comparison shape: 2-3 queries per search
            multi = []
            for i in range(0, len(items) - 2, 3):
                qs = [items[i]["query"], items[i + 1]["query"], items[i + 2]["query"]]
                t = time.perf_counter()
                eng.search(qs, Filters(), k=5)
                multi.append(time.perf_counter() - t)
            results[name] = {
                "build_s": build_s, "p50_ms": 1000 * statistics.median(lat),
                "p99_ms": 1000 * pct(lat, 0.99), "multi3_p99_ms": 1000 * pct(multi, 0.99),
                "products": len(products), "scale": a.scale, **rel}
            r = results[name]
            print(f"{name:12s} build {r['build_s']:.2f} s | query p50 {r['p50_ms']:.2f} ms "
                  f"p99 {r['p99_ms']:.2f} ms | 3-query p99 {r['multi3_p99_ms']:.2f} ms | "
                  f"recall@5 {r['recall@5']:.3f} nDCG@5 {r['ndcg@5']:.3f}", flush=True)
    if len(results) == 2:
        x, y = (results[n] for n in a.engines)
        print(f"ratios {a.engines[1]}/{a.engines[0]}: build {y['build_s'] / x['build_s']:.2f}x, "
              f"p99 {y['p99_ms'] / x['p99_ms']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0

