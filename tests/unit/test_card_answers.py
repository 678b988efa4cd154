"""Issue 58: answers from the cards (rufus/assistant/card_answers.py), the question-word ->
attribute-key map (rufus/retrieval/attributes.py) and the held-out checks
(rufus/assistant/card_eval.py), each check shown to fail on hand-written bad answers. On the
default catalog (data/catalog/), in memory."""

from __future__ import annotations

import pytest

from rufus.assistant import card_answers as ca
from rufus.assistant import card_eval
from rufus.retrieval.attributes import asked_keys, better, label, value_text
from rufus.retrieval.catalog_data import default_catalog
from rufus.retrieval.constraints import Constraint


@pytest.fixture(scope="module")
def by_model():
    out: dict = {}
    for p in default_catalog():
        out.setdefault(p.model, p)
    return out


@pytest.mark.parametrize("q, model, key", [
    ("bose quietcomfort 45 battery life", "Bose QuietComfort 45", "battery_hours"),
    ("how long does the batery last on the sony wh-1000xm5", "Sony WH-1000XM5", "battery_hours"),
    ("does the sony wh-1000xm5 support multipoint?", "Sony WH-1000XM5", "multipoint"),
    ("can it connect to two devices", "Sony WH-1000XM5", "multipoint"),
    ("is the manduka prolite latex free?", "Manduka PROlite", "latex_free"),
    ("is the le creuset dutch oven dishwaser safe", "Le Creuset Signature Round Dutch Oven",
     "dishwasher_safe"),
    ("how many quarts is the le creuset", "Le Creuset Signature Round Dutch Oven", "capacity_qt"),
    ("does the sony wh-1000xm5 work with mac", "Sony WH-1000XM5", "works_with_mac"),
    ("how heavy are the sony wh-1000xm5", "Sony WH-1000XM5", "weight_g"),
    ("whats the warranty on the weber spirit", "Weber Spirit II E-310", "warranty_years"),
])
def test_question_words_map_to_the_cards_key(by_model, q, model, key):
    p = by_model[model]
    assert asked_keys(q, p.attributes, [model])[:1] == [key]


def test_a_products_own_name_asks_nothing(by_model):
    p = by_model["JBL Flip 6"]
    assert asked_keys("jbl flip 6", p.attributes, ["JBL Flip 6", "bluetooth speaker"]) == []


def test_values_read_with_units_and_words():
    assert value_text("battery_hours", 24) == "24 hours"
    assert value_text("warranty_years", 1) == "1 year"
    assert value_text("storage_gb", 1024) == "1 TB"
    assert value_text("multipoint", True) == "yes"
    assert label("battery_hours") == "battery life" and label("dishwasher_safe") == "dishwasher safe"
    assert better("weight_lb") == -1 and better("battery_hours") == 1
    assert better("battery_hours", "which is lighter") == -1


@pytest.mark.parametrize("q, shown, want", [
    ("compare the first two", 4, [0, 1]),
    ("does the second one come in blue?", 4, [1]),
    ("tell me more about the last one", 4, [3]),
    ("is the first waterproof?", 3, [0]),
    ("which of the first two is lighter", 5, [0, 1]),
    ("what about both of them", 3, [0, 1]),
    ("compare 1 and 3", 3, [0, 2]),
    ("the last two", 4, [2, 3]),
    ("shoes for my first apartment", 4, []),  # no reference
    ("is it fine for the first time", 4, []),
    ("the third one", 2, []),  # only two were shown
])
def test_positions_refer_to_the_previous_answers_list(q, shown, want):
    assert ca.positions(q, shown) == want


def test_previous_links_in_order_once():
    hist = [{"role": "user", "content": "earbuds"},
            {"role": "assistant", "content": "1. [A](https://x/a) — $1\n2. [B](https://x/b) — $2\n"
                                             "[A](https://x/a)"}]
    assert ca.previous_links(hist) == ["https://x/a", "https://x/b"]


def test_plan_kinds(by_model):
    xm5, qc45 = by_model["Sony WH-1000XM5"], by_model["Bose QuietComfort 45"]
    keys = {k for p in default_catalog() for k in p.attributes}
    a = ca.plan("does the sony wh-1000xm5 support multipoint?", [xm5], keys)
    assert a is not None and a.kind == "attribute" and a.keys[0] == "multipoint"
    assert ca.plan("headphones like the sony wh-1000xm5 but cheaper", [xm5], keys) is None
    c = ca.plan("sony wh-1000xm5 vs bose quietcomfort 45", [xm5, qc45], keys)
    assert c is not None and c.kind == "compare" and not c.which
    w = ca.plan("which lasts longer, the sony wh-1000xm5 or the bose qc45?", [xm5, qc45], keys)
    assert w is not None and w.which and w.keys[0] == "battery_hours"
    colour = ca.plan("does it come in blue?", [xm5], keys, by_reference=True)
    assert colour is not None and colour.kind == "colour" and colour.value == "blue"
    gone = ca.plan("what is the water rating of the sony wh-1000xm5", [xm5], keys)  # not on its card
    assert gone is not None and gone.kind == "attribute" and not gone.keys


def test_attribute_answer_states_the_cards_value_or_says_it_is_not_stated(by_model):
    xm5 = by_model["Sony WH-1000XM5"]
    lines = ca.render_attribute(ca.CardAnswer("attribute", [xm5], ["battery_hours"]))
    assert "battery life: **30 hours**" in lines[0] and xm5.url in lines[1]
    lines = ca.render_attribute(ca.CardAnswer("attribute", [xm5], [], asked="noise level"))
    assert "does not state its noise level" in lines[0]


def test_comparison_table_and_the_pick_its_words_decide(by_model):
    xm5, qc45 = by_model["Sony WH-1000XM5"], by_model["Bose QuietComfort 45"]
    card = ca.CardAnswer("compare", [xm5, qc45], ["battery_hours"], which=True)
    text = "".join(ca.render_table(card))
    assert xm5.url in text and qc45.url in text
    assert "| Battery life | 30 hours | 24 hours |" in text
    assert "| Price |" in text
    pick = ca.decide(card, "which lasts longer on a charge")
    assert pick is not None and xm5.url in pick and "24 hours" in pick
    lighter = ca.decide(ca.CardAnswer("compare", [xm5, qc45], ["weight_g"], which=True), "which is lighter")
    assert lighter is not None and qc45.url in lighter.split("—")[0]
    menus = ca.difference_menus([xm5, qc45], "which is better for flights")
    assert "more battery life" in menus[0] and "lowest price" in menus[1]


def test_colour_answer_links_the_listing_in_that_colour(by_model):
    listings = [p for p in default_catalog() if p.model == "Sony WH-1000XM5"]
    colours = {str(p.attributes["color"]) for p in listings}
    have = next(iter(colours)).split()[0].lower()
    yes = ca.render_colour(ca.CardAnswer("colour", listings[:1], value=have), listings)
    assert yes[0].startswith("Yes") and any(p.url in yes[1] for p in listings
                                            if have in str(p.attributes["color"]).lower())
    no = ca.render_colour(ca.CardAnswer("colour", listings[:1], value="orange"), listings)
    assert no[0].startswith("No") and all(c in no[0] for c in colours)


def test_pick_lines_say_what_of_the_question_the_card_meets(by_model):
    p = next(x for x in default_catalog() if x.attributes.get("capacity_qt") == 6)
    c = Constraint(kind="number", keys=("capacity_qt",), value=6.0, op="=", text="6 qt")
    assert ca.met_text([c], p) == "capacity 6 qt"
    shoe = next(x for x in default_catalog() if x.attributes.get("support") == "stability")
    flat = Constraint(kind="value", keys=("support",), value="stability", text="flat feet")
    assert ca.met_text([flat], shoe) == "stability support for flat feet"


# ------------------------------------------------------------------ the eval's checks

def _card(p) -> dict:
    return p.card()


def test_attribute_check_fails_wrong_value_stray_number_and_missing_card(by_model):
    qc45 = by_model["Bose QuietComfort 45"]
    item = {"kind": "attribute", "model": qc45.model, "key": "battery_hours"}
    good = "**Bose QuietComfort 45** — battery life: **24 hours** (from its product card).\n"
    assert card_eval.check_attribute(item, good, [_card(qc45)]) == []
    assert card_eval.check_attribute(item, "Battery life: 30 hours.", [_card(qc45)])
    assert card_eval.check_attribute(item, "1. [Bose QC45](u) — $329.00, 4.6 stars.", [_card(qc45)])
    assert card_eval.check_attribute(item, good, [])
    blank = {"kind": "attribute", "model": qc45.model, "key": None}
    assert card_eval.check_attribute(blank, "It weighs 40 g.", [_card(qc45)])
    assert card_eval.check_attribute(blank, "The product card for QC45 does not state its weight.",
                                     [_card(qc45)]) == []


def test_comparison_check_fails_a_missing_product_no_difference_and_a_wrong_pick(by_model):
    xm5, qc45 = by_model["Sony WH-1000XM5"], by_model["Bose QuietComfort 45"]
    item = {"kind": "comparison", "models": [xm5.model, qc45.model], "which": True,
            "key": "battery_hours", "better": "higher"}
    card = ca.CardAnswer("compare", [xm5, qc45], ["battery_hours"], which=True)
    good = "".join(ca.render_table(card)) + (ca.decide(card, "which lasts longer") or "")
    cards = [_card(xm5), _card(qc45)]
    assert card_eval.check_comparison(item, good, cards) == []
    assert card_eval.check_comparison(item, good, cards[:1])  # one not shown
    only_links = f"[{xm5.model}]({xm5.url}) or [{qc45.model}]({qc45.url})\nMy pick: [{xm5.model}]({xm5.url})"
    assert "no difference given with both values" in card_eval.check_comparison(item, only_links, cards)
    wrong = "".join(ca.render_table(card)) + f"\nThe pick: [{qc45.model}]({qc45.url})\n"
    assert any("the pick" in p for p in card_eval.check_comparison(item, wrong, cards))


def test_followup_check_fails_lost_products_and_lost_type(by_model):
    a, b = by_model["Sony WH-1000XM5"], by_model["Bose QuietComfort 45"]
    first = f"1. [{a.title}]({a.url}) — $1\n2. [{b.title}]({b.url}) — $2\n"
    item = {"kind": "followup", "ref": [2], "category": "headphones"}
    assert card_eval.check_followup(item, first, [_card(b)]) == []
    assert card_eval.check_followup(item, first, [_card(a)])
    narrow = {"kind": "followup", "ref": "narrow", "category": "headphones",
              "constraints": [{"max_price": 350}]}
    assert card_eval.check_followup(narrow, first, [_card(b)]) == []
    assert card_eval.check_followup(narrow, first, [_card(a)])  # over $350
    speaker = by_model["JBL Flip 6"]
    assert any("product type" in p for p in card_eval.check_followup(narrow, first, [_card(speaker)]))


def test_answer_check_reads_a_comparison_table_per_column(by_model):
    """A table's cells are checked against their column's card: a wrong price in the second
    column is a contradiction, the right table is none."""
    from rufus.assistant.answer_checks import CatalogFacts, check_answer

    xm5, qc45 = by_model["Sony WH-1000XM5"], by_model["Bose QuietComfort 45"]
    facts = CatalogFacts.from_products(default_catalog())
    table = "".join(ca.render_table(ca.CardAnswer("compare", [xm5, qc45], ["battery_hours"])))
    cards = [xm5.card(), qc45.card()]
    ok = check_answer(table, cards, facts)
    assert not ok.contradictions and not ok.invented and not ok.loop
    bad = table.replace(f"${qc45.price:.2f}", "$99.00")
    assert check_answer(bad, cards, facts).contradictions
