"""Product listings, and a validated loader for a user's own catalog file.

The default catalog is real product models written as data (data/catalog/, expanded by
rufus/retrieval/catalog_data.py). Your own catalog: JSON Lines or CSV with the fields of
:class:`Product` (``attributes`` is a JSON object, in CSV a JSON string); :func:`load_catalog`
validates every row and raises :class:`CatalogError` naming the row and the field.
What each search feature needs from your catalog: docs/catalog.md.

    python scripts/build_catalog.py                      # default catalog + index
    python scripts/build_catalog.py --catalog my.jsonl   # your own
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BASE_URL = "https://shop.example.com"
IMAGE_URL = "https://images.shop.example.com"

# A typed attribute: a number (its unit in the key's suffix: "capacity_qt"), a feature
# (bool), a word ("OLED"), or a list of words (the sizes a shoe comes in).
AttrValue = str | int | float | bool | list[str]


@dataclass(frozen=True)
class Product:
    id: str
    title: str
    brand: str
    category: str
    price: float
    rating: float
    review_count: int
    description: str
    url: str
    image_url: str
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    model: str = ""  # the product model ("Sony WH-1000XM5"); listings of one model share it

    def card(self) -> dict[str, Any]:
        """What a client sees: the product card (assistant ``products`` event)."""
        return {"id": self.id, "title": self.title, "brand": self.brand, "price": self.price,
                "rating": self.rating, "url": self.url, "image_url": self.image_url,
                "model": self.model, "category": self.category,
                "attributes": dict(self.attributes)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __hash__(self) -> int:  # attributes hold lists: hash by id (ids are unique)
        return hash(self.id)


# ------------------------------------------------------------------ user catalogs

class CatalogError(ValueError):
    """A row of a user catalog is invalid; names the file, row (1-based) and field."""

    def __init__(self, source: str, row: int, field_name: str, reason: str) -> None:
        super().__init__(f"{source}: row {row}: {field_name}: {reason}")
        self.source, self.row, self.field, self.reason = source, row, field_name, reason


REQUIRED = ("id", "title", "brand", "price", "url")
OPTIONAL_DEFAULTS: dict[str, Any] = {"category": "", "rating": 0.0, "review_count": 0,
                                     "description": "", "image_url": "", "attributes": {},
                                     "model": ""}
KNOWN = set(REQUIRED) | set(OPTIONAL_DEFAULTS)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def validate_row(row: dict[str, Any], source: str, n: int) -> Product:
    """One row -> Product, or :class:`CatalogError` naming the first bad field."""
    def err(f: str, reason: str) -> CatalogError:
        return CatalogError(source, n, f, reason)

    unknown = sorted(set(row) - KNOWN)
    if unknown:
        raise err(unknown[0], f"unknown field; known fields: {sorted(KNOWN)}")
    for f in REQUIRED:
        if row.get(f) in (None, ""):
            raise err(f, "missing")
    out: dict[str, Any] = dict(OPTIONAL_DEFAULTS)
    for f in ("id", "title", "brand", "category", "description", "url", "image_url", "model"):
        v = row.get(f, out.get(f))
        if not isinstance(v, str):
            raise err(f, f"must be a string, got {_short(v)}")
        out[f] = v.strip()
    if len(out["title"]) > 300:
        raise err("title", f"is {len(out['title'])} characters; at most 300")
    for f in ("url", "image_url"):
        if out[f] and not re.match(r"^https?://\S+$", out[f]):
            raise err(f, f"must be an http(s) URL, got {_short(out[f])}")
    for f, lo, hi in (("price", 0.0, 1e7), ("rating", 0.0, 5.0)):
        v = row.get(f, out.get(f))
        try:
            num = float(v) if not isinstance(v, bool) and v not in (None, "") else float("nan")
        except (TypeError, ValueError):
            raise err(f, f"must be a number, got {_short(v)}") from None
        if not math.isfinite(num) or not lo <= num <= hi:
            raise err(f, f"must be a number in [{lo:g}, {hi:g}], got {_short(v)}")
        out[f] = num
    rc = row.get("review_count", 0)
    try:
        rc_i = int(rc) if not isinstance(rc, bool) and str(rc).strip().lstrip("-").isdigit() else None
    except (TypeError, ValueError):
        rc_i = None
    if rc_i is None or rc_i < 0:
        raise err("review_count", f"must be a non-negative integer, got {_short(rc)}")
    out["review_count"] = rc_i
    attrs = row.get("attributes", {})
    if isinstance(attrs, str):
        try:
            attrs = json.loads(attrs) if attrs.strip() else {}
        except json.JSONDecodeError as exc:
            raise err("attributes", f"is not valid JSON ({exc.msg})") from None
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise err("attributes", "must be an object of name -> value")
    out["attributes"] = {k: _attr(v, lambda why, k=k: err(f"attributes.{k}", why))
                         for k, v in attrs.items()}
    return Product(**out)


def _attr(v: Any, err: Any) -> AttrValue:
    """A typed attribute as given (number, bool, list of strings), anything else as text."""
    if isinstance(v, bool | str):
        return v
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise err(f"must be a finite number, got {_short(v)}")
        return v
    if isinstance(v, list):
        if not all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in v):
            raise err("a list must hold strings or numbers")
        return [str(x) for x in v]
    raise err(f"must be a number, true/false, a string or a list of strings, got {_short(v)}")


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise CatalogError(str(path), 1, "header", "empty CSV file")
            for i, row in enumerate(reader, start=2):  # row 1 is the header
                if None in row:
                    raise CatalogError(str(path), i, "row", "more values than header columns")
                yield i, {k: v for k, v in row.items() if v is not None}
        elif suffix in (".jsonl", ".ndjson", ".json"):
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CatalogError(str(path), i, "row", f"is not valid JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise CatalogError(str(path), i, "row", "must be a JSON object")
                yield i, obj
        else:
            raise CatalogError(str(path), 0, "file", "must end in .jsonl, .ndjson or .csv")


def load_catalog(path: str | Path) -> list[Product]:
    """Load and validate a JSONL or CSV catalog; ids must be unique."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"catalog {p} not found")
    seen: set[str] = set()
    out = []
    for n, row in _rows(p):
        prod = validate_row(row, str(p), n)
        if prod.id in seen:
            raise CatalogError(str(p), n, "id", f"duplicate id {_short(prod.id)}")
        seen.add(prod.id)
        out.append(prod)
    if not out:
        raise CatalogError(str(p), 0, "file", "no products")
    return out


def write_jsonl(products: Iterable[Product], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for prod in products:
            f.write(json.dumps(prod.to_json(), separators=(",", ":")) + "\n")
