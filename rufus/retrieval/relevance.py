"""Labelled relevance set for the default catalog, and recall@k / nDCG@k.

Labels come from the catalog's structured fields, never from a search engine's output: a
query is written together with the constraint it expresses (category, optionally brand and
attributes; a price cap travels as a filter, as the planner sends it), and every product
satisfying the constraint is relevant. Some queries use words the catalog does not
(synonyms, needs instead of product names) so the set also measures what BM25 misses.

    python scripts/bench_retrieval.py --write-relevance   # regenerate data/retrieval/relevance.jsonl
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rufus.retrieval.base import Filters
from rufus.retrieval.catalog import AttrValue, Product

ROOT = Path(__file__).resolve().parents[2]
RELEVANCE_PATH = ROOT / "data" / "retrieval" / "relevance.jsonl"

# (query, category, constraints, filters). constraints: brand and typed attribute values as
# the catalog stores them (a number compares as a number: {"screen_in": 65}; a feature as a
# boolean: {"waterproof": True}; a word case-insensitively; against a list, such as a shoe's
# sizes, the value must be one of its items).
Spec = tuple[str, str, dict[str, AttrValue], dict[str, Any]]
SPECS: list[Spec] = [
    # category words as customers type them
    ("running shoes", "running_shoes", {}, {}),
    ("hiking boots", "hiking_boots", {}, {}),
    ("noise cancelling headphones", "headphones", {}, {}),
    ("wireless earbuds", "earbuds", {}, {}),
    ("portable bluetooth speaker", "bluetooth_speaker", {}, {}),
    ("soundbar", "soundbar", {}, {}),
    ("smart tv", "tv", {}, {}),
    ("record player", "turntable", {}, {}),
    ("mirrorless camera", "camera", {}, {}),
    ("action camera", "action_camera", {}, {}),
    ("laptop", "laptop", {}, {}),
    ("gaming laptop", "laptop", {}, {}),
    ("android tablet", "tablet", {}, {}),
    ("unlocked smartphone", "smartphone", {}, {}),
    ("smartwatch", "smartwatch", {}, {}),
    ("gaming monitor", "monitor", {}, {}),
    ("mechanical keyboard", "keyboard", {}, {}),
    ("wireless mouse", "mouse", {}, {}),
    ("wireless printer", "printer", {"wireless": True}, {}),
    ("portable ssd", "external_drive", {}, {}),
    ("video game console", "gaming_console", {}, {}),
    ("face moisturizer", "moisturizer", {}, {}),
    ("baby stroller", "stroller", {}, {}),
    ("lego set", "building_set", {"brand": "LEGO"}, {}),
    ("cordless drill", "drill", {}, {}),
    ("rain jacket", "jacket", {}, {}),
    ("winter coat", "jacket", {}, {}),
    ("t-shirt", "tshirt", {}, {}),
    ("slim fit jeans", "jeans", {}, {}),
    ("polarized sunglasses", "sunglasses", {"polarized": True}, {}),
    ("carry-on luggage", "luggage", {}, {}),
    ("robot vacuum", "robot_vacuum", {}, {}),
    ("cordless stick vacuum", "vacuum", {}, {}),
    ("memory foam mattress", "mattress", {}, {}),
    ("office chair", "office_chair", {}, {}),
    ("standing desk", "desk", {}, {}),
    ("coffee maker", "coffee_maker", {}, {}),
    ("espresso machine", "espresso_machine", {}, {}),
    ("blender for smoothies", "blender", {}, {}),
    ("air fryer", "air_fryer", {}, {}),
    ("cast iron skillet", "frying_pan", {}, {}),
    ("chef knife", "kitchen_knife", {}, {}),
    ("camping tent", "tent", {}, {}),
    ("laptop backpack", "backpack", {}, {}),
    ("hiking backpack", "backpack", {}, {}),
    ("insulated water bottle", "water_bottle", {}, {}),
    ("yoga mat", "yoga_mat", {}, {}),
    ("adjustable dumbbells", "dumbbells", {}, {}),
    # brand + category in the text
    ("nike running shoes", "running_shoes", {"brand": "Nike"}, {}),
    ("hoka shoes", "running_shoes", {"brand": "Hoka"}, {}),
    ("adidas sneakers", "sneakers", {"brand": "Adidas"}, {}),
    ("sony headphones", "headphones", {"brand": "Sony"}, {}),
    ("samsung earbuds", "earbuds", {"brand": "Samsung"}, {}),
    ("jbl speaker", "bluetooth_speaker", {"brand": "JBL"}, {}),
    ("samsung tv", "tv", {"brand": "Samsung"}, {}),
    ("lg oled tv", "tv", {"brand": "LG"}, {}),
    ("dell laptop", "laptop", {"brand": "Dell"}, {}),
    ("lenovo thinkpad", "laptop", {"brand": "Lenovo"}, {}),
    ("google pixel phone", "smartphone", {"brand": "Google"}, {}),
    ("garmin watch", "smartwatch", {"brand": "Garmin"}, {}),
    ("fitbit tracker", "fitness_tracker", {"brand": "Fitbit"}, {}),
    ("canon camera", "camera", {"brand": "Canon"}, {}),
    ("keurig coffee maker", "coffee_maker", {"brand": "Keurig"}, {}),
    ("vitamix blender", "blender", {"brand": "Vitamix"}, {}),
    ("dyson vacuum", "vacuum", {"brand": "Dyson"}, {}),
    ("ninja air fryer", "air_fryer", {"brand": "Ninja"}, {}),
    ("osprey backpack", "backpack", {"brand": "Osprey"}, {}),
    ("stanley tumbler", "water_bottle", {"brand": "Stanley"}, {}),
    ("yeti cooler", "cooler", {"brand": "YETI"}, {}),
    ("weber grill", "grill", {"brand": "Weber"}, {}),
    ("patagonia jacket", "jacket", {"brand": "Patagonia"}, {}),
    ("levis jeans", "jeans", {"brand": "Levi's"}, {}),
    ("ray-ban sunglasses", "sunglasses", {"brand": "Ray-Ban"}, {}),
    ("logitech mouse", "mouse", {"brand": "Logitech"}, {}),
    ("coleman tent", "tent", {"brand": "Coleman"}, {}),
    ("cerave moisturizer", "moisturizer", {"brand": "CeraVe"}, {}),
    # brand as the planner's filter
    ("running shoes", "running_shoes", {"brand": "ASICS"}, {"brand": "asics"}),
    ("headphones", "headphones", {"brand": "Sennheiser"}, {"brand": "sennheiser"}),
    ("earbuds", "earbuds", {"brand": "Apple"}, {"brand": "apple"}),
    ("tv", "tv", {"brand": "TCL"}, {"brand": "tcl"}),
    ("laptop", "laptop", {"brand": "HP"}, {"brand": "hp"}),
    ("tablet", "tablet", {"brand": "Samsung"}, {"brand": "samsung"}),
    ("vacuum", "vacuum", {"brand": "Shark"}, {"brand": "shark"}),
    ("backpack", "backpack", {"brand": "The North Face"}, {"brand": "the north face"}),
    ("sheets", "bed_sheets", {"brand": "Brooklinen"}, {"brand": "brooklinen"}),
    # price caps as filters
    ("running shoes", "running_shoes", {}, {"max_price": 100}),
    ("wireless earbuds", "earbuds", {}, {"max_price": 50}),
    ("headphones", "headphones", {}, {"max_price": 100}),
    ("laptop", "laptop", {}, {"max_price": 800}),
    ("tv", "tv", {}, {"max_price": 500}),
    ("coffee maker", "coffee_maker", {}, {"max_price": 100}),
    ("smartwatch", "smartwatch", {}, {"max_price": 250}),
    ("air fryer", "air_fryer", {}, {"max_price": 80}),
    ("yoga mat", "yoga_mat", {}, {"max_price": 40}),
    ("office chair", "office_chair", {}, {"max_price": 300}),
    ("nike running shoes", "running_shoes", {"brand": "Nike"}, {"max_price": 120}),
    ("sony headphones", "headphones", {"brand": "Sony"}, {"brand": "sony", "max_price": 200}),
    # attributes in the text (typed values: numbers, booleans, words, list items)
    ("65 inch tv", "tv", {"screen_in": 65}, {}),
    ("oled tv", "tv", {"panel": "OLED"}, {}),
    ("144hz gaming monitor", "monitor", {"refresh_hz": 144}, {}),
    ("16gb ram laptop", "laptop", {"ram_gb": 16}, {}),
    ("256gb iphone", "smartphone", {"brand": "Apple", "storage_gb": 256}, {}),
    ("2tb external hard drive", "external_drive", {"storage_gb": 2048}, {}),
    ("women's running shoes", "running_shoes", {"gender": "Women's"}, {}),
    ("men's running shoes size 10", "running_shoes", {"gender": "Men's", "sizes": "10"}, {}),
    ("trail running shoes", "running_shoes", {"terrain": "trail"}, {}),
    ("men's rain jacket", "jacket", {"gender": "Men's", "style": "rain jacket"}, {}),
    ("waterproof hiking boots", "hiking_boots", {"waterproof": True}, {}),
    ("waterproof bluetooth speaker", "bluetooth_speaker", {"waterproof": True}, {}),
    ("4 person tent", "tent", {"capacity_people": 4}, {}),
    ("40 oz water bottle", "water_bottle", {"capacity_oz": 40}, {}),
    ("6 quart air fryer", "air_fryer", {"capacity_qt": 6}, {}),
    ("7 quart dutch oven", "dutch_oven", {"capacity_qt": 7}, {}),
    ("12 inch skillet", "frying_pan", {"diameter_in": 12}, {}),
    ("6mm yoga mat", "yoga_mat", {"thickness_mm": 6}, {}),
    ("queen sheets", "bed_sheets", {"size": "Queen"}, {}),
    ("pet hair vacuum", "vacuum", {"pet_hair": True}, {}),
    ("1000 piece puzzle", "puzzle", {"piece_count": 1000}, {}),
    ("sunscreen for sensitive skin", "sunscreen", {"skin_type": "sensitive"}, {}),
    # needs and synonyms (words the catalog may not use)
    ("headphones for travel", "headphones", {}, {}),
    ("laptop for college", "laptop", {}, {}),
    ("earphones for the gym", "earbuds", {}, {}),
    ("something to make lattes", "espresso_machine", {}, {}),
    ("shoes for marathon training", "running_shoes", {}, {}),
    ("gps watch for running", "smartwatch", {}, {}),
    ("tent for backpacking", "tent", {}, {}),
    ("speaker for the beach", "bluetooth_speaker", {}, {}),
    ("kindle", "e_reader", {}, {}),
    ("blow dryer", "hair_dryer", {}, {}),
    ("ice chest", "cooler", {}, {}),
    ("kettle for tea", "electric_kettle", {}, {}),
    ("better sound for my tv", "soundbar", {}, {}),
]


def _value_matches(have: Any, want: AttrValue) -> bool:
    """A stored attribute against a label's value, each compared as its type."""
    if isinstance(want, bool):
        return have is want
    if isinstance(want, int | float):
        return (isinstance(have, int | float) and not isinstance(have, bool)
                and math.isclose(float(have), float(want)))
    if isinstance(have, list):
        return str(want).lower() in {str(x).lower() for x in have}
    return isinstance(have, str) and have.lower() == str(want).lower()


def _matches(p: Product, category: str, cons: dict[str, AttrValue], filters: dict[str, Any]) -> bool:
    if p.category != category:
        return False
    for k, v in cons.items():
        if k == "brand":
            if p.brand.lower() != str(v).lower():
                return False
        elif not _value_matches(p.attributes.get(k), v):
            return False
    fb = filters.get("brand")
    if fb and p.brand.lower().replace(" ", "") != str(fb).lower().replace(" ", ""):
        return False
    return "max_price" not in filters or p.price <= float(filters["max_price"])


def build_relevance(products: Sequence[Product]) -> list[dict[str, Any]]:
    out = []
    for i, (q, cat, cons, filters) in enumerate(SPECS):
        rel = [p.id for p in products if _matches(p, cat, cons, filters)]
        if not rel:
            raise ValueError(f"relevance query {q!r} has no relevant product")
        out.append({"qid": f"q{i:03d}", "query": q, "filters": filters,
                    "label": {"category": cat, **cons}, "relevant": rel})
    return out


def load_relevance(path: str | Path = RELEVANCE_PATH) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]


def recall_at(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """Share of the k slots that could hold a relevant product and do (|rel| may exceed k)."""
    return len(set(ranked[:k]) & relevant) / min(k, len(relevant))


def ndcg_at(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, pid in enumerate(ranked[:k]) if pid in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal


def evaluate(search: Callable[[str, Filters], list[str]], items: Sequence[dict[str, Any]],
             k: int = 5) -> dict[str, float]:
    """Mean recall@k and nDCG@k over the set; ``search`` returns ranked product ids."""
    rs, ns = [], []
    for it in items:
        ids = search(it["query"], Filters.from_plan(it["filters"]))
        rel = set(it["relevant"])
        rs.append(recall_at(ids, rel, k))
        ns.append(ndcg_at(ids, rel, k))
    return {f"recall@{k}": sum(rs) / len(rs), f"ndcg@{k}": sum(ns) / len(ns), "queries": len(items)}
