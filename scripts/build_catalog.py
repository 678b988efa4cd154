"""Build the product catalog and its search index (run by scripts/setup.sh).

    python scripts/build_catalog.py                         # the default catalog (data/catalog/)
    python scripts/build_catalog.py --catalog my.jsonl      # your own catalog (JSONL or CSV)

Writes build/retrieval/catalog.jsonl and build/retrieval/catalog.sqlite (or --index).
Bad rows in your own catalog stop the build with the file, row and field named.
"""

from rufus.retrieval.catalog_build import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
