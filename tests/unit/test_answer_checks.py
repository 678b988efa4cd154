"""The answer checks can fail: one hand-written bad answer per defect of the user report
(loops, contradicted facts, invented products, no cited card), and good answers that pass.
Also the evaluation's rates and its question set (data/assistant/answers_eval.jsonl)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rufus.assistant.answer_checks import AnswerDefects, CatalogFacts, check_answer
from rufus.assistant.answer_eval import (
    FIELDS,
    PRODUCT_INTENTS,
    hard_rows,
    matching_products,
    qp_rows,
    rates,
    score,
    stem,
    summary,
)
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import default_catalog

ROOT = Path(__file__).resolve().parents[2]
BASE = "https://shop.example.com/p"


def card(pid: str, title: str, brand: str, price: float, rating: float) -> dict[str, Any]:
    slug = title.split(",")[0].lower().replace(" ", "-").replace("'", "")
    return {"id": pid, "title": title, "brand": brand, "price": price, "rating": rating,
            "url": f"{BASE}/{pid}/{slug}", "image_url": f"https://images.shop.example.com/{pid}.jpg"}


SONY = card("P000002", "Sony WH-1000XM5 Over-Ear Headphones, Silver, 30 hours", "Sony", 348.0, 4.5)
BOSE = card("P000035", "Bose QuietComfort Ultra Noise Cancelling Headphones, Black, 40 hours",
            "Bose", 429.99, 4.7)
ANKER = card("P000068", "Anker Soundcore Life Q30 Wireless Headphones, Midnight Blue, 60 hours",
             "Anker", 79.99, 4.4)
HEADPHONES = [SONY, BOSE, ANKER]
GHOST = card("P000000", "Brooks Ghost 16 Men's Running Shoes, Blue, 10", "Brooks", 139.99, 4.6)
NOVA = card("P000033", "ASICS Gel-Nimbus 26 Men's Road Running Shoes, Black, 11", "ASICS", 119.95, 4.4)
CLIFTON = card("P000066", "Hoka Clifton 9 Men's Running Sneakers, White, 10", "Hoka", 144.99, 4.5)
SHOES = [GHOST, NOVA, CLIFTON]
TV = card("P000005", "Samsung QLED Q60D 65 Inch 4K UHD QLED TV, 4K HDR", "Samsung", 897.99, 4.3)


def link(c: dict[str, Any], title: str | None = None) -> str:
    return f"[{title or c['title']}]({c['url']})"


@pytest.fixture(scope="module")
def catalog() -> list[Product]:
    return list(default_catalog())


@pytest.fixture(scope="module")
def facts(catalog: list[Product]) -> CatalogFacts:
    return CatalogFacts.from_products(catalog)


# ------------------------------------------------------------------ good answers pass

GOOD_HEADPHONES = (
    'Showing results for "wireless" (you wrote "wireles").\n'
    f"1. {link(SONY)} — $348.00, 4.5 stars: quiet on flights and long trips.\n"
    f"2. {link(BOSE)} — $429.99, 4.7 stars: the strongest noise cancelling here.\n"
    f"3. {link(ANKER)} — $79.99, 4.4 stars: a budget pick with long battery life.")


def test_rendered_answer_with_a_system_note_passes(facts: CatalogFacts) -> None:
    d = check_answer(GOOD_HEADPHONES, HEADPHONES, facts)
    assert d.ok, d
    assert d.cites_shown and not d.loop and d.loop_detail == ""
    assert d.tokens is None


def test_markdown_bold_bounds_and_prose_pass(facts: CatalogFacts) -> None:
    text = ("**Top picks for flat feet under $150:**\n\n"
            f"1. **{link(GHOST)}** — $139.99, 4.6 out of 5 stars. Cushioned for long runs, in Blue.\n"
            f"2. {link(NOVA)} — $119.95, rated 4.4: light and bouncy for daily training, "
            "and it has hundreds of 5-star reviews.\n"
            f"3. {link(CLIFTON)} — $144.99 (4.5/5), size 10: soft for recovery days; "
            "both stay well below $150 and over 4 stars.")
    d = check_answer(text, SHOES, facts)
    assert d.ok, d


def test_prose_comparison_and_family_names_pass(facts: CatalogFacts) -> None:
    text = (f"The {link(SONY, 'Sony WH-1000XM5 Over-Ear Headphones')} costs $348.00 in Silver, "
            f"while the {link(BOSE)} is $429.99 in black. The Bose is rated 4.7 stars. "
            f"For less, the {link(ANKER)} in midnight blue is $79.99.")
    d = check_answer(text, HEADPHONES, facts)
    assert d.ok, d


def test_one_card_twice_in_one_item_and_twin_titles_are_no_loop(facts: CatalogFacts) -> None:
    twin = {**GHOST, "id": "P000099", "url": f"{BASE}/P000099/brooks-ghost-16"}
    family = link(GHOST, "Brooks Ghost 16 Men's Running Shoes")
    text = (f"1. {link(GHOST)}: cushioned. See {family}.\n"
            f"2. {link(twin)}: the same shoe from another seller.")
    d = check_answer(text, [GHOST, twin], facts)
    assert d.ok, d


def test_plain_words_that_are_also_names_are_not_products(facts: CatalogFacts) -> None:
    text = (f"{link(GHOST)} — great for daily training and long runs; instant comfort, a global "
            "favourite, no gap at the heel, wireless-free and classic. Go 4 miles in it easily.")
    d = check_answer(text, SHOES, facts)
    assert d.ok, d


def test_a_note_quoting_the_customer_names_no_product(facts: CatalogFacts) -> None:
    text = f'No results for "nike pegasus"; here are other running shoes.\n1. {link(GHOST)}: cushioned.'
    assert check_answer(text, SHOES, facts).ok


# ------------------------------------------------------------------ loops

def test_loop_numbered_phrase_seventeen_times(facts: CatalogFacts) -> None:
    text = "Here are some options: " + "1. The 1st product: " * 17
    d = check_answer(text, SHOES, facts)
    assert d.loop and "the 1st product" in d.loop_detail
    assert not d.cites_shown and not d.ok


def test_loop_phrase_repeated_back_to_back(facts: CatalogFacts) -> None:
    d = check_answer(f"The {link(GHOST)} is a great choice with a shoe with a shoe.", SHOES, facts)
    assert d.loop and "with a shoe" in d.loop_detail
    assert not d.invented and not d.contradictions


def test_loop_same_card_as_items_one_to_four(facts: CatalogFacts) -> None:
    text = "\n".join(f"{i}. {link(GHOST)} — {why}" for i, why in enumerate(
        ("cushioned", "good for long runs", "comfortable", "a daily trainer"), start=1))
    d = check_answer(text, SHOES, facts)
    assert d.loop and "items 1, 2, 3, 4" in d.loop_detail


def test_loop_sentence_said_twice(facts: CatalogFacts) -> None:
    d = check_answer("no suggestions. no suggestions.", SHOES, facts)
    assert d.loop and "sentence said 2 times" in d.loop_detail
    assert not d.cites_shown


def test_loop_word_four_times_and_four_gram_three_times(facts: CatalogFacts) -> None:
    d = check_answer(f"{link(GHOST)} is very very very very soft.", SHOES, facts)
    assert d.loop and "4 times in a row" in d.loop_detail
    text = (f"{link(GHOST)} is great for running. Also it is great for running fast. "
            "Truly it is great for running on trails.")
    d = check_answer(text, SHOES, facts)
    assert d.loop and "4-gram" in d.loop_detail


# ------------------------------------------------------------------ contradictions

def test_colour_contradicts_card(facts: CatalogFacts) -> None:
    d = check_answer(f"1. {link(SONY)} — the Black one, $348.00, 4.5 stars.", HEADPHONES, facts)
    assert d.contradictions == [
        "item 1: colour Black but the card is 'Sony WH-1000XM5 Over-Ear Headphones, Silver, 30 hours'"]
    assert not d.ok and not d.loop and not d.invented


def test_multi_word_colour_first(facts: CatalogFacts) -> None:
    d = check_answer(f"{link(SONY)} comes in Midnight Blue.", HEADPHONES, facts)
    assert [c for c in d.contradictions if "Midnight Blue" in c]
    assert not [c for c in d.contradictions if "colour Blue " in c]


def test_rating_contradicts_card(facts: CatalogFacts) -> None:
    d = check_answer(f"1. {link(SONY)} has 1.0 stars from buyers.", HEADPHONES, facts)
    assert d.contradictions == ["item 1: rating 1.0 but Sony WH-1000XM5 Over-Ear Headphones is rated 4.5"]
    for said in ("rated 4.2", "4.2 out of 5", "4.2/5", "a rating of 4.2"):
        assert check_answer(f"{link(SONY)} is {said}.", HEADPHONES, facts).contradictions, said


def test_price_contradicts_card_to_the_cent(facts: CatalogFacts) -> None:
    d = check_answer(f"{link(BOSE)} — $429.00.", HEADPHONES, facts)
    assert d.contradictions == [
        "item 1: price $429.00 but Bose QuietComfort Ultra Noise Cancelling Headphones is $429.99"]
    assert check_answer(f"{link(TV)} at $1,897.99 is a deal.", [TV], facts).contradictions
    assert check_answer(f"{link(TV)} at $897.99 is a deal.", [TV], facts).ok


def test_sizes_contradict_card(facts: CatalogFacts) -> None:
    assert check_answer(f"{link(GHOST)} in size 12.", SHOES, facts).contradictions
    assert check_answer(f"{link(GHOST)} in size 10.", SHOES, facts).ok
    for said in ("55 inch", '55"', "55-inch"):
        d = check_answer(f"The {link(TV)} is a {said} TV.", [TV], facts)
        assert d.contradictions, said
    assert check_answer(f"The {link(TV)} is a 65-inch TV.", [TV], facts).ok


def test_fact_belongs_to_the_nearest_card_and_carries_within_the_item(facts: CatalogFacts) -> None:
    # $79.99 is Anker's: said before Anker's link, after no other
    text = f"At $79.99, the {link(ANKER)} beats the {link(SONY)} at $348.00."
    assert check_answer(text, HEADPHONES, facts).ok
    text = f"1. {link(SONY)}: great sound.\n   It costs $298.00 and comes in Black."
    d = check_answer(text, HEADPHONES, facts)
    assert len(d.contradictions) == 2 and all(c.startswith("item 1:") for c in d.contradictions)


def test_facts_inside_the_link_title_are_not_claims(facts: CatalogFacts) -> None:
    # the title says "Silver" and "30 hours"; the text itself states nothing
    assert check_answer(f"1. {link(SONY)}: for travel.", HEADPHONES, facts).ok


# ------------------------------------------------------------------ invented

def test_link_to_a_url_that_is_no_card(facts: CatalogFacts) -> None:
    text = f"1. [Sony WH-1000XM4 Headphones]({BASE}/P999999/sony-wh-1000xm4) — $278.00"
    d = check_answer(text, HEADPHONES, facts)
    assert any("no shown card" in x and "P999999" in x for x in d.invented)
    assert not d.cites_shown


def test_link_title_that_is_not_its_cards(facts: CatalogFacts) -> None:
    d = check_answer(f"1. {link(SONY, 'Sony WH-1000XM6 Headphones, Black')}: new model.", HEADPHONES, facts)
    assert any("link title" in x for x in d.invented)
    assert d.cites_shown  # it still links a shown card


def test_catalog_names_that_no_card_is(facts: CatalogFacts) -> None:
    text = f"1. {link(GHOST)}: cushioned. Also try the Nike Pegasus 41 or Brooks Adrenaline GTS 23."
    d = check_answer(text, SHOES, facts)
    assert "names 'Nike', which no shown card is" in d.invented
    assert "names 'Pegasus 41', which no shown card is" in d.invented
    assert "names 'Adrenaline GTS 23', which no shown card is" in d.invented
    assert not any("Brooks" in x for x in d.invented)   # a shown card's brand


def test_a_name_the_customer_used_is_not_invented(facts: CatalogFacts) -> None:
    text = "I found no Nike noise cancelling headphones; try another brand."
    assert check_answer(text, [], facts, question="nike noise cancelling headphones").ok
    assert check_answer(text, [], facts).invented == ["names 'Nike', which no shown card is"]


def test_numbered_item_without_a_card_link_is_invented(facts: CatalogFacts) -> None:
    text = (f"1. {link(GHOST)} — $139.99: cushioned.\n"
            f"2. {link(NOVA)} — $119.95: light.\n"
            "3. Adkins Adz 9 Men's Running Shoes, Black, 11")
    d = check_answer(text, SHOES, facts)
    assert d.invented == ["list item 3 links no shown card: \"Adkins Adz 9 Men's Running Shoes, Black, 11\""]
    assert not d.contradictions  # item 3 has no card to contradict


def test_answer_citing_no_shown_product(facts: CatalogFacts) -> None:
    d = check_answer("These are all great running shoes for flat feet.", SHOES, facts)
    assert d.ok and not d.cites_shown


def test_defects_serialise() -> None:
    d = AnswerDefects(loop=True, loop_detail="x", invented=["a"], tokens=12)
    assert d.to_json() == {"ok": False, "loop": True, "loop_detail": "x", "invented": ["a"],
                           "contradictions": [], "cites_shown": False, "tokens": 12}


# ------------------------------------------------------------------ rates and the question set

def record(question: str, answer: str, cards: list[dict[str, Any]], expect: bool,
           **timings: float) -> dict[str, Any]:
    return {"question": question, "expect_cards": expect, "cards": cards, "answer": answer,
            "timings": timings, "error": ""}


def test_rates_count_each_defect(facts: CatalogFacts) -> None:
    recs = [score(r, facts) for r in (
        record("q1", GOOD_HEADPHONES, HEADPHONES, True, first_token_s=0.2, answer_tokens=30),
        record("q2", "no suggestions. no suggestions.", SHOES, True, first_token_s=0.4,
               answer_tokens=10),
        record("q3", f"1. {link(SONY)} — the Black one.", HEADPHONES, True, first_token_s=0.3),
        record("q4", "Sorry, nothing matches.", [], True, first_token_s=0.1),
        record("q5", "Try another brand.", [SONY], False),
        {"question": "q6", "expect_cards": True, "cards": [], "answer": "", "timings": {},
         "error": "rufus_assistant: [UNAVAILABLE]"},
    )]
    r = rates(recs)
    assert (r["questions"], r["errors"], r["answered"], r["with_cards"]) == (6, 1, 5, 4)
    assert r["empty_answers"] == 0
    assert r["loop_rate"] == pytest.approx(1 / 5)
    assert r["contradiction_rate"] == pytest.approx(1 / 5)
    assert r["invented_rate"] == 0
    assert r["ok_rate"] == pytest.approx(3 / 5)
    assert r["cites_shown_rate"] == pytest.approx(2 / 4)
    assert r["no_cards_when_expected"] == {"count": 1, "questions": ["q4"]}
    assert r["cards_when_not_expected"] == {"count": 1, "questions": ["q5"]}
    assert (r["answer_tokens_mean"], r["answer_tokens_p50"]) == (20, 10)
    assert (r["first_token_p50_s"], r["first_token_p99_s"]) == (0.3, 0.4)
    assert recs[0]["defects"]["tokens"] == 30 and recs[3]["defects"]["tokens"] is None
    text = summary({"rates": r, "cpu": {"flags": "avx512f", "aten_cpu_capability": "avx2"}})
    assert "loop" in text and "ATEN_CPU_CAPABILITY=avx2" in text


def test_rates_of_nothing_are_nan() -> None:
    r = rates([])
    assert math.isnan(r["loop_rate"]) and math.isnan(r["first_token_p50_s"])
    assert "-" in summary({"rates": r})


def test_stem() -> None:
    assert [stem(w) for w in ("shoes", "earbuds", "batteries", "glasses", "boxes", "levi's", "mattress")] == \
        ["shoe", "earbud", "battery", "glass", "box", "levi", "mattress"]


def test_question_set_matches_its_sources(catalog: list[Product]) -> None:
    rows = [json.loads(line) for line in
            (ROOT / "data/assistant/answers_eval.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(tuple(r) == FIELDS for r in rows)
    qp = [json.loads(line) for line in (ROOT / "data/qp/eval.jsonl").read_text(encoding="utf-8").splitlines()]
    single = [r for r in qp if r["intent"] in PRODUCT_INTENTS and not r.get("history")]
    assert [r for r in rows if r["source"] == "qp_eval"] == qp_rows(qp, catalog)
    assert len([r for r in rows if r["source"] == "qp_eval"]) == len(single)
    hand = [r for r in rows if r["source"] == "hand"]
    assert hand == hard_rows(catalog) and len(hand) >= 15
    for r in hand:  # every category and brand is the catalog's spelling
        assert r["category"] in {p.category for p in catalog}
        assert r["brand"] is None or r["brand"] in {p.brand for p in catalog}
    assert not next(r for r in hand if r["question"] == "nike noise cancelling headphones")["expect_cards"]
    assert matching_products(catalog, ["running", "shoe"], brand="nike", max_price=100)


def test_a_written_out_card_name_refers_to_it_but_cites_nothing(facts: CatalogFacts) -> None:
    text = ("1. Brooks Ghost 16 Men's Running Shoes — $129.99: cushioned.\n"
            f"2. {link(NOVA)} — $119.95: light.")
    d = check_answer(text, SHOES, facts)
    assert d.invented == []
    assert d.contradictions == ["item 1: price $129.99 but Brooks Ghost 16 Men's Running Shoes is $139.99"]
    assert check_answer("Brooks Ghost 16 Men's Running Shoes: cushioned.", SHOES, facts).cites_shown is False


# ------------------------------------------------------------------ the script's I/O

def _script() -> Any:
    """scripts/eval_answers.py's I/O: the lab module whose ``main`` it calls."""
    import importlib

    return importlib.import_module("lab.eval_answers")


def test_script_collects_a_streamed_answer_and_rescores_offline(tmp_path: Path) -> None:
    import asyncio

    import numpy as np

    def out(**values: Any) -> dict[str, Any]:
        """One response's outputs as tritonclient gives them: BYTES and BOOL arrays."""
        return {k: np.array([v], dtype=bool) if isinstance(v, bool) else
                np.array([v.encode()], dtype=object) for k, v in values.items()}

    class FakeStreams:
        def stream(self, model: str, values: dict[str, Any], timeout: float = 0) -> Any:
            assert model == "rufus_assistant" and values == {"question": "running shoes"}

            async def gen() -> Any:
                yield out(plan=json.dumps({"intent": "product_search"}), fallback=False,
                          products=json.dumps(SHOES))
                yield out(text_output="1. " + link(GHOST))
                yield out(text_output=" — $139.99, 4.6 stars: cushioned.")
                yield out(finish_reason="stop",
                          timings=json.dumps({"first_token_s": 0.25, "answer_tokens": 9}))
            return gen()

    mod = _script()
    rec = asyncio.run(mod.ask(FakeStreams(), "running shoes", 5.0))
    assert rec["cards"] == SHOES and rec["fallback"] is False and rec["error"] == ""
    assert rec["answer"] == f"1. {link(GHOST)} — $139.99, 4.6 stars: cushioned."
    assert rec["timings"]["answer_tokens"] == 9 and rec["finish_reason"] == "stop"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"cpu": {"flags": ""}, "records": [
        {"question": "running shoes", "expect_cards": True, **rec},
        {"question": "loop", "expect_cards": True, **rec, "answer": "no suggestions. no suggestions."}]}))
    new = tmp_path / "new.json"
    assert mod.main(["--offline-file", str(old), "--out", str(new)]) == 0
    report = json.loads(new.read_text())
    assert report["rates"]["loop_rate"] == 0.5 and report["rates"]["answer_tokens_mean"] == 9
    assert report["records"][0]["defects"]["ok"] and report["rescored_from"] == str(old)
    assert mod.cpu().keys() == {"flags", "aten_cpu_capability"}
