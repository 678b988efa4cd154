"""Issue 58, held-out set D: the general rules behind answers from the cards, each on
wordings unlike the held-out questions: how shoppers shorten model names
(rufus/retrieval/model_names.py), question words and units mapped to attribute keys
(rufus/retrieval/attributes.py), comparisons decided by the named spec
(rufus/assistant/card_answers.py), and colour follow-ups (rufus/retrieval/constraints.py).
On the default catalog (data/catalog/), in memory."""

from __future__ import annotations

import pytest

from rufus.assistant import card_answers as ca
from rufus.retrieval.attributes import asked_keys, value_keys
from rufus.retrieval.catalog_data import default_catalog, default_categories
from rufus.retrieval.constraints import Constraint, relax
from rufus.retrieval.model_names import ModelName, name_aliases
from rufus.retrieval.search import GroundedSearch
from rufus.retrieval.sqlite_fts import SqliteFtsRetriever


@pytest.fixture(scope="module")
def search() -> GroundedSearch:
    return GroundedSearch(SqliteFtsRetriever.build(list(default_catalog()), categories=default_categories()))


@pytest.fixture(scope="module")
def by_model():
    out: dict = {}
    for p in default_catalog():
        out.setdefault(p.model, p)
    return out


# ------------------------------------------------------------------ model names
def test_aliases_drop_the_generation_glue_letters_and_use_initials():
    words = ("echo", "dot", "5", "th", "gen")
    echo = ModelName("Amazon Echo Dot (5th Gen)", "Amazon", "smart_speaker", words, ("amazon",))
    assert [a.words for a in name_aliases(echo)] == [("echo", "dot")]
    ps = ModelName("Sony PlayStation 5 Pro", "Sony", "gaming_console", ("playstation", "5", "pro"), ("sony",))
    assert ("ps", "5", "pro") in [a.words for a in name_aliases(ps)]
    kindle = ModelName("Amazon Kindle (2024)", "Amazon", "e_reader", ("kindle", "2024"), ("amazon",))
    assert name_aliases(kindle) == []  # a one-word "kindle" is the line, not this model


@pytest.mark.parametrize("q, model", [
    ("gshock dw5600e strap size", "Casio G-Shock DW5600E"),  # hyphen between letters dropped
    ("is the ps5 slim worth it over the xbox series s", "Sony PlayStation 5 Slim"),  # initials
    ("nest learning thermostat vs ecobee", "Google Nest Learning Thermostat (4th Gen)"),  # gen dropped
    ("gel nimbus 26 or cloudmonster", "ASICS Gel-Nimbus 26"),
    ("nimbus 26 cushioning", "ASICS Gel-Nimbus 26"),  # the first word left out
    ("at-lp60x or a sony turntable", "Audio-Technica AT-LP60X"),
    ("does the lx310bt have bluetooth", "Sony PS-LX310BT"),  # the model number alone
    ("is the lego zetros trial truck motorized", "LEGO Technic Mercedes-Benz Zetros Trial Truck"),
    ("boll and branch signature sheets or brooklinen", "Boll & Branch Signature Hemmed"),  # "&" said "and"
])
def test_shortened_model_names_are_recognised(search, q, model):
    assert model in search.taxonomy.resolve(q).models


@pytest.mark.parametrize("q", [
    "orthopedic dog bed for a senior lab",  # the type's noun, no model's name
    "womens rain jacket under $150",  # a word of one jeans' name is no model
    "best watch for training for an ironman",  # what it is for, not the Timex Ironman
    "kindle with a warm light",  # a line, not Kindle (2024)
])
def test_type_words_and_lines_name_no_model(search, q):
    assert search.taxonomy.resolve(q).models == []


def test_a_line_before_another_types_noun_is_what_it_is_for(search):
    res = search.taxonomy.resolve("ps5 headset")
    assert not any("PlayStation" in m for m in res.models)


# ------------------------------------------------------------------ question words -> keys
@pytest.mark.parametrize("q, model, key", [
    ("how long does one round of pandemic take", "Z-Man Games Pandemic", "play_time_minutes"),
    ("how many lumens does the hisense px2-pro put out", "Hisense PX2-PRO", "brightness_lumens"),
    ("is the px2 pro bright enough for daytime", "Hisense PX2-PRO", "brightness_lumens"),
    ("how far underwater can i snorkel with the gopro hero (2024)", "GoPro HERO (2024)",
     "waterproof_depth_ft"),
    ("can a family of 6 play pandemic", "Z-Man Games Pandemic", "players_max_count"),
    ("is pandemic any fun with 3 adults", "Z-Man Games Pandemic", "players_max_count"),
    ("how many modes does the oral-b pro 1000 have", "Oral-B Pro 1000", "brushing_modes_count"),
    ("does the anker nano power bank charge on a qi pad wirelessly",
     "Anker Nano Power Bank (30W, Built-In USB-C Cable)", "wireless_charging"),
])
def test_units_durations_and_head_counts_map_to_keys(by_model, q, model, key):
    p = by_model[model]
    assert asked_keys(q, p.attributes, [model, p.category.replace("_", " ")])[:1] == [key]


def test_a_duration_of_something_else_is_not_the_run_time(by_model):
    p = by_model["Dyson V8"]
    assert "runtime_minutes" not in asked_keys("how long does the v8 take to fully charge", p.attributes,
                                                ["Dyson V8"])
    assert asked_keys("how long will the v8 run", p.attributes, ["Dyson V8"])[:1] == ["runtime_minutes"]


def test_a_value_the_card_lists_names_its_key(by_model):
    p = by_model["Audio-Technica AT-LP60X"]
    assert value_keys("will it spin 45s", p.attributes, [p.model]) == ["speeds_rpm"]
    assert value_keys("is the at-lp60x any good", p.attributes, [p.model]) == []  # its own number


# ------------------------------------------------------------------ comparisons
def test_a_spec_named_beside_vs_is_decided(by_model):
    a, b = by_model["Dyson V8"], by_model["Dyson V15 Detect"]
    card = ca.plan("dyson v8 versus v15 detect run time", [a, b], [])
    assert card is not None and card.which and card.keys[:1] == ["runtime_minutes"]
    assert b.url in (ca.decide(card, "dyson v8 versus v15 detect run time") or "")


@pytest.mark.parametrize("q, ps, pick", [
    ("we are a family of 5: pandemic or ticket to ride?",
     ["Z-Man Games Pandemic", "Days of Wonder Ticket to Ride"], "Days of Wonder Ticket to Ride"),
    ("which one stays running longer, the v8 or the v15 detect", ["Dyson V8", "Dyson V15 Detect"],
     "Dyson V15 Detect"),
    ("hisense px2-pro or epson 2350, which throws out more light in lumens",
     ["Hisense PX2-PRO", "Epson Home Cinema 2350"], "Epson Home Cinema 2350"),
])
def test_comparatives_pick_the_better_spec(by_model, q, ps, pick):
    card = ca.plan(q, [by_model[m] for m in ps], [])
    assert card is not None and card.which
    picked = ca.decide(card, q)
    assert picked is not None and by_model[pick].url in picked


# ------------------------------------------------------------------ colour follow-ups
def test_a_catalog_colour_word_narrows_and_this_turn_wins(search):
    out = search.search(["any of those in matte tortoise"], {}, "any of those in matte tortoise", 8,
                        ["polarized sunglasses"])
    assert out.products and all("tortoise" in str(p.attributes.get("color", "")).lower().split()
                                for p in out.products)


def test_relax_drops_an_earlier_turns_constraint_first():
    listings = list(default_catalog())
    polarized = next(p for p in listings if p.attributes.get("polarized") is True
                     and "tortoise" not in str(p.attributes.get("color", "")).lower())
    tortoise = next(p for p in listings if p.attributes.get("polarized") is False
                    and str(p.attributes.get("color", "")).lower() == "tortoise")
    earlier = Constraint("feature", ("polarized",), "true", "=", "polarized")
    now = Constraint("colour", ("color",), "tortoise", "=", "tortoise")
    assert relax([polarized, tortoise], [earlier, now], [now]) == ([tortoise], [earlier])
    assert relax([polarized, tortoise], [earlier, now]) == ([polarized], [now])  # one turn: colour first


def test_two_products_asked_one_recognised_gets_the_usual_picks(by_model):
    deck = by_model["Valve Steam Deck OLED"]
    assert ca.plan("rog ally versus the steam deck oled battery", [deck], []) is None
    card = ca.plan("steam deck oled battery life", [deck], [])
    assert card is not None and card.kind == "attribute" and card.keys[:1] == ["battery_hours"]
