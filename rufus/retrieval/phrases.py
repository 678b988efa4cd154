"""The words shoppers use for an attribute (data/catalog/phrases.jsonl: "print on both sides"
for ``auto_duplex``, "what size room" for ``coverage_sqft``), beside the key's own words and
the hand-kept table in rufus/retrieval/constraints.py (FEATURE_WORDS). Read once; a key of a
user's catalog with the same name gets the same phrases. Its own module because both the
question's keys (rufus/retrieval/attributes.py) and its required features
(rufus/retrieval/constraints.py) read it, and the catalog reader checks its lines."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

PHRASES_PATH = Path(__file__).resolve().parents[2] / "data" / "catalog" / "phrases.jsonl"


def phrase_problem(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(field, reason) when a phrases line is malformed; None when it is fine."""
    if not isinstance(obj.get("key"), str) or not obj["key"]:
        return "key", "must be an attribute key"
    ps = obj.get("phrases")
    if not isinstance(ps, list) or not all(isinstance(x, str) and x.strip() for x in ps):
        return "phrases", "must be a list of non-empty strings"
    return None


@functools.lru_cache(maxsize=1)
def catalog_phrases(path: str = str(PHRASES_PATH)) -> dict[str, tuple[str, ...]]:
    """Key -> its phrases, lower case, from ``path`` (none when the file is absent)."""
    out: dict[str, tuple[str, ...]] = {}
    p = Path(path)
    if not p.is_file():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line) if line.strip() else {}
        if obj.get("kind") == "phrases" and phrase_problem(obj) is None:
            out[obj["key"]] = tuple(" ".join(x.lower().split()) for x in obj["phrases"])
    return out
