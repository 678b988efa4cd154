"""Answer rules from held-out set 9's misses (issue 58), each tested on other wordings than
the set's: a service intent the planner gave a product question, a model code said without
its letter prefix, a feature said as what the product does by itself. On the default
catalog, in memory; the planner and the answer model faked at the stream boundary."""

from __future__ import annotations

import pytest

from rufus.assistant.pipeline import Assistant
from rufus.retrieval.attributes import asked_keys
from rufus.retrieval.catalog_data import default_catalog, default_categories
from rufus.retrieval.search import GroundedSearch
from rufus.retrieval.sqlite_fts import SqliteFtsRetriever
from tests.unit.test_assistant import FakeStreams, plan_of, run


@pytest.fixture(scope="module")
def retriever() -> SqliteFtsRetriever:
    return SqliteFtsRetriever.build(list(default_catalog()), categories=default_categories())


@pytest.mark.parametrize("question", [
    "can i change the brew strength on the moccamaster",
    "does the lp60x play 78s",
])
def test_a_service_intent_without_order_words_is_a_product_question(retriever, question):
    fake = FakeStreams(plan_of("order_status", [question]), ["ok"])
    evs = run(Assistant("x", retriever), fake, question)
    assert evs[1].path == "products" and evs[1].products


@pytest.mark.parametrize("question", ["where is my moccamaster order",
                                      "i want to return the lp60x i bought"])
def test_order_and_return_words_keep_the_service_reply(retriever, question):
    intent = "order_status" if "order" in question else "returns_refunds"
    fake = FakeStreams(plan_of(intent, [question]), [])
    evs = run(Assistant("x", retriever), fake, question)
    assert evs[1].path == "service" and evs[1].products == []


def test_a_model_code_without_its_letter_prefix_names_the_model(retriever):
    tax = GroundedSearch(retriever).taxonomy
    assert tax.resolve("is the lp60x any good").models == ["Audio-Technica AT-LP60X"]
    # the series number stays part of the code: "xm5" alone names neither Sony
    assert tax.resolve("sony wh-1000xm5 price").models == ["Sony WH-1000XM5"]


@pytest.mark.parametrize("question", ["does it turn itself off after a while",
                                      "will the kettle shut itself off if i forget it"])
def test_what_a_product_does_by_itself_is_its_feature(question):
    assert asked_keys(question, ["auto_shutoff", "capacity_cups", "warranty_years"])[:1] == \
        ["auto_shutoff"]
