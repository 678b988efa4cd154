"""The default catalog: real product models written as data (data/catalog/*.jsonl, format in
data/catalog/SCHEMA.md), expanded into listings the same way every time.

A model has one category, one product type and one set of specs; its listings differ only
along its variant axes (its ``variants``: storage, screen size, capacity, gender with its
sizes; and its colours). Colour never changes a listing's price. Ids are hashes of the
model and the variant, so adding a model changes no other listing's id.

    python scripts/build_catalog.py          # expands, checks and indexes the default catalog
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from rufus.retrieval.catalog import BASE_URL, IMAGE_URL, AttrValue, CatalogError, Product
from rufus.retrieval.phrases import phrase_problem

ROOT = Path(__file__).resolve().parents[2]
CATALOG_DIR = ROOT / "data" / "catalog"
ATTR_TYPES = ("number", "integer", "boolean", "string", "list")
# Keys along which listings of one model may differ (besides the colour): the real variant
# axes of a marketplace ("Size", "Capacity", "Storage"). Any other difference between two
# listings of one model is a second model under one name (the catalog check refuses it).
VARIANT_AXES = frozenset({"color", "size", "sizes", "gender", "storage_gb", "ram_gb", "screen_in",
                          "diameter_in", "length_in", "width_in", "wheel_in", "waist_in",
                          "case_mm", "weight_lb", "connectivity", "kit", "piece_count",
                          "processor", "chip", "gpu", "frame_size", "count", "pack_count"})
VARIANT_PREFIXES = ("capacity_", "size_")


@dataclass(frozen=True)
class CategorySpec:
    """A product type as shoppers name it: its nouns, its department and its spec keys."""

    key: str
    name: str
    department: str
    nouns: tuple[str, ...]
    attributes: dict[str, str]  # spec key -> "number" | "integer" | "boolean" | "string" | "list"
    uses: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # how shoppers describe the need it meets ("boil water for tea")


@dataclass(frozen=True)
class ModelSpec:
    category: str
    brand: str
    model: str
    type: str
    list_price: float
    rating: float
    specs: dict[str, AttrValue]
    uses: tuple[str, ...]
    description: str
    colors: tuple[str, ...]
    variants: tuple[dict[str, Any], ...]
    source: str  # "file:line", for errors


def _type_ok(kind: str, v: Any) -> bool:
    if kind == "number":
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "string":
        return isinstance(v, str) and bool(v.strip())
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_number(v: Any) -> TypeGuard[int | float]:
    return _type_ok("number", v)


def _category(obj: dict[str, Any], src: str, n: int) -> CategorySpec:
    def err(f: str, why: str) -> CatalogError:
        return CatalogError(src, n, f, why)
    for f in ("key", "name", "department"):
        if not isinstance(obj.get(f), str) or not obj[f].strip():
            raise err(f, "must be a non-empty string")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", obj["key"]):
        raise err("key", f"must be snake_case, got {obj['key'][:40]!r}")
    nouns = obj.get("nouns")
    if not isinstance(nouns, list) or not nouns or not all(isinstance(x, str) and x.strip() for x in nouns):
        raise err("nouns", "must be a non-empty list of strings")
    attrs = obj.get("attributes")
    if not isinstance(attrs, dict) or not all(t in ATTR_TYPES for t in attrs.values()):
        raise err("attributes", f"must map spec keys to one of {list(ATTR_TYPES)}")
    return CategorySpec(key=obj["key"], name=obj["name"].strip(), department=obj["department"].strip(),
                        nouns=tuple(x.strip().lower() for x in nouns), attributes=dict(attrs),
                        uses=tuple(obj.get("uses") or ()))


def _model(obj: dict[str, Any], cats: dict[str, CategorySpec], src: str, n: int) -> ModelSpec:
    def err(f: str, why: str) -> CatalogError:
        return CatalogError(src, n, f, why)
    cat = cats.get(obj.get("category", ""))
    if cat is None:
        raise err("category", f"unknown category {str(obj.get('category'))[:40]!r} (declare it first)")
    for f in ("brand", "model", "type", "description"):
        if not isinstance(obj.get(f), str) or not obj[f].strip():
            raise err(f, "must be a non-empty string")
    if not obj["model"].lower().startswith(obj["brand"].lower()):
        raise err("model", "must start with the brand")
    price = obj.get("list_price")
    if not _is_number(price) or price <= 0:
        raise err("list_price", "must be a positive number")
    rating = obj.get("rating", 4.4)
    if not _is_number(rating) or not 1 <= rating <= 5:
        raise err("rating", "must be a number in [1, 5]")
    specs = obj.get("specs") or {}

    def check_attrs(values: dict[str, Any], field: str) -> None:
        for k, v in values.items():
            if k == "price":
                continue
            kind = cat.attributes.get(k)
            if kind is None:
                raise err(f"{field}.{k}", f"not declared in category {cat.key}")
            if not _type_ok(kind, v):
                raise err(f"{field}.{k}", f"must be a {kind}, got {json.dumps(v)[:40]}")

    if not isinstance(specs, dict):
        raise err("specs", "must be an object")
    check_attrs(specs, "specs")
    variants = obj.get("variants") or []
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants) or len(variants) > 6:
        raise err("variants", "must be a list of at most 6 objects")
    for v in variants:
        check_attrs(v, "variants")
        if "price" in v and (not _type_ok("number", v["price"]) or v["price"] <= 0):
            raise err("variants.price", "must be a positive number")
    colors = obj.get("colors") or []
    if not isinstance(colors, list) or not all(isinstance(c, str) and c.strip() for c in colors):
        raise err("colors", "must be a list of colour names")
    uses = obj.get("uses") or []
    return ModelSpec(category=cat.key, brand=obj["brand"].strip(), model=obj["model"].strip(),
                     type=obj["type"].strip(), list_price=float(price), rating=float(rating),
                     specs=dict(specs), uses=tuple(u.strip() for u in uses if isinstance(u, str)),
                     description=obj["description"].strip(), colors=tuple(colors),
                     variants=tuple(variants), source=f"{src}:{n}")


@functools.cache
def read_models(directory: str = str(CATALOG_DIR)) -> tuple[tuple[CategorySpec, ...], tuple[ModelSpec, ...]]:
    """Every category and model of the data files (sorted by file name), validated: a bad
    line raises :class:`CatalogError` naming the file, line and field."""
    cats: dict[str, CategorySpec] = {}
    models: list[ModelSpec] = []
    needs: list[tuple[str, int, dict[str, Any]]] = []
    seen: set[str] = set()
    files = sorted(Path(directory).glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no catalog data (*.jsonl) in {directory}")
    for path in files:
        src = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CatalogError(src, n, "line", f"is not valid JSON ({exc.msg})") from None
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if kind == "header":
                continue
            if kind == "category":
                c = _category(obj, src, n)
                if c.key in cats:
                    raise CatalogError(src, n, "key", f"category {c.key} declared twice")
                cats[c.key] = c
            elif kind == "needs":
                needs.append((src, n, obj))
            elif kind == "phrases":  # read by rufus/retrieval/phrases.py; checked here
                bad = phrase_problem(obj)
                if bad is not None:
                    raise CatalogError(src, n, *bad)
            elif kind == "model":
                m = _model(obj, cats, src, n)
                if m.model.lower() in seen:
                    raise CatalogError(src, n, "model", f"{m.model[:40]!r} listed twice")
                seen.add(m.model.lower())
                models.append(m)
            else:
                raise CatalogError(src, n, "kind", "must be header, category, needs, phrases or model")
    for src, n, obj in needs:  # a category's needs may come from a file read before it
        spec = cats.get(obj.get("category", ""))
        phrases = obj.get("needs")
        if spec is None:
            raise CatalogError(src, n, "category", f"unknown category {str(obj.get('category'))[:40]!r}")
        if not isinstance(phrases, list) or not all(isinstance(x, str) for x in phrases):
            raise CatalogError(src, n, "needs", "must be a list of strings")
        cats[spec.key] = dataclasses.replace(
            spec, needs=spec.needs + tuple(x.strip().lower() for x in phrases))
    return tuple(cats.values()), tuple(models)


# ------------------------------------------------------------------ listings

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80]


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


# How a variant's value reads in a listing's title ("65 Inch", "6 Quart", "256GB").
_TITLE_UNITS = {"in": " Inch", "qt": " Quart", "oz": " oz", "l": "L", "gb": "GB", "tb": "TB",
                "lb": " lb", "mm": "mm", "people": "-Person", "count": "-Count", "cups": " Cup"}


def title_value(key: str, value: AttrValue) -> str:
    if isinstance(value, bool) or isinstance(value, list):
        return ""
    if isinstance(value, str):
        return value
    unit = key.rsplit("_", 1)[-1] if "_" in key else ""
    if unit == "gb" and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}TB"
    if key == "piece_count":
        return f"{value} Pieces"
    return _num(value) + _TITLE_UNITS.get(unit, f" {unit}" if unit else "")


def _reviews(model: str) -> int:
    """Review count, per model (a marketplace shares reviews across a model's variants):
    illustrative, fixed by the model's name."""
    rng = random.Random(hashlib.sha1(model.encode()).digest())
    return int(math.exp(rng.uniform(math.log(150), math.log(45_000))))


def _uses_sentence(uses: Sequence[str]) -> str:
    if not uses:
        return ""
    said = uses[0] if len(uses) == 1 else ", ".join(uses[:-1]) + " and " + uses[-1]
    return f" Built for {said}."


def listings(m: ModelSpec) -> list[Product]:
    """The listings of one model: one per variant and colour, in data order."""
    out = []
    reviews = _reviews(m.model)
    for v in m.variants or ({},):
        for colour in m.colors or ("",):
            attrs: dict[str, AttrValue] = {**m.specs, **{k: x for k, x in v.items() if k != "price"}}
            if colour:
                attrs["color"] = colour
            gender = attrs.get("gender")
            kind = f"{gender} {m.type}" if isinstance(gender, str) and gender not in m.type else m.type
            parts = [title_value(k, x) for k, x in v.items() if k not in ("price", "gender", "sizes")]
            parts = [p for p in parts if p] + ([colour] if colour else [])
            title = f"{m.model} {kind}" + (", " + ", ".join(parts) if parts else "")
            key = json.dumps([m.model, sorted((k, str(x)) for k, x in v.items()), colour])
            pid = "P" + hashlib.sha1(key.encode()).hexdigest()[:9].upper()
            out.append(Product(
                id=pid, title=title, brand=m.brand, category=m.category,
                price=round(float(v.get("price", m.list_price)), 2), rating=round(m.rating, 1),
                review_count=reviews, description=m.description + _uses_sentence(m.uses),
                url=f"{BASE_URL}/p/{pid}/{_slug(m.model + ' ' + m.type)}",
                image_url=f"{IMAGE_URL}/{pid}.jpg", attributes=attrs, model=m.model))
    return out


@functools.cache
def default_catalog() -> tuple[Product, ...]:
    """Every listing of the default catalog, in data order (the same bytes every time)."""
    _cats, models = read_models()
    out: list[Product] = []
    seen: set[str] = set()
    for m in models:
        for p in listings(m):
            if p.id in seen:
                raise CatalogError(m.source, 0, "variants", f"two listings of {m.model} are the same")
            seen.add(p.id)
            out.append(p)
    return tuple(out)


def default_categories() -> tuple[CategorySpec, ...]:
    return read_models()[0]


# ------------------------------------------------------------------ the catalog check

def _is_axis(key: str) -> bool:
    return key in VARIANT_AXES or key.startswith(VARIANT_PREFIXES)


def check_catalog(products: Iterable[Product], colour_spread: float = 0.05) -> list[str]:
    """What makes a catalog unbelievable, one line per problem (empty: none): a model under
    several categories, product types or spec sets; listings of one model that differ in
    anything but a variant axis; colour variants priced more than ``colour_spread`` apart."""
    by_model: dict[str, list[Product]] = {}
    for p in products:
        if p.model:
            by_model.setdefault(p.model, []).append(p)
    problems = []
    for model, ps in by_model.items():
        cats = {p.category for p in ps}
        if len(cats) > 1:
            problems.append(f"{model}: {len(cats)} categories {sorted(cats)}")
        kinds = {p.title.split(",")[0].replace("Men's ", "").replace("Women's ", "").replace("Kids' ", "")
                 for p in ps}
        if len(kinds) > 1:
            problems.append(f"{model}: {len(kinds)} product types {sorted(kinds)[:3]}")
        keys = {k for p in ps for k in p.attributes}
        for k in sorted(keys):
            vals = {json.dumps(p.attributes.get(k), sort_keys=True) for p in ps}
            if len(vals) > 1 and not _is_axis(k):
                problems.append(f"{model}: spec {k} differs between listings ({len(vals)} values) "
                                "and is no variant axis")
        groups: dict[str, list[float]] = {}
        for p in ps:
            rest = {k: v for k, v in p.attributes.items() if k != "color"}
            groups.setdefault(json.dumps(rest, sort_keys=True), []).append(p.price)
        for prices in groups.values():
            if len(prices) > 1 and max(prices) > min(prices) * (1 + colour_spread):
                problems.append(f"{model}: colours of one variant priced {min(prices):.2f}-{max(prices):.2f}")
    return problems
