"""Labelled relevance set for the generated catalog, and recall@k / nDCG@k.

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
from rufus.retrieval.catalog import Product

ROOT = Path(__file__).resolve().parents[2]
RELEVANCE_PATH = ROOT / "data" / "retrieval" / "relevance.jsonl"

# (query, category, constraints, filters). constraints: brand and attribute values.
Spec = tuple[str, str, dict[str, str], dict[str, Any]]
SPECS: list[Spec] = [
    # category words as customers type them
    ("running shoes", "running_shoes", {}, {}),
    ("trail running shoes", "running_shoes", {}, {}),
    ("sneakers", "sneakers", {}, {}),
    ("casual walking shoes", "sneakers", {}, {}),
    ("noise cancelling headphones", "headphones", {}, {}),
    ("over ear headphones", "headphones", {}, {}),
    ("wireless earbuds", "earbuds", {}, {}),
    ("bluetooth earbuds", "earbuds", {}, {}),
    ("smart tv", "tv", {}, {}),
    ("oled tv", "tv", {}, {}),
    ("laptop", "laptop", {}, {}),
    ("gaming laptop", "laptop", {}, {}),
    ("unlocked smartphone", "smartphone", {}, {}),
    ("5g phone", "smartphone", {}, {}),
    ("smartwatch", "smartwatch", {}, {}),
    ("fitness tracker", "smartwatch", {}, {}),
    ("android tablet", "tablet", {}, {}),
    ("mirrorless camera", "camera", {}, {}),
    ("action camera", "camera", {}, {}),
    ("coffee maker", "coffee_maker", {}, {}),
    ("espresso machine", "coffee_maker", {}, {}),
    ("blender for smoothies", "blender", {}, {}),
    ("robot vacuum", "vacuum", {}, {}),
    ("cordless stick vacuum", "vacuum", {}, {}),
    ("air fryer", "air_fryer", {}, {}),
    ("laptop backpack", "backpack", {}, {}),
    ("hiking backpack", "backpack", {}, {}),
    ("yoga mat", "yoga_mat", {}, {}),
    ("adjustable dumbbells", "dumbbells", {}, {}),
    ("kettlebell", "dumbbells", {}, {}),
    ("insulated water bottle", "water_bottle", {}, {}),
    ("rain jacket", "jacket", {}, {}),
    ("winter coat", "jacket", {}, {}),
    ("t-shirt", "tshirt", {}, {}),
    ("slim fit jeans", "jeans", {}, {}),
    ("polarized sunglasses", "sunglasses", {"lens": "Polarized"}, {}),
    ("portable bluetooth speaker", "bluetooth_speaker", {}, {}),
    ("gaming monitor", "monitor", {}, {}),
    ("mechanical keyboard", "keyboard", {}, {}),
    ("wireless mouse", "mouse", {}, {}),
    ("cast iron skillet", "cookware", {}, {}),
    ("nonstick frying pan", "cookware", {}, {}),
    ("chef knife", "kitchen_knife", {}, {}),
    ("camping tent", "tent", {}, {}),
    ("board game", "toy", {}, {}),
    ("lego set", "toy", {"brand": "LEGO"}, {}),
    ("sunscreen", "skincare", {}, {}),
    ("face moisturizer", "skincare", {}, {}),
    ("wireless printer", "printer", {"connection": "Wireless"}, {}),
    ("video game console", "gaming_console", {}, {}),
    # brand + category in the text
    ("nike running shoes", "running_shoes", {"brand": "Nike"}, {}),
    ("brooks running shoes", "running_shoes", {"brand": "Brooks"}, {}),
    ("hoka shoes", "running_shoes", {"brand": "Hoka"}, {}),
    ("adidas sneakers", "sneakers", {"brand": "Adidas"}, {}),
    ("sony headphones", "headphones", {"brand": "Sony"}, {}),
    ("bose headphones", "headphones", {"brand": "Bose"}, {}),
    ("samsung earbuds", "earbuds", {"brand": "Samsung"}, {}),
    ("jbl earbuds", "earbuds", {"brand": "JBL"}, {}),
    ("samsung tv", "tv", {"brand": "Samsung"}, {}),
    ("lg oled tv", "tv", {"brand": "LG"}, {}),
    ("dell laptop", "laptop", {"brand": "Dell"}, {}),
    ("lenovo thinkpad", "laptop", {"brand": "Lenovo"}, {}),
    ("google pixel phone", "smartphone", {"brand": "Google"}, {}),
    ("garmin watch", "smartwatch", {"brand": "Garmin"}, {}),
    ("fitbit tracker", "smartwatch", {"brand": "Fitbit"}, {}),
    ("canon camera", "camera", {"brand": "Canon"}, {}),
    ("keurig coffee maker", "coffee_maker", {"brand": "Keurig"}, {}),
    ("vitamix blender", "blender", {"brand": "Vitamix"}, {}),
    ("dyson vacuum", "vacuum", {"brand": "Dyson"}, {}),
    ("ninja air fryer", "air_fryer", {"brand": "Ninja"}, {}),
    ("osprey backpack", "backpack", {"brand": "Osprey"}, {}),
    ("stanley tumbler", "water_bottle", {"brand": "Stanley"}, {}),
    ("patagonia jacket", "jacket", {"brand": "Patagonia"}, {}),
    ("levis jeans", "jeans", {"brand": "Levi's"}, {}),
    ("ray-ban sunglasses", "sunglasses", {"brand": "Ray-Ban"}, {}),
    ("jbl speaker", "bluetooth_speaker", {"brand": "JBL"}, {}),
    ("logitech mouse", "mouse", {"brand": "Logitech"}, {}),
    ("lodge cast iron", "cookware", {"brand": "Lodge"}, {}),
    ("coleman tent", "tent", {"brand": "Coleman"}, {}),
    ("cerave moisturizer", "skincare", {"brand": "CeraVe"}, {}),
    # brand as the planner's filter
    ("running shoes", "running_shoes", {"brand": "Asics"}, {"brand": "asics"}),
    ("headphones", "headphones", {"brand": "Sennheiser"}, {"brand": "sennheiser"}),
    ("earbuds", "earbuds", {"brand": "Apple"}, {"brand": "apple"}),
    ("tv", "tv", {"brand": "TCL"}, {"brand": "tcl"}),
    ("laptop", "laptop", {"brand": "HP"}, {"brand": "hp"}),
    ("vacuum", "vacuum", {"brand": "Shark"}, {"brand": "shark"}),
    ("backpack", "backpack", {"brand": "The North Face"}, {"brand": "the north face"}),
    # price caps as filters
    ("running shoes", "running_shoes", {}, {"max_price": 80}),
    ("wireless earbuds", "earbuds", {}, {"max_price": 50}),
    ("headphones", "headphones", {}, {"max_price": 100}),
    ("laptop", "laptop", {}, {"max_price": 600}),
    ("tv", "tv", {}, {"max_price": 400}),
    ("coffee maker", "coffee_maker", {}, {"max_price": 100}),
    ("smartwatch", "smartwatch", {}, {"max_price": 200}),
    ("air fryer", "air_fryer", {}, {"max_price": 80}),
    ("yoga mat", "yoga_mat", {}, {"max_price": 30}),
    ("nike running shoes", "running_shoes", {"brand": "Nike"}, {"max_price": 120}),
    ("sony headphones", "headphones", {"brand": "Sony"}, {"brand": "sony", "max_price": 200}),
    # attributes in the text
    ("65 inch tv", "tv", {"screen_size": "65"}, {}),
    ("55 inch tv", "tv", {"screen_size": "55"}, {}),
    ("32 inch monitor", "monitor", {"screen_size": "32"}, {}),
    ("144hz gaming monitor", "monitor", {"refresh_rate": "144Hz"}, {}),
    ("16gb ram laptop", "laptop", {"ram": "16GB RAM"}, {}),
    ("women's running shoes", "running_shoes", {"gender": "Women's"}, {}),
    ("men's rain jacket", "jacket", {"gender": "Men's"}, {}),
    ("4 person tent", "tent", {"capacity": "4 person"}, {}),
    ("40 oz water bottle", "water_bottle", {"capacity": "40 oz"}, {}),
    ("8 qt air fryer", "air_fryer", {"capacity": "8 qt"}, {}),
    ("6mm yoga mat", "yoga_mat", {"thickness": "6mm"}, {}),
    ("256gb iphone", "smartphone", {"brand": "Apple", "storage": "256GB"}, {}),
    ("pet hair vacuum", "vacuum", {"pet": "Pet"}, {}),
    ("1000 piece puzzle", "toy", {"pieces": "1000 pieces"}, {}),
    ("sunscreen for sensitive skin", "skincare", {"skin_type": "sensitive skin"}, {}),
    # needs and synonyms (words the catalog may not use)
    ("headphones for travel", "headphones", {}, {}),
    ("laptop for college", "laptop", {}, {}),
    ("earphones for the gym", "earbuds", {}, {}),
    ("something to make lattes", "coffee_maker", {}, {}),
    ("shoes for marathon training", "running_shoes", {}, {}),
    ("gps watch for running", "smartwatch", {}, {}),
    ("tent for backpacking", "tent", {}, {}),
    ("speaker for the beach", "bluetooth_speaker", {}, {}),
    ("gift for kids", "toy", {}, {}),
    ("e-reader", "tablet", {}, {}),
]


def _matches(p: Product, category: str, cons: dict[str, str], filters: dict[str, Any]) -> bool:
    if p.category != category:
        return False
    for k, v in cons.items():
        have = p.brand if k == "brand" else p.attributes.get(k)
        if (have or "").lower() != v.lower():
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
