"""The shopping assistant on the real stack: one tritonserver with rufus_qp_medusa,
rufus_llm and rufus_assistant (which calls the other two on the same server over gRPC),
the generated catalog's SQLite index, and the library interface against the same server.
The server (``stack``) and its OpenAI frontend are session fixtures (conftest.py), shared
with test_adversarial_assistant.py and test_adversarial_openai.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import Any

import pytest

from rufus.assistant import Assistant
from rufus.assistant.card_answers import previous_links
from rufus.assistant.pipeline import PRODUCT_INTENTS
from rufus.assistant.prompt import SERVICE_REPLIES
from rufus.client import AsyncStreams, RequestFailed, output_str
from rufus.errors import InvalidInput
from rufus.launch.server import TritonServer
from rufus.retrieval import default_retriever
from rufus.retrieval.base import norm_brand

from .conftest import metric_value, scrape, wait_for

pytestmark = pytest.mark.integration
LINK = re.compile(r"\]\((https?://[^\s)]+)\)")
URL = re.compile(r"https?://[^\s)\]]+")


@pytest.fixture(scope="module")
def url(stack) -> str:
    return f"127.0.0.1:{stack.grpc_port}"


@pytest.fixture(scope="module")
def catalog():
    return default_retriever()


async def _ask(url: str, question: Any = None, history: Any = None,
               stop_after_text: bool = False) -> dict[str, Any]:
    io = AsyncStreams(url)
    out: dict[str, Any] = {"text": "", "responses": 0}
    tensors: dict[str, Any] = {}
    if question is not None:
        tensors["question"] = question
    if history is not None:
        tensors["history"] = history
    try:
        async with contextlib.aclosing(io.stream("rufus_assistant", tensors, timeout=300)) as s:
            async for outs in s:
                out["responses"] += 1
                if "products" in outs:
                    out["first_index"] = out["responses"]
                    out["plan"] = json.loads(output_str(outs, "plan"))
                    out["fallback"] = bool(outs["fallback"].reshape(-1)[0])
                    out["products"] = json.loads(output_str(outs, "products"))
                out["text"] += output_str(outs, "text_output")
                if "timings" in outs:
                    out["timings"] = json.loads(output_str(outs, "timings"))
                    out["finish_reason"] = output_str(outs, "finish_reason")
                if stop_after_text and out["text"]:
                    break
    finally:
        await io.close()
    return out


def ask(url: str, question: Any = None, history: Any = None, **kw: Any) -> dict[str, Any]:
    return asyncio.run(_ask(url, question, history, **kw))


def check_grounded(r: dict[str, Any], catalog) -> None:
    """Cards are catalog products; every URL in the answer is one of the cards' links."""
    urls = {c["url"] for c in r["products"]}
    for c in r["products"]:
        p = catalog.get(c["id"])
        assert p is not None and p.url == c["url"] and p.image_url == c["image_url"]
    assert set(URL.findall(r["text"])) <= urls, r["text"]


def test_cards_first_respect_filters_and_links_are_retrieved(url, catalog):
    r = ask(url, "nike running shoes under $100")
    assert r["first_index"] == 1 and r["plan"]["intent"] in PRODUCT_INTENTS, r["plan"]
    f = r["plan"]["filters"]
    assert r["products"], r["plan"]
    for c in r["products"]:
        if "brand" in f:
            assert norm_brand(c["brand"]) == norm_brand(f["brand"])
        if "max_price" in f:
            assert c["price"] <= f["max_price"]
    assert f.get("max_price") == 100, f
    check_grounded(r, catalog)
    assert r["text"].strip() and r["finish_reason"] in ("stop", "length")
    assert {"plan_s", "retrieval_s", "cards_s", "first_token_s", "total_s"} <= set(r["timings"])


# a pick line; after the stars, what of the question its card meets (", capacity 6 qt")
PICK = re.compile(r"^(\d)\. \[(.+)\]\((https?://[^\s)]+)\) — \$(\d+\.\d\d), (\d\.\d) stars"
                  r"(?:, [^:\n]+?)?(?:: ([a-z][a-z ,'-]*))?\.$", re.M)


@pytest.fixture(scope="module")
def facts(catalog):
    from rufus.assistant.answer_checks import CatalogFacts

    return CatalogFacts.from_products(catalog.iter_products())


@pytest.mark.parametrize("question", [
    "noise cancelling headphones for travel", "ninja vs cosori air fryer",
    "wireles mouse for laptop", "robot vaccum under 1k"])
def test_every_rendered_fact_equals_its_card(url, catalog, facts, question):
    """The real model under the answer grammar: each line of the answer is a pick whose
    name, link, price and rating are its card's, each card at most once, the reason one of
    its card's own facts; the independent answer checks find no loop, no invented product
    and no contradiction. Typos and a plan filter that is no catalog brand still find cards."""
    from rufus.assistant.answer import reason_options, reason_text
    from rufus.assistant.answer_checks import check_answer

    r = ask(url, question)
    cards = r["products"]
    assert cards, r["plan"]
    by_url = {c["url"]: c for c in cards}
    picks = PICK.findall(r["text"])
    assert picks, r["text"]
    assert len({u for _, _, u, *_ in picks}) == len(picks)
    for n, (i, title, link, price, rating, reason) in enumerate(picks, start=1):
        c = by_url[link]
        assert int(i) == n and title == c["title"], r["text"]
        assert float(price) == round(c["price"], 2) and float(rating) == round(c["rating"], 1)
        if reason:
            menu = reason_options([catalog.get(x["id"]) for x in cards[:4]], question)
            said = [reason_text(k) for k in menu[[x["url"] for x in cards].index(link)]]
            assert reason in said, (reason, menu)
    body = "\n".join(line for line in r["text"].splitlines() if not PICK.fullmatch(line))
    assert all(not line.strip() or line.startswith(("Showing ", "Prices are ", "No ", "Nothing ",
                                                   "All of these: "))
               for line in body.splitlines()), r["text"]
    d = check_answer(r["text"], cards, facts, question)
    assert d.ok and d.cites_shown, (d, r["text"])
    assert 0 < r["timings"]["answer_tokens"] <= 64


def test_no_matching_product_gets_the_system_reply(url):
    # the catalog of real models has DeWalt drills now; it has no chainsaws
    r = ask(url, "stihl cordless chainsaw")
    assert r["products"] == [] and r["finish_reason"] == "service", r
    # the reply names the categories near the question, or the catalog's departments
    assert r["text"].startswith("I couldn't find any products for ") and "The catalog has" in r["text"]
    assert "http" not in r["text"]


def test_multi_turn_carries_context(url, catalog):
    first = ask(url, "I need running shoes")
    history = [{"role": "user", "content": "I need running shoes"},
               {"role": "assistant", "content": first["text"]}]
    # $80: the catalog's cheapest running shoe is $70 (a $60 cap would be relaxed, and said)
    r = ask(url, "any under $80?", history)
    assert r["products"], r["plan"]
    assert all(c["price"] <= 80 for c in r["products"]), (r["plan"], r["products"])
    cats = [catalog.get(c["id"]).category for c in r["products"]]
    assert cats.count("running_shoes") >= len(cats) - 1, (r["plan"], cats)
    check_grounded(r, catalog)


def _models(catalog) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in catalog.iter_products():
        out.setdefault(p.model, p)
    return out


def test_attribute_question_states_the_cards_value(url, catalog):
    """Issue 58: the first line is the card's value for the model asked about."""
    r = ask(url, "does the sony wh-1000xm5 support multipoint?")
    xm5 = _models(catalog)["Sony WH-1000XM5"]
    assert [c["model"] for c in r["products"]] == ["Sony WH-1000XM5"], r["products"]
    first = r["text"].strip().splitlines()[0]
    want = "yes" if xm5.attributes["multipoint"] else "no"
    assert "multipoint" in first and f"**{want}**" in first, r["text"]
    check_grounded(r, catalog)


def test_comparison_shows_every_named_product_and_the_pick_its_words_decide(url, catalog):
    r = ask(url, "which lasts longer on a charge: jbl flip 6, bose soundlink flex or ue wonderboom 3?")
    named = ["JBL Flip 6", "Bose SoundLink Flex", "Ultimate Ears WONDERBOOM 3"]
    assert [c["model"] for c in r["products"]] == named, r["products"]
    assert "| Battery life |" in r["text"], r["text"]
    models = _models(catalog)
    best = max(named, key=lambda m: models[m].attributes["battery_hours"])
    pick = r["text"].strip().splitlines()[-1]
    assert next(c["url"] for c in r["products"] if c["model"] == best) in pick, r["text"]
    check_grounded(r, catalog)


def test_follow_ups_refer_to_the_previous_answers_products_by_position(url, catalog):
    first = ask(url, "wireless earbuds under $150")
    listed = LINK.findall(first["text"])
    assert len(listed) >= 2, first["text"]
    history = [{"role": "user", "content": "wireless earbuds under $150"},
               {"role": "assistant", "content": first["text"]}]
    both = ask(url, "compare the first two", history)
    assert [c["url"] for c in both["products"]] == listed[:2], (listed, both["products"])
    assert "| Price |" in both["text"], both["text"]
    second = ask(url, "does the second one come in blue?", history)
    model = next(c["model"] for c in first["products"] if c["url"] == listed[1])
    assert second["products"] and {c["model"] for c in second["products"]} == {model}
    assert second["text"].startswith(("Yes", "No")), second["text"]
    check_grounded(both, catalog)
    check_grounded(second, catalog)


SERVICE_QUESTIONS = {
    "order_status": ["where's my order with the running shoes",
                     "has my package with the headphones shipped yet",
                     "track my order"],
    "returns_refunds": ["how do i return a jacket that doesn't fit",
                        "can i get a refund for a broken blender",
                        "how do i send back shoes that are too small"],
}


def test_service_intents_answer_without_search(url):
    """The path follows the planner's intent: a service intent gets its fixed reply and no
    cards, anything else a search. Several phrasings per intent, because the planner (92%
    intent accuracy, docs/benchmarks.md) misroutes some; each intent must be routed once."""
    routed = dict.fromkeys(SERVICE_QUESTIONS, 0)
    for intent, questions in SERVICE_QUESTIONS.items():
        for q in questions:
            r = ask(url, q)
            got = r["plan"]["intent"]
            if got in SERVICE_REPLIES:
                assert r["products"] == [] and r["text"] == SERVICE_REPLIES[got], r
                assert r["finish_reason"] == "service"
                routed[intent] += got == intent
            elif got in PRODUCT_INTENTS:  # service: the system's no-results reply
                assert r["finish_reason"] in ("stop", "length") or (
                    r["finish_reason"] == "service" and not r["products"])
            if routed[intent]:
                break
    assert all(routed.values()), f"planner never routed to {routed}"


def test_planner_fallback_still_answers(url, catalog):
    """The library interface against the real server, with a planner that is not there:
    the fallback plan searches the question (and its price cap), the real model answers."""
    async def go() -> list:
        a = Assistant(url, catalog, planner_model="rufus_qp_not_loaded", max_tokens=32)
        try:
            async with contextlib.aclosing(a.stream("wireless earbuds under $50")) as events:
                return [ev async for ev in events]
        finally:
            await a.aclose()

    evs = asyncio.run(go())
    assert [e.type for e in evs][:2] == ["plan", "products"] and evs[-1].type == "done"
    assert evs[0].fallback and evs[0].plan["filters"] == {"max_price": 50.0}
    cards = evs[1].products
    assert cards and all(c["price"] <= 50 for c in cards)
    assert all(catalog.get(c["id"]).category == "earbuds" for c in cards)
    text = "".join(e.text for e in evs if e.type == "text")
    assert text.strip() and set(URL.findall(text)) <= {c["url"] for c in cards}


def _llm_engine_requests(srv: TritonServer) -> float:
    return metric_value(scrape(srv), "rufus_engine_requests", model="rufus_llm")


def test_cancellation_frees_the_answer_slot(stack, url):
    assert wait_for(lambda: _llm_engine_requests(stack) == 0, timeout=30)
    cancelled0 = metric_value(scrape(stack), "rufus_assistant_requests_total", outcome="cancelled")
    # the client stops after the first answer text: the stream is cancelled (RST_STREAM)
    r = ask(url, "what is a good laptop for college", stop_after_text=True)
    assert r["text"] and "timings" not in r
    t = time.monotonic()
    assert wait_for(lambda: _llm_engine_requests(stack) == 0, timeout=15), \
        "the answer model still holds the cancelled request"
    print(f"answer slot freed {time.monotonic() - t:.2f} s after the client cancelled "
          "(gauge sampled every 0.5 s)")
    assert wait_for(lambda: metric_value(scrape(stack), "rufus_assistant_requests_total",
                                         outcome="cancelled") > cancelled0, timeout=10)


BAD_INPUTS = [
    (None, None, "question: missing"),
    ("", None, "question: is empty"),
    ("shoes", "[not json", "history: is not valid JSON"),
    ("shoes", [{"role": "robot", "content": "x"}], "history[0].role"),
    ("x" * 1001, None, "question: is 1001 characters"),
]


def test_bad_input_named_and_good_stream_unaffected(url):
    """Every bad request gets INVALID_ARG naming the field while a good stream runs."""
    async def bad(question: Any, history: Any) -> str:
        try:
            await _ask(url, question, history)
        except RequestFailed as exc:
            return str(exc)
        return "no error"

    async def go():
        good = asyncio.create_task(_ask(url, "wireless earbuds"))
        errors = await asyncio.gather(*(bad(q, h) for q, h, _ in BAD_INPUTS))
        return errors, await good

    errors, good = asyncio.run(go())
    for (_q, _h, field), err in zip(BAD_INPUTS, errors, strict=True):
        assert "INVALID_ARG" in err and field in err, err
    assert good["products"] and good["text"] and good["finish_reason"] in ("stop", "length")


def test_metrics_stage_histograms(stack, url):
    ask(url, "bluetooth speaker for the beach")
    text = scrape(stack)
    for stage in ("plan", "retrieval", "cards", "answer_ttft", "first_token", "total"):
        assert metric_value(text, "rufus_assistant_stage_seconds_count", stage=stage) >= 1, stage
    assert metric_value(text, "rufus_assistant_requests_total", outcome="ok") >= 1


def test_library_bad_input_raises_invalid_input(url, catalog):
    async def go():
        a = Assistant(url, catalog)
        try:
            async for _ in a.stream("ok", [{"role": "user"}]):
                pass
        finally:
            await a.aclose()

    with pytest.raises(InvalidInput) as ei:
        asyncio.run(go())
    assert ei.value.field == "history[0].content"


# ------------------------------------------- the same stack through the OpenAI frontend


@pytest.fixture(scope="module")
def openai_client(assistant_frontend):
    """The official ``openai`` client on ``python -m rufus.frontend`` (as ``make serve`` runs
    it) in front of this stack (conftest ``assistant_frontend``); model ``rufus-assistant``."""
    import openai

    return openai.OpenAI(base_url=f"{assistant_frontend}/v1", api_key="unused",
                         max_retries=0, timeout=300)


def test_openai_streaming_cards_first_then_grounded_answer(openai_client, catalog):
    stream = openai_client.chat.completions.create(
        model="rufus-assistant", stream=True,
        messages=[{"role": "user", "content": "running shoes under $80"}])
    chunks = list(stream)
    first = chunks[0]
    cards = first.model_extra["x_rufus_products"]
    plan = first.model_extra["x_rufus_plan"]
    assert cards and plan["filters"].get("max_price") == 80, plan
    assert all(c["price"] <= 80 for c in cards)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the content starts with the cards as markdown links, then the answer
    for i, c in enumerate(cards, 1):
        assert f"{i}. [" in text and f"]({c['url']})" in text
    r = {"products": cards, "text": text}
    check_grounded(r, catalog)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_openai_multi_turn_and_non_streaming(openai_client, catalog):
    messages = [{"role": "user", "content": "I need running shoes"},
                {"role": "assistant", "content": "Here are some running shoes."},
                {"role": "user", "content": "any under $80?"}]  # the cheapest is $70
    resp = openai_client.chat.completions.create(model="rufus-assistant", messages=messages)
    cards = resp.model_extra["x_rufus_products"]
    assert cards and all(c["price"] <= 80 for c in cards), resp.model_extra["x_rufus_plan"]
    cats = [catalog.get(c["id"]).category for c in cards]
    assert cats.count("running_shoes") >= len(cats) - 1, cats
    check_grounded({"products": cards, "text": resp.choices[0].message.content}, catalog)


def test_openai_attribute_question_and_follow_up_by_position(openai_client, catalog):
    """Issue 58 on the OpenAI path: the content (cards, then the answer) carries the card's
    value; sent back as history, "the first one" is the answer's first product."""
    ask1 = [{"role": "user", "content": "is the le creuset dutch oven dishwasher safe?"}]
    resp = openai_client.chat.completions.create(model="rufus-assistant", messages=ask1)
    text = resp.choices[0].message.content
    assert "dishwasher safe: **" in text, text
    hist = [{"role": "user", "content": "portable bluetooth speaker for the beach"}]
    first = openai_client.chat.completions.create(model="rufus-assistant", messages=hist)
    answer = first.choices[0].message.content
    picks = previous_links([{"role": "assistant", "content": answer}])  # the answer's list
    follow = openai_client.chat.completions.create(model="rufus-assistant", messages=[
        *hist, {"role": "assistant", "content": answer},
        {"role": "user", "content": "how long does the battery last on the first one?"}])
    cards = follow.model_extra["x_rufus_products"]
    assert picks and cards and cards[0]["url"] == picks[0], (answer, cards)
    assert "battery life: **" in follow.choices[0].message.content


def test_openai_bad_input_is_a_400_naming_the_field(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError) as ei:
        openai_client.chat.completions.create(
            model="rufus-assistant",
            messages=[{"role": "user", "content": "shoes"},
                      {"role": "assistant", "content": "which ones?"}])
    assert ei.value.body["param"] == "messages", ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:
        openai_client.chat.completions.create(
            model="rufus-assistant", messages=[{"role": "user", "content": "x" * 1001}])
    assert ei.value.body["param"] == "messages" and "1001" in ei.value.body["message"]


def test_openai_disconnect_frees_the_answer_slot(stack, openai_client):
    assert wait_for(lambda: _llm_engine_requests(stack) == 0, timeout=30)
    stream = openai_client.chat.completions.create(
        model="rufus-assistant", stream=True, max_tokens=400,
        messages=[{"role": "user", "content": "tell me everything about running shoes"}])
    texts = 0
    for chunk in stream:
        texts += bool(chunk.choices and chunk.choices[0].delta.content)
        if texts == 2:
            break  # the cards' markdown came first; this is the answer's first text
    stream.close()  # the HTTP connection goes away
    assert wait_for(lambda: _llm_engine_requests(stack) == 0, timeout=15), \
        "the answer model still holds the request of a client that went away"
