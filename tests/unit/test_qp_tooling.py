"""Offline planner tooling and data: the question generator (reproducible, covers the job,
labels follow the grounding rule), the hand-written eval set, the post-decode filter check,
per-field scoring, the tree search and the baseline prompts. No model needed."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lab.qp.evaluate import Prediction, grounded, score
from lab.qp.lora import lr_lambda
from lab.qp.medusa_train import head_targets
from lab.qp.prompts import FEW_SHOT, baseline_messages
from lab.qp.questions import build, named_brand, render_sets
from rufus.launch.server import ROOT
from rufus.qp.filter_grounding import (
    brand_grounded,
    context_text,
    ground_plan,
    price_grounded,
    price_mentions,
)
from rufus.qp.plan import build_messages, intents, load_eval, validate_plan
from rufus.qp.tree import chain_speeds, grow_tree, interpolate_cost

DATA = ROOT / "data" / "qp"


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return load_eval(DATA / "train.jsonl")


@pytest.fixture(scope="module")
def evalset() -> list[dict]:
    return load_eval(DATA / "eval.jsonl")


def _key(r: dict) -> str:
    return r["question"].lower().strip(" ?!.") + "|" + json.dumps(r.get("history"))


def test_generator_is_seeded_and_committed_sets_match_it() -> None:
    assert build(50, seed=7) == build(50, seed=7)
    assert build(50, seed=7) != build(50, seed=8)
    for name, text in render_sets().items():
        assert (DATA / f"{name}.jsonl").read_text(encoding="utf-8") == text, (
            f"data/qp/{name}.jsonl differs from scripts/make_qp_questions.py's output")


def test_training_set_covers_the_job(train: list[dict]) -> None:
    assert len(train) >= 3000
    assert {r["intent"] for r in train} == set(intents())
    for r in train:
        assert validate_plan(r["plan"]) == "", r
    qs = [r["question"] for r in train]
    low = " ".join(qs).lower()
    for phrase in ("$", "bucks", "dollars", "£", "under", "less than", " vs ", "gift",
                   "20v max", "sleeps", "inch", "size ", "order", "return", "refund"):
        assert phrase in low, phrase
    kinds = Counter(r["kind"] for r in train)
    assert kinds["multiturn"] >= 0.1 * len(train)
    assert sum(r["question"] != r["question"].lower() for r in train) > 0.2 * len(train)
    qtypes = Counter(r["plan"]["query_type"] for r in train)
    assert min(qtypes.values()) > 0.2 * len(train)
    assert sum(len(r["plan"]["search_queries"]) == 3 for r in train) > 50  # 3-way comparisons
    prices = Counter(r["plan"]["filters"].get("max_price") is not None for r in train)
    brands = Counter(r["plan"]["filters"].get("brand") is not None for r in train)
    assert prices[True] > 0.15 * len(train) and brands[True] > 0.15 * len(train)


def test_training_labels_follow_the_grounding_rule(train: list[dict]) -> None:
    """Every brand/max_price label is written in the question or history. 9 of 4,000
    generated rows break it (two keyword recommendation forms, "essentials for ..." and
    "checklist for ...", drop the price cap from the question but keep its label): known
    label noise of the committed set, kept so the set stays the one the committed adapter
    was trained on. (The follow-ups' typo'd brands of the previous set are fixed.)"""
    bad = 0
    for r in train:
        f, text = r["plan"]["filters"], context_text(r["question"], r.get("history"))
        bad += "brand" in f and not brand_grounded(f["brand"], text)
        bad += "max_price" in f and not price_grounded(f["max_price"], text)
    assert bad <= 9


def test_eval_set_is_large_hand_labelled_and_held_out(evalset: list[dict], train: list[dict]
                                                       ) -> None:
    assert len(evalset) >= 200
    assert {r["intent"] for r in evalset} == set(intents())
    assert sum(bool(r.get("history")) for r in evalset) >= 20
    for r in evalset:
        assert set(r) >= {"question", "intent", "query_type", "brand", "max_price",
                          "query_words"}, r
        assert r["query_type"] in ("keyword", "conversational")
        text = context_text(r["question"], r.get("history"))
        assert r["brand"] is None or brand_grounded(r["brand"], text), r
        assert r["max_price"] is None or price_grounded(r["max_price"], text), r
    calib = load_eval(DATA / "calib.jsonl")
    seen = {_key(r) for r in train + calib}
    assert not seen & {_key(r) for r in evalset}, "eval must be held out"
    # distractors that are numbers but not prices
    low = " ".join(r["question"] for r in evalset).lower()
    for d in ("65 inch", "20v max", "sleeps 4", "size 10"):
        assert d in low


@pytest.mark.parametrize("text,prices", [
    ("wireless earbuds under $50", [50]),
    ("samsung 65 inch tv", []),
    ("dewalt 20v max impact driver", []),
    ("tent sleeps 4 under 150 bucks", [150]),
    ("nike size 10 under 100 dollars", [100]),
    ("less than £30", [30]),
    ("electric bike under 1,000", [1000]),
    ("budget 1.5k", [1500]),
    ("300 max", [300]),
    ("levis 34x32", []),
    ("a 10 year old, under €25", [25]),
    ("order 113 status", []),
])
def test_price_mentions(text: str, prices: list[float]) -> None:
    got = price_mentions(text)
    assert [p for p in prices if p not in got] == []
    if not prices:
        assert got == []


def test_ground_plan_drops_only_what_is_not_written() -> None:
    plan = {"intent": "product_search", "query_type": "keyword",
            "search_queries": ["iphone 15 case"], "filters": {"brand": "apple", "max_price": 15}}
    out, dropped = ground_plan(plan, "iphone 15 case")
    assert out["filters"] == {} and len(dropped) == 2
    assert plan["filters"] == {"brand": "apple", "max_price": 15}  # input untouched
    out, dropped = ground_plan(plan, "Apple iphone 15 case under $15")
    assert out is plan and dropped == []
    hist = [{"role": "user", "content": "show me apple cases"},
            {"role": "assistant", "content": "Here are some."}]
    out, _ = ground_plan(plan, "any under 15 dollars?", hist)
    assert out["filters"] == {"brand": "apple", "max_price": 15}
    assert brand_grounded("levi's", "LEVIS jeans") and brand_grounded("oral-b", "Oral B brush")
    assert not brand_grounded("sony", "sonya's headphones")


def test_score_fields() -> None:
    rows = [
        {"question": "sony tv under $500", "intent": "product_search", "query_type": "keyword",
         "brand": "sony", "max_price": 500, "query_words": ["tv"]},
        {"question": "iphone 15 case", "intent": "product_search", "query_type": "keyword",
         "brand": None, "max_price": None, "query_words": ["case"]},
        {"question": "is it waterproof", "intent": "product_question",
         "query_type": "conversational", "brand": None, "max_price": None,
         "query_words": ["speaker"],
         "history": [{"role": "user", "content": "jbl speaker"}]},
    ]

    def p(intent, qt, qs, **f):  # type: ignore[no-untyped-def]
        return Prediction("", {"intent": intent, "query_type": qt, "search_queries": qs,
                               "filters": f}, False)

    preds = [p("product_search", "keyword", ["sony tv"], brand="Sony", max_price=500),
             p("product_search", "conversational", ["iphone case"], brand="apple"),
             p("product_search", "conversational", ["jbl speaker"])]
    s = score(rows, preds)
    assert s["intent"] == round(2 / 3, 4) and s["query_type"] == round(2 / 3, 4)
    assert s["brand"]["tp"] == 1 and s["brand"]["fp"] == 1 and s["brand"]["fn"] == 0
    assert s["max_price"]["f1"] == 1.0
    assert s["query_words"] == 1.0 and s["multi_turn_intent"] == 0.0
    assert s["ungrounded_filters"] == 1
    g = score(rows, grounded(rows, preds))
    assert g["brand"]["f1"] == 1.0 and g["ungrounded_filters"] == 0


def test_tree_search() -> None:
    acc = [[0.9, 0.05], [0.8, 0.05], [0.7, 0.05]]
    flat = interpolate_cost({1: 1.0, 64: 1.0})
    tree, expected, speed = grow_tree(acc, flat, 8)
    assert len(tree) == 8 and (0,) in tree and (0, 0, 0) in tree
    for path in tree:  # prefix-closed
        assert len(path) == 1 or path[:-1] in tree
    assert speed == pytest.approx(expected)
    steep = interpolate_cost({1: 1.0, 2: 1.05, 4: 1.1, 8: 3.0})
    tree, _, _ = grow_tree(acc, steep, 8)
    assert tree == [(0,), (0, 0), (0, 0, 0)]  # the chain; rank-1 nodes do not pay
    cost = interpolate_cost({1: 10.0, 4: 16.0})
    assert cost(2) == pytest.approx(12.0) and cost(8) == pytest.approx(32.0)
    expected_chain, speeds = chain_speeds(acc, flat)
    assert expected_chain[1] == pytest.approx(1.9)
    assert expected_chain[3] == pytest.approx(1 + 0.9 + 0.72 + 0.504)
    assert max(speeds, key=lambda k: speeds[k]) == 3


def test_prompts_and_small_helpers() -> None:
    served = build_messages("red shoes")
    assert baseline_messages("red shoes") == served
    few = baseline_messages("red shoes", None, "fewshot")
    assert len(few) == 2 + 2 * len(FEW_SHOT) and few[-1] == served[-1]
    assert few[0]["content"] != served[0]["content"]
    with pytest.raises(ValueError):
        baseline_messages("x", None, "chatty")
    f = lr_lambda(100, warmup=10)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(0.91) and f(99) == 0.05
    hs, tg = head_targets(list(range(6)), [1, 2, 3, 4, 5, 6], 3, 2)
    assert tg == [[5, 6], [6, -100], [-100, -100]] and hs == [2, 3, 4]
    assert named_brand("xbox series x") == "xbox" and named_brand("ps5") is None
    assert named_brand("instant pot duo") == "instant pot"
