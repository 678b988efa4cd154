"""Product catalog and search (issue 16): one small interface, :class:`Retriever`.

- ``SqliteFtsRetriever`` (default): SQLite FTS5 BM25, embedded, index file under build/.
- ``TantivyRetriever``: the benchmark's comparison engine.
- ``OpenSearchRetriever``: the engine to move to at scale (untested here, no server).

``GroundedSearch`` wraps any of them: the plan's brand, price cap and words checked against
the catalog before searching, filters relaxed when nothing matches (rufus/retrieval/search.py).

:func:`default_retriever` is what the assistant uses: the index built by setup
(``scripts/build_catalog.py``), or the catalog named by ``RUFUS_CATALOG`` / the generated
one indexed in memory when there is no index file (about a second).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rufus.env import env_opt, env_str
from rufus.retrieval.base import Filters, Retriever
from rufus.retrieval.catalog import Product, load_catalog
from rufus.retrieval.catalog_data import default_catalog, default_categories
from rufus.retrieval.price import Price, parse_price_cap
from rufus.retrieval.search import GroundedSearch, SearchOutcome
from rufus.retrieval.sqlite_fts import SqliteFtsRetriever
from rufus.retrieval.vocabulary import Vocabulary

__all__ = ["DEFAULT_INDEX", "Filters", "GroundedSearch", "Price", "Product", "Retriever",
           "SearchOutcome", "SqliteFtsRetriever", "Vocabulary", "default_retriever", "index_path",
           "parse_price_cap"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INDEX = ROOT / "build" / "retrieval" / "catalog.sqlite"
log = logging.getLogger("rufus.retrieval")


def index_path() -> Path:
    return Path(env_str("RUFUS_CATALOG_INDEX", str(DEFAULT_INDEX)))


def default_retriever() -> SqliteFtsRetriever:
    path = index_path()
    if path.exists():
        return SqliteFtsRetriever.open(path)
    src = env_opt("RUFUS_CATALOG")
    products = load_catalog(src) if src else list(default_catalog())
    log.warning("search index %s missing (run scripts/build_catalog.py); indexed %d products "
                "in memory", path, len(products))
    return SqliteFtsRetriever.build(products, categories=() if src else default_categories())
