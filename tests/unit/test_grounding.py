"""Search-plan grounding (rufus/retrieval/search.py) against the real SQLite index of the
default catalog (data/catalog/*.jsonl): stated price caps, brands that are no brand, typos,
filter relaxation and the system-written no-results reply. The failing plans are the ones
customers reported."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rufus.retrieval.base import Filters
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import default_catalog
from rufus.retrieval.price import Price, parse_price_cap
from rufus.retrieval.search import GroundedSearch, SearchOutcome
from rufus.retrieval.spelling import category_display, edit_distance, stem1
from rufus.retrieval.sqlite_fts import SqliteFtsRetriever
from rufus.retrieval.vocabulary import Vocabulary


@pytest.fixture(scope="module")
def catalog() -> list[Product]:
    return list(default_catalog())


@pytest.fixture(scope="module")
def grounded(catalog, tmp_path_factory) -> GroundedSearch:
    engine = SqliteFtsRetriever.build(catalog, tmp_path_factory.mktemp("idx") / "c.sqlite")
    return GroundedSearch(engine)  # vocabulary built lazily from the index itself


@pytest.fixture(scope="module")
def vocab(grounded) -> Vocabulary:
    return grounded.vocabulary


# --------------------------------------------------------------------- stated price caps

@pytest.mark.parametrize("text,amount,currency,usd", [
    ("running shoes under $80", 80, "USD", 80),
    ("below 50 dollars", 50, "USD", 50),
    ("under 1k", 1000, "USD", 1000),
    ("robot vaccum under 1k", 1000, "USD", 1000),
    ("$1,200 max", 1200, "USD", 1200),
    ("less than 1.5k", 1500, "USD", 1500),
    ("budget of 300", 300, "USD", 300),
    ("my budget is $250", 250, "USD", 250),
    ("300 or less", 300, "USD", 300),
    ("65 inch tv under $1,500", 1500, "USD", 1500),
    ("iphone 15 under 800", 800, "USD", 800),
    ("under 30 euros", 30, "EUR", 32.4),
    ("under €30", 30, "EUR", 32.4),
    ("under £40", 40, "GBP", 50.8),
    ("under 1,5k", 1500, "USD", 1500),
])
def test_price_caps(text, amount, currency, usd):
    assert parse_price_cap(text) == Price(amount=amount, currency=currency, usd=usd)


@pytest.mark.parametrize("text", [
    "65 inch tv", "gts 23", "iphone 15", "size 10", "running shoes size 10", "tv under 65 inch",
    "dumbbells under 50 pounds", "more than $100", "around $300", "a $80 gift", "",
])
def test_not_price_caps(text):
    assert parse_price_cap(text) is None


# --------------------------------------------------------------------- vocabulary

def test_spelling_helpers():
    assert edit_distance("vaccum", "vacuum") == 1
    assert edit_distance("adidsa", "adidas") == 1  # a transposition costs 1
    assert edit_distance("wireles", "wireless") == 1
    assert [stem1(w) for w in ("shoes", "hiking", "hike", "wireless", "wireles", "batteries")] == [
        "shoe", "hike", "hike", "wireless", "wirele", "batteri"]
    assert [category_display(k) for k in ("running_shoes", "laptop", "tv", "mouse")] == [
        "running shoes", "laptops", "TVs", "computer mice"]


@pytest.mark.parametrize("typo,word", [
    ("wireles", "wireless"), ("vaccum", "vacuum"), ("beginer", "beginner"), ("bluetooh", "bluetooth"),
    ("adidsa", "adidas"), ("pegasis", "pegasus"), ("Sneker", "sneaker"), ("headphnoes", "headphones"),
])
def test_typos_corrected_from_catalog_words(vocab, typo, word):
    assert vocab.correct(typo) == word


@pytest.mark.parametrize("word", [
    "wireless", "vacuum", "laptop", "shoe", "shoes", "hiking", "hike", "beginners",  # known
    "tvv", "mse", "gts",  # under 4 letters
    "1080v14", "12345", "52.5",  # numbers
    "under", "recommend", "cheapest",  # stopwords
    "qqqqzz", "adreness",  # nothing close
])
def test_known_short_and_unrelated_words_unchanged(vocab, word):
    assert vocab.correct(word) is None


def test_correction_must_fit_the_other_query_words(vocab):
    # "warm" is one letter from "wars" (LEGO Star Wars): not next to "jacket"
    assert vocab.correct("warm", ["warm", "jacket"]) is None
    assert vocab.correct("vaccum", ["robot", "vaccum"]) == "vacuum"


def test_brands(vocab):
    assert vocab.brands["brooks"] == "Brooks" and vocab.brands["levis"] == "Levi's"
    assert vocab.brand("brooks") == "Brooks"
    assert vocab.brand("LEVIS") == "Levi's"
    # the new catalog has no "The Ordinary": its one "The" brand, written without the "the"
    assert vocab.brand("north face") == "The North Face" and vocab.brand("northface") == "The North Face"
    assert vocab.brand("The Nike") == "Nike"
    assert vocab.brand("nkie") == "Nike" and vocab.brand("addidas") == "Adidas"
    assert vocab.brand("lg") == "LG"
    for not_brand in ("wireles", "adrenaline", "running shoes", "lgg", "xx", ""):
        assert vocab.brand(not_brand) is None


def test_categories_near(vocab):
    assert vocab.categories_near(["robot vacuum"])[0] == "robot vacuums"  # a category of its own now
    assert vocab.categories_near(["trail running shoes"], 2)[0] == "running shoes"
    # no category has a term: none now, not the three largest whatever was asked
    assert vocab.categories_near(["zzzz qqqq"]) == []


# --------------------------------------------------------------------- grounded search

def test_brand_that_is_no_brand_becomes_query_words(grounded):
    out = grounded.search(["mouse for laptop"], {"brand": "wireles"}, "wireles mouse for laptop", 5)
    # the search is now limited to the product types the question names (Filters.categories)
    assert out.filters == Filters(categories=("mouse",)) and out.relaxed == []
    assert out.queries == ["mouse for laptop wireless"]
    assert out.corrected == {"wireles": "wireless"}
    assert out.notes == ['Showing results for "wireless" (you wrote "wireles").']
    assert out.products and all(p.category == "mouse" for p in out.products)


def test_stated_cap_replaces_misread_plan_cap_and_typo_fixed(grounded):
    out = grounded.search(["robot vaccum"], {"max_price": 1.0}, "robot vaccum under 1k", 5)
    # searched within the type the question names; robot vacuums are a category of their own now
    assert out.filters == Filters(max_price=1000.0, categories=("robot_vacuum",)) and out.relaxed == []
    assert out.queries == ["robot vacuum"] and out.corrected == {"vaccum": "vacuum"}
    assert out.products
    assert all(p.category == "robot_vacuum" and "robot" in p.title.lower() and p.price <= 1000
               for p in out.products)


def test_product_line_as_brand(grounded):
    # the catalog's line is "Adrenaline GTS 24"; the customer asked about the 23
    out = grounded.search(["adreness gts 23"], {"brand": "adrenaline"},
                          "are the brooks adrenaline gts 23 good for flat feet?", 5)
    # the search is now limited to the product types the question names (Filters.categories)
    assert out.filters == Filters(categories=("running_shoes",)) and out.relaxed == []
    assert out.queries == ["adreness gts 23 adrenaline"]
    assert out.products
    assert all(p.brand == "Brooks" and "Adrenaline GTS 24" in p.title for p in out.products)


def test_plan_cap_kept_without_stated_cap_and_non_usd_note(grounded):
    # the search is now limited to the product types the question names (Filters.categories)
    out = grounded.search(["running shoes"], {"max_price": 80}, "good running shoes?", 5)
    assert out.filters == Filters(max_price=80.0, categories=("running_shoes",)) and out.notes == []
    assert out.products and all(p.price <= 80 for p in out.products)
    # (the new catalog's cameras say "beginners", not "beginner": a digital piano instead)
    out = grounded.search(["beginer digital piano"], {}, "a beginer digital piano under 300 euros", 5)
    assert out.filters == Filters(max_price=324.0, categories=("digital_piano",))
    assert out.queries == ["beginner digital piano"]
    assert "Prices are in US dollars: 300 EUR is about $324." in out.notes
    assert out.products and all(p.price <= 324 for p in out.products)


def test_brand_typo_filters(grounded):
    out = grounded.search(["runing shoes"], {"brand": "nkie", "max_price": 80},
                          "nkie runing shoes under $80", 5)
    # the search is now limited to the product types the question names (Filters.categories)
    assert out.filters == Filters(brand="Nike", max_price=80.0, categories=("running_shoes",))
    assert out.corrected == {"nkie": "Nike", "runing": "running"}
    assert out.products and all(p.brand == "Nike" and p.price <= 80 for p in out.products)


def test_relax_price_cap_keeps_brand(grounded):
    out = grounded.search(["cordless vacuum"], {"brand": "Dyson", "max_price": 1.0},
                          "dyson cordless vacuum", 5)
    # the search is now limited to the product types the question names (Filters.categories)
    assert out.relaxed == ["max_price"] and out.filters == Filters(brand="Dyson", categories=("vacuum",))
    assert out.requested == Filters(brand="Dyson", max_price=1.0, categories=("vacuum",))
    assert out.notes == ["No Dyson products under $1; showing Dyson products at any price."]
    assert out.products and all(p.brand == "Dyson" for p in out.products)


def test_relax_brand_without_the_product(grounded):
    out = grounded.search(["laptop"], {"brand": "Dyson"}, "dyson laptop", 5)
    # the search is now limited to the product types the question names (Filters.categories)
    assert out.relaxed == ["brand"] and out.filters == Filters(categories=("laptop",))
    assert out.notes == ["No Dyson products match your search; showing other brands."]
    # the brand's words are not added: they would bring back Dyson vacuums, not laptops
    assert out.products and all("laptop" in p.title.lower() for p in out.products)


def test_brand_typo_that_matches_nothing_is_query_words(grounded):
    out = grounded.search(["motorola razr"], {"brand": "razr"}, "motorola razr", 5)
    assert out.relaxed == ["brand"] and out.corrected == {} and out.notes == []
    assert out.products and all(p.brand == "Motorola" for p in out.products)


def test_question_words_are_the_last_try(grounded):
    out = grounded.search(["xyzzy plugh"], {"brand": "Nike"},
                          "are the brooks adrenaline gts 23 good for flat feet?", 5)
    # the question's own words now come first, not last (its types and models resolved before
    # the plan's): the model it names is searched, without the made-up plan's brand
    assert out.relaxed == ["brand"] and out.filters == Filters(categories=("running_shoes",))
    assert out.products and all(p.brand == "Brooks" for p in out.products)
    assert out.products[0].model == "Brooks Adrenaline GTS 24"


@pytest.mark.parametrize("filters,relaxed,says", [
    ({}, [], ""),
    ({"brand": "Nike", "max_price": 30}, [], ""),  # words the catalog lacks: nothing to relax
])
def test_no_results_reply(grounded, filters, relaxed, says):
    out = grounded.search(["zzzz qqqq"], filters, "zzzz qqqq", 5)
    assert out.products == [] and out.relaxed == relaxed
    reply = grounded.no_results_reply(out, "zzzz qqqq")
    assert reply.startswith(f'I couldn\'t find any products for "zzzz qqqq" in our catalog{says}. ')
    # no category is near "zzzz qqqq": the reply now names the catalog's departments, not the
    # three largest categories
    assert "The catalog has 106 product types in " in reply and reply.endswith("; nothing near this.")
    assert reply.count(",") >= 2 and len(reply) < 300
    assert "http" not in reply and "www." not in reply


def test_queries_for_what_the_catalog_lacks_find_nothing(grounded):
    """Search matches any one word: without this rule "dewalt cordless drill" showed cordless
    vacuums. The catalog has no chainsaws, so the customer gets the system's no-results reply.
    (The new catalog has drills, impact drivers, Dyson purifiers and the word "mount": the
    queries are ones it lacks.)"""
    for q in ("stihl cordless chainsaw", "machu picchu", "greenworks 40v max lawn mower",
              "dyson straightener"):
        assert not grounded.covers(q)
        out = grounded.search([q], {}, q, 5)
        assert out.products == [], (q, [p.title for p in out.products])
    for q in ("gift ideas for someone who likes camping", "camping gift ideas",
              "wireless mouse for laptop", "adreness gts 23 adrenaline", "65 inch tv"):
        assert grounded.covers(q), q


def test_no_results_reply_quotes_only_words(grounded):
    out = SearchOutcome(products=[], queries=["zzzz https://evil.example/x [click](y) <b>"],
                        filters=Filters())
    reply = grounded.no_results_reply(out, "zzzz")
    assert reply.startswith('I couldn\'t find any products for "zzzz https evil example x click y b"')
    assert "://" not in reply and "](" not in reply and "evil.example" not in reply and "<" not in reply


def test_bad_arguments_like_the_engines(grounded):
    with pytest.raises(TypeError):
        grounded.search("running shoes", {}, "running shoes", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        grounded.search(["x"], {}, "x", 0)


# --------------------------------------------------------------------- product sources

class _NoList:
    name = "nolist"

    def search(self, queries: Sequence[str], filters: Filters | None = None, k: int = 5) -> list[Product]:
        return []


def test_vocabulary_source(grounded, catalog):
    engine = grounded.retriever
    assert isinstance(engine, SqliteFtsRetriever)
    listed = list(engine.iter_products(batch=5000))
    assert len(listed) == len(catalog) and listed[0] == catalog[0] and listed[-1] == catalog[-1]
    with pytest.raises(TypeError, match="pass a Vocabulary"):
        GroundedSearch(_NoList())
    small = GroundedSearch(_NoList(), Vocabulary.from_products(catalog[:300]))
    assert small.search(["zzzz"], {}, "zzzz", 3).products == []


def test_tantivy_lists_its_products(catalog):
    pytest.importorskip("tantivy")
    from rufus.retrieval.tantivy_engine import TantivyRetriever

    engine = TantivyRetriever.build(catalog[:200])
    # (ids are no longer numbered in catalog order)
    assert sorted(p.id for p in engine.iter_products()) == sorted(p.id for p in catalog[:200])
    # (the new catalog's first 200 listings are electronics: no Nike among them)
    assert GroundedSearch(engine).vocabulary.brand("sony") == "Sony"


# ------------------------------------------------------- real words and what the catalog lacks

def test_common_words_are_never_typos(vocab):
    """"is the mattress firm or soft": "firm" is one letter from "fire" (Fire tablets), but it
    is a word; only what is no word is corrected."""
    from rufus.retrieval.spelling import common_words
    words_ = common_words()
    assert {"firm", "mattress", "college", "collage", "warm"} <= words_
    typos = {"wireles", "vaccum", "beginer", "headphons", "keybord", "speakr", "bluetooh",
             "sneker", "pegasis", "adidsa", "headphnoes", "runing", "nkie"}
    assert not typos & words_
    assert vocab.correct("firm", ["mattress", "firm", "soft"]) is None
    assert vocab.correct("collage", ["lenovo", "laptop", "collage"]) is None
    assert vocab.correct("keybord", ["logitech", "keybord"]) == "keyboard"


# A known limitation, kept visible (strict: it fails the suite once fixed, so the mark goes).
KNOWN_LIMIT = pytest.mark.xfail(
    strict=True, reason="a conversational question naming a type the catalog lacks is mapped "
                        "by the nearest-type classifier on its other words (docs/catalog.md)")


@pytest.mark.parametrize("queries,question", [  # (the new catalog has mattresses; it has no sofas)
    (["sofa firmness"], "sofa firmness"),  # a keyword query: no nearest type for it
    pytest.param(["firm sofa"], "is the sofa firm or soft", marks=KNOWN_LIMIT),
    pytest.param(["sofa"], "is the sofa firm or soft", marks=KNOWN_LIMIT),
    pytest.param(["books"], "suggest some books for someone who loved the hunger games", marks=KNOWN_LIMIT),
    (["hunger games books"], "suggest some books for someone who loved the hunger games"),
])
def test_what_the_catalog_lacks_gets_no_unrelated_cards(grounded, queries, question):
    """The customer asked for a product the catalog does not have: the question's other words
    ("games", "soft") must not stand in for it (gaming monitors for a book request)."""
    out = grounded.search(queries, {}, question, 5)
    assert out.products == [], [p.title for p in out.products]
    assert out.corrected == {}
    reply = grounded.no_results_reply(out, question)
    assert reply.startswith("I couldn't find any products for ")


# ------------------------------------------------------- cards are what the query asks for

@pytest.mark.parametrize("query,phrase", [
    ("kids bike 16 inch", ["kids", "bike"]),
    ("dog harness for a 70 lb dog", ["dog", "harness"]),
    ("3 in 1 wireless charging station", ["wireless", "charging", "station"]),
    ("frying pan non stick that's oven safe", ["frying", "pan"]),
    ("family tent sleeps 6", ["family", "tent"]),
    ("65 in tv", ["tv"]),
])
def test_product_phrase(query, phrase):
    from rufus.retrieval.query import product_phrase
    assert product_phrase(query) == phrase


def test_what_a_query_asks_for(vocab):
    from rufus.retrieval.query import Ask
    assert vocab.ask("kids bike 16 inch") == Ask(head="bike", brand=None)
    assert vocab.ask("camping essentials") == Ask(head="camping", brand=None)
    assert vocab.ask("gifts for teacher") == Ask(head=None, brand=None)
    assert vocab.ask("brooks adrenaline gts 23").brand == "Brooks"
    assert vocab.ask("brooks adrenaline gts 23").head == "gts"


# (the new catalog has kids bikes, air purifiers and sleeping bags: products it lacks instead)
@pytest.mark.parametrize("queries,question", [
    (["16 inch kids scooter"], "kids scooter 16 inch"),  # kids bike 16 inch found iPhone 16
    (["dog harness for 70 lb dog"], "dog harness for a 70 lb dog"),  # found SPF 70 sunscreen
    (["dehumidifier for 500 sq ft room"], "dehumidifier for a 500 sq ft room"),  # 500-piece puzzles
    pytest.param(["sleeping pad"], "i need a sleeping pad rated to 20 degrees",  # a sleeping bag
                 marks=KNOWN_LIMIT),
])
def test_cards_that_match_only_a_side_word_are_not_shown(grounded, queries, question):
    """Search matches any one word; a card must have the product word the query asks for
    (in its title or category), else the customer gets the no-results reply."""
    out = grounded.search(queries, {}, question, 5)
    assert out.products == [], [p.title for p in out.products]


def test_a_brand_without_the_product_gives_way_to_the_product(grounded):
    """"nike noise cancelling headphones": Nike has no headphones; Nike sneakers matched the
    brand word. The brand filter is relaxed and headphones are shown, with the note."""
    out = grounded.search(["nike noise cancelling headphones"], {"brand": "Nike"},
                          "nike noise cancelling headphones", 5)
    assert out.products and all("headphone" in p.title.lower() for p in out.products)
    assert out.relaxed == ["brand"]
    assert "No Nike products match your search" in " ".join(out.notes)


@pytest.mark.parametrize("queries,question,word", [
    (["camping essentials"], "what do I need for a first camping trip", "camp"),
    (["stainless steel water bottle"], "looking for a stainless steel water bottle", "water bottle"),
    (["gopro hero 12"], "how deep can the gopro hero 12 go underwater without a case", "gopro"),
])
def test_the_product_is_still_found(grounded, queries, question, word):
    out = grounded.search(queries, {}, question, 5)
    assert out.products, queries
    assert all(word in f"{p.title} {p.brand} {p.category.replace('_', ' ')}".lower()
               for p in out.products), [p.title for p in out.products]
