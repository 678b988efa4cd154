"""Retrieval engines compared on the default catalog: index build time, query latency
(p50/p99 over the relevance set's queries, repeated) and relevance (recall@5, nDCG@5).

    python scripts/bench_retrieval.py                      # sqlite-fts5 vs tantivy
    python scripts/bench_retrieval.py --scale 10           # the same at 10x the catalog's size
    python scripts/bench_retrieval.py --write-relevance    # regenerate data/retrieval/relevance.jsonl

Both engines index the same fields with the same boosts, stemming and filters and share the
tie-break and fusion code (rufus/retrieval/base.py), so the comparison is of engines.
"""

from lab.retrieval_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
