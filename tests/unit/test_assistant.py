"""Assistant pipeline at its unit boundaries: link rendering, validation, plan handling,
event order, intent paths, planner fallback and cancellation, with a fake Triton stream
layer (the real stack is tests/integration/test_assistant.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rufus.assistant.answer import reason_options
from rufus.assistant.pipeline import Assistant, fallback_plan, search_queries, validate_request
from rufus.assistant.prompt import (
    LinkRenderer,
    answer_messages,
    family,
    price_cap,
    product_lines,
)
from rufus.assistant.triton_model import parse_assistant_request
from rufus.client import RequestFailed
from rufus.errors import InvalidInput
from rufus.retrieval.catalog_data import default_catalog
from rufus.retrieval.sqlite_fts import SqliteFtsRetriever
from rufus.serving.admission import AdmissionSettings, SloAdmission

CATALOG = list(default_catalog())


@pytest.fixture(scope="module")
def retriever():
    return SqliteFtsRetriever.build(CATALOG)


def _b(s: str) -> np.ndarray:
    return np.array([s.encode()], dtype=np.object_)


# ------------------------------------------------------------------ link rendering

def test_renderer_links_citations_across_chunk_boundaries():
    prods = CATALOG[:3]
    r = LinkRenderer(prods)
    text = "Try [1] or [3]. Skip [9]."
    out = "".join(r.feed(c) for c in text) + r.flush()
    assert out == f"Try [{prods[0].title}]({prods[0].url}) or [{prods[2].title}]({prods[2].url}). Skip ."
    assert r.cited == [prods[0].id, prods[2].id]


@pytest.mark.parametrize("chunks", [
    ["See https://evil.example/x now"],
    ["See ht", "tps://evil", ".example/x", " now"],
    ["See [a deal](https://evil.example/x) now"],
    ["See www.evil", ".example now"],
])
def test_renderer_drops_model_urls(chunks):
    r = LinkRenderer(CATALOG[:1])
    out = "".join(r.feed(c) for c in chunks) + r.flush()
    assert "evil" not in out and "http" not in out and out.startswith("See ") and out.endswith("now")


def test_renderer_holds_back_little():
    r = LinkRenderer(CATALOG[:1])
    assert r.feed("Hello world, ") == "Hello world, "
    assert r.feed("see [") == "see "
    assert r.feed("1] thanks") == f"[{CATALOG[0].title}]({CATALOG[0].url}) thanks"


# ------------------------------------------------------------------ validation and plans

@pytest.mark.parametrize("question,history,field", [
    ("", None, "question"),
    ("   ", None, "question"),
    (42, None, "question"),
    ("x" * 1001, None, "question"),
    ("ok", "not a list", "history"),
    ("ok", [{"role": "robot", "content": "hi"}], "history[0].role"),
    ("ok", [{"role": "user"}], "history[0].content"),
    ("ok", [{"role": "user", "content": "a"}] * 9, "history"),
])
def test_bad_input_names_the_field(question, history, field):
    with pytest.raises(InvalidInput) as ei:
        validate_request(question, history)
    assert ei.value.field == field


def test_triton_request_parsing():
    req = parse_assistant_request({"question": _b("shoes"), "history": _b(json.dumps(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))})
    assert req.question == "shoes" and len(req.history) == 2
    with pytest.raises(InvalidInput, match="question: missing"):
        parse_assistant_request({"question": None, "history": None})
    with pytest.raises(InvalidInput, match="history: is not valid JSON"):
        parse_assistant_request({"question": _b("x"), "history": _b("[oops")})
    with pytest.raises(InvalidInput, match="question: is not valid UTF-8"):
        parse_assistant_request({"question": np.array([b"\xff\xfe"], dtype=np.object_)})


def test_fallback_plan_reads_price_cap():
    assert price_cap("running shoes under $80") == 80
    assert price_cap("a tv below 500 dollars") == 500
    assert price_cap("65 inch tv") is None
    p = fallback_plan("running  shoes under $80")
    assert p["search_queries"] == ["running shoes under $80"] and p["filters"] == {"max_price": 80.0}


def test_follow_up_without_product_words_searches_previous_turn():
    history = [{"role": "user", "content": "I need running shoes"},
               {"role": "assistant", "content": "Here are some."}]
    plan = {"search_queries": ["any under $60?"], "filters": {"max_price": 60}}
    assert search_queries(plan, "any under $60?", history) == ["I need running shoes"]
    plan2 = {"search_queries": ["trail shoes"], "filters": {}}
    assert search_queries(plan2, "q", history) == ["trail shoes"]


def test_answer_prompt_has_products_not_urls():
    msgs = answer_messages("q?", CATALOG[:2], [{"role": "user", "content": "x" * 2000}])
    assert msgs[0]["role"] == "system" and msgs[-1]["content"].startswith("Products:\n[1] ")
    assert "http" not in json.dumps(msgs)
    assert len(msgs[1]["content"]) <= 400


def test_answer_history_keeps_questions_and_the_opening_of_answers():
    history = [{"role": "user", "content": "q" * 300}, {"role": "assistant", "content": "a" * 900}]
    msgs = answer_messages("and cheaper?", CATALOG[:2], history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == "q" * 300  # a question whole
    assert msgs[2]["content"].startswith("a" * 100) and len(msgs[2]["content"]) <= 160


def test_answer_prompt_lists_the_top_products_and_links_only_those(retriever):
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["[4] or [5]"])
    evs = run(Assistant("x", retriever, k=5, answer_products=4), fake, "running shoes")
    cards = evs[1].products
    assert len(cards) == 5  # the cards are all k products
    prompt = fake.calls[1][1]["messages"][-1]["content"]
    assert "[4] " in prompt and "[5] " not in prompt and cards[4]["title"] not in prompt
    text = "".join(e.text for e in evs if e.type == "text")
    assert f"({cards[3]['url']})" in text and cards[4]["url"] not in text
    with pytest.raises(ValueError, match="answer_products"):
        Assistant("x", retriever, answer_products=0)


# ------------------------------------------------------------------ pipeline with fake streams

class FakeStreams:
    """Stands in for rufus.assistant.triton_io.TritonStreams (Triton over gRPC)."""

    def __init__(self, plan: dict | None, answer: list[str], plan_error: Exception | None = None,
                 hang: bool = False) -> None:
        self.plan, self.answer, self.plan_error, self.hang = plan, answer, plan_error, hang
        self.calls: list[tuple[str, dict]] = []
        self.keys: list[tuple[str, str | None]] = []
        self.closed: list[str] = []
        self.parameters: list[tuple[str, dict[str, Any] | None]] = []
        self.traces: list[tuple[str, dict[str, str] | None]] = []

    async def stream(self, model: str, tensors: dict[str, Any], conversation: str | None = None,
                     parameters: dict[str, Any] | None = None,
                     trace: dict[str, str] | None = None):
        self.calls.append((model, tensors))
        self.traces.append((model, trace))
        self.keys.append((model, conversation))
        self.parameters.append((model, parameters))
        try:
            if model == "rufus_qp_medusa":
                if self.plan_error:
                    raise self.plan_error
                yield {"plan": _b(json.dumps(self.plan)), "fallback": np.array([False])}
                return
            for tok in self.answer:
                await asyncio.sleep(0)
                yield {"text_output": _b(tok)}
            if self.hang:
                await asyncio.sleep(3600)
            yield {"text_output": _b(""), "finish_reason": _b("stop")}
        finally:
            self.closed.append(model)


def run(assistant: Assistant, fake: FakeStreams, question: str, history=None,
        conversation: str | None = None) -> list:
    assistant.streams = lambda: fake  # type: ignore[method-assign]

    async def go():
        return [ev async for ev in assistant.stream(question, history, conversation)]

    return asyncio.run(go())


def plan_of(intent: str, queries: list[str], filters: dict | None = None) -> dict:
    return {"intent": intent, "query_type": "keyword", "search_queries": queries,
            "filters": filters or {}}


def test_product_path_event_order_filters_and_links(retriever):
    fake = FakeStreams(plan_of("product_search", ["running shoes"], {"max_price": 80}),
                       ["[", "1", "] see http://x.example", "\n[2] at www.x.example"])
    evs = run(Assistant("x", retriever), fake, "running shoes under $80")
    assert [e.type for e in evs][:2] == ["plan", "products"] and evs[-1].type == "done"
    assert all(e.type == "text" for e in evs[2:-1])
    cards = evs[1].products
    assert cards and all(c["price"] <= 80 for c in cards)
    text = "".join(e.text for e in evs if e.type == "text")
    assert f"({cards[0]['url']})" in text and f"({cards[1]['url']})" in text and "x.example" not in text
    msgs = fake.calls[1][1]["messages"]
    assert f"[1] {cards[0]['model']}:" in msgs[-1]["content"]  # its name (its model: fewer tokens)
    assert {"plan_s", "retrieval_s", "cards_s", "answer_ttft_s", "first_token_s", "total_s"} <= \
        set(evs[-1].timings)
    assert evs[-1].finish_reason == "stop" and fake.closed == ["rufus_qp_medusa", "rufus_llm"]


def test_answer_request_carries_the_grammar_and_renders_facts_from_cards(retriever):
    """The answer model is asked for picks under the grammar, with a repetition penalty; its
    picks come back as lines rendered from the cards, and the reasons as its menu says."""
    fake = FakeStreams(plan_of("product_search", ["running shoes"]),
                       ["[2] not on", " its menu\n[", "2] x", "\n[1] built for nothing"])
    dropped: list[str] = []
    a = Assistant("x", retriever)
    a.metrics.dropped = dropped.append  # type: ignore[method-assign]
    evs = run(a, fake, "running shoes")
    sampling = fake.calls[1][1]["sampling_parameters"]
    assert sampling["repetition_penalty"] > 1 and "root ::=" in sampling["structured_outputs"]["grammar"]
    cards = evs[1].products
    text = "".join(e.text for e in evs if e.type == "text")
    c2 = cards[1]
    assert text.startswith(f"1. [{c2['title']}]({c2['url']}) — ${c2['price']:.2f}, "
                           f"{c2['rating']:.1f} stars")
    assert text.count(c2["url"]) == 1 and f"2. [{cards[0]['title']}]" in text
    assert "nothing" not in text and "menu" not in text and dropped == ["format"] * 3
    assert "answer_tokens" in evs[-1].timings


def test_no_results_is_a_system_reply_without_the_model(retriever):
    fake = FakeStreams(plan_of("product_search", ["zzqx vvqq"]), ["[1] never"])
    evs = run(Assistant("x", retriever), fake, "zzqx vvqq")
    assert evs[1].products == [] and [m for m, _ in fake.calls] == ["rufus_qp_medusa"]
    text = "".join(e.text for e in evs if e.type == "text")
    assert "zzqx" in text and "http" not in text and evs[-1].finish_reason == "service"


def test_search_notes_lead_the_first_pick(retriever):
    """A brand the catalog does not have is a query word, not a filter; a typo is corrected
    and said so, ahead of the first pick, not before the model's first token."""
    fake = FakeStreams(plan_of("product_search", ["wireles mouse"], {"brand": "wireles"}),
                       ["[1] x"])
    evs = run(Assistant("x", retriever), fake, "wireles mouse for laptop")
    assert evs[1].products
    texts = [e.text for e in evs if e.type == "text"]
    assert texts[0].startswith('Showing results for "wireless"') and "\n\n1. [" in texts[0]


def test_brand_filter_respected(retriever):
    fake = FakeStreams(plan_of("product_search", ["headphones"], {"brand": "sony"}), ["ok"])
    evs = run(Assistant("x", retriever), fake, "sony headphones")
    assert evs[1].products and all(c["brand"] == "Sony" for c in evs[1].products)


@pytest.mark.parametrize("intent", ["order_status", "returns_refunds"])
def test_service_intents_need_no_search_and_no_model(retriever, intent):
    fake = FakeStreams(plan_of(intent, ["order"]), [])
    evs = run(Assistant("x", retriever), fake, "where is my order")
    assert evs[1].products == [] and evs[1].path == "service"
    assert [m for m, _ in fake.calls] == ["rufus_qp_medusa"]
    assert evs[2].type == "text" and "Your Orders" in evs[2].text and evs[-1].finish_reason == "service"


def test_off_topic_answers_without_products(retriever):
    fake = FakeStreams(plan_of("other", ["how tall is everest"]), ["About 8,849 m."])
    evs = run(Assistant("x", retriever), fake, "how tall is everest")
    assert evs[1].products == [] and evs[1].path == "general"
    assert "not about shopping" in fake.calls[1][1]["messages"][0]["content"]


def test_planner_failure_falls_back_to_question(retriever):
    fake = FakeStreams(None, ["Here."], plan_error=RequestFailed("[UNAVAILABLE] gone", "UNAVAILABLE"))
    evs = run(Assistant("x", retriever), fake, "wireless earbuds under $50")
    assert evs[0].fallback and "planner unavailable" in evs[0].fallback_reason
    assert evs[0].plan["search_queries"] == ["wireless earbuds under $50"]
    assert evs[1].products and all(c["price"] <= 50 for c in evs[1].products)
    assert evs[-1].type == "done"


def test_history_reaches_planner_and_answer_model(retriever):
    history = [{"role": "user", "content": "I need running shoes"},
               {"role": "assistant", "content": "Here are some."}]
    # $80: the catalog's cheapest running shoes (Nike Revolution 7) list at $70
    fake = FakeStreams(plan_of("product_search", ["any"], {"max_price": 80}), ["ok"])
    evs = run(Assistant("x", retriever), fake, "any under $80?", history)
    assert fake.calls[0][1]["history"] == history
    assert fake.calls[1][1]["messages"][1:3] == history
    assert evs[1].products and all(c["price"] <= 80 for c in evs[1].products)
    assert any("Shoe" in c["title"] for c in evs[1].products)


def test_follow_up_prefills_the_answer_prefix_while_planning(retriever):
    """On a follow-up, a one-token rufus_llm request carries the answer prompt's known start
    (system message, earlier turns, the products header); the real answer prompt continues
    it exactly, so vLLM's prefix cache serves that part. Off: no such request."""
    history = [{"role": "user", "content": "I need running shoes"},
               {"role": "assistant", "content": "Here are some."}]
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["ok"])
    run(Assistant("x", retriever), fake, "any under $60?", history)
    llm = [t for m, t in fake.calls if m == "rufus_llm"]
    warm, answer = [t for t in llm if t["sampling_parameters"]["max_tokens"] == 1], \
        [t for t in llm if t["sampling_parameters"]["max_tokens"] != 1]
    assert len(warm) == 1 and len(answer) == 1
    w, a = warm[0]["messages"], answer[0]["messages"]
    assert w[:-1] == a[:-1] and a[-1]["content"].startswith(w[-1]["content"])
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["ok"])
    run(Assistant("x", retriever, prewarm=False), fake, "any under $60?", history)
    assert [m for m, _ in fake.calls] == ["rufus_qp_medusa", "rufus_llm"]
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["ok"])
    run(Assistant("x", retriever), fake, "running shoes")  # first turn: nothing to prefill
    assert [m for m, _ in fake.calls] == ["rufus_qp_medusa", "rufus_llm"]


def test_closing_the_stream_cancels_the_answer_call(retriever):
    fake = FakeStreams(plan_of("product_search", ["tv"]), ["[1]", " b"], hang=True)
    a = Assistant("x", retriever)
    a.streams = lambda: fake  # type: ignore[method-assign]

    async def go():
        async with contextlib.aclosing(a.stream("tv")) as events:
            async for ev in events:
                if ev.type == "text":
                    break
        return list(fake.closed)

    assert asyncio.run(asyncio.wait_for(go(), 5)) == ["rufus_qp_medusa", "rufus_llm"]


def test_cancelling_the_task_cancels_the_answer_call(retriever):
    fake = FakeStreams(plan_of("product_search", ["tv"]), [], hang=True)
    a = Assistant("x", retriever)
    a.streams = lambda: fake  # type: ignore[method-assign]

    async def consume():
        async with contextlib.aclosing(a.stream("tv")) as events:
            async for _ in events:
                pass

    async def go():
        t = asyncio.create_task(consume())
        while "rufus_llm" not in [m for m, _ in fake.calls]:
            await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return list(fake.closed)

    assert asyncio.run(asyncio.wait_for(go(), 5)) == ["rufus_qp_medusa", "rufus_llm"]


def test_bad_input_raised_before_any_call(retriever):
    fake = FakeStreams(None, [])
    with pytest.raises(InvalidInput, match="question"):
        run(Assistant("x", retriever), fake, "")
    assert fake.calls == []


def test_renderer_links_product_names_written_out():
    from rufus.assistant.prompt import family

    heads = [p for p in CATALOG if p.category == "headphones"]
    # two models (the first listings are colours of one model: one family name)
    prods = [heads[0], next(p for p in heads if family(p) != family(heads[0]))]
    name = family(prods[1])
    r = LinkRenderer(prods)
    text = f"1. {name}, great for travel. 2. Something else."
    out = "".join(r.feed(text[i:i + 3]) for i in range(0, len(text), 3)) + r.flush()
    assert out == f"1. [{name}]({prods[1].url}), great for travel. 2. Something else."
    assert r.cited == [prods[1].id]


def test_renderer_never_holds_the_opening_words_for_a_name():
    """An answer that opens with a product's name is released as the model writes it (plain
    text: holding it for a link would delay the first text by the whole name); the same name
    later in the answer is linked."""
    from rufus.assistant.prompt import family

    heads = [p for p in CATALOG if p.category == "headphones"]
    # two models (the first listings are colours of one model: one family name)
    prods = [heads[0], next(p for p in heads if family(p) != family(heads[0]))]
    name = family(prods[1])
    r = LinkRenderer(prods)
    first = r.feed(" " + name[:5])
    assert first == " " + name[:5]
    text = name[5:] + f" is great. Also {name}."
    out = first + "".join(r.feed(text[i:i + 3]) for i in range(0, len(text), 3)) + r.flush()
    assert out == f" {name} is great. Also [{name}]({prods[1].url})."
    assert r.cited == [prods[1].id]
    r = LinkRenderer(prods)
    assert r.feed("[") == "" and r.feed("2] fits") == f"[{prods[1].title}]({prods[1].url}) fits"


def test_diversify_prefers_distinct_families():
    from rufus.assistant.prompt import diversify, family

    shoes = [p for p in CATALOG if p.category == "running_shoes"]
    same = [p for p in shoes if family(p) == family(shoes[0])][:4]
    # another model: a model's men's and women's listings are one choice too (one model)
    other = [p for p in shoes if p.model != shoes[0].model][:2]
    out = diversify(same + other, 3)
    assert out[:2] == [same[0], other[0]] and len(out) == 3
    women = next(p for p in shoes if p.model == shoes[0].model and family(p) != family(shoes[0]))
    assert diversify([shoes[0], women, *other], 2) == [shoes[0], other[0]]


def test_stated_price_cap_added_when_planner_drops_it(retriever):
    fake = FakeStreams(plan_of("product_search", ["wireless earbuds"]), ["ok"])
    evs = run(Assistant("x", retriever), fake, "wireless earbuds under $50")
    assert evs[0].plan["filters"] == {"max_price": 50.0} and not evs[0].fallback
    assert evs[1].products and all(c["price"] <= 50 for c in evs[1].products)
    fake2 = FakeStreams(plan_of("product_search", ["earbuds"], {"max_price": 30}), ["ok"])
    assert run(Assistant("x", retriever), fake2, "earbuds under $50")[0].plan["filters"] == \
        {"max_price": 30}


# ------------------------------------------------------------------ Triton adapter (fake sender)

class FakePb:
    """Just enough of ``triton_python_backend_utils`` for TritonSink."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = ("INTERNAL", "INVALID_ARG",
                                                          "UNAVAILABLE", "CANCELLED")

        def __init__(self, message: str, code: str = "INTERNAL") -> None:
            self.message, self.code = message, code

    @staticmethod
    def Tensor(name: str, arr: Any) -> tuple[str, Any]:
        return name, arr

    @staticmethod
    def InferenceResponse(output_tensors: list, error: Any = None) -> Any:
        return SimpleNamespace(outputs=dict(output_tensors), error=error)


class FakeSender:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.sent: list[tuple[Any, Any, bool]] = []
        self.polls_after_final = 0
        self.polls = 0
        self.cancel_after = cancel_after

    def send(self, response: Any, flags: int = 0) -> None:
        self.sent.append((response.outputs or None, response.error, bool(flags)))

    def is_cancelled(self) -> bool:
        self.polls += 1
        if self.sent and self.sent[-1][2]:
            self.polls_after_final += 1
        return self.cancel_after is not None and self.polls > self.cancel_after


def _adapter(monkeypatch, retriever, fake_streams):
    from rufus.assistant import triton_model as tm
    from rufus.assistant.pipeline import NullMetrics
    from rufus.serving import triton_backend
    from rufus.serving.cancel import CancelWatcher

    monkeypatch.setattr(triton_backend, "pb_utils", FakePb)
    m = tm.AssistantModel.__new__(tm.AssistantModel)
    m.assistant = Assistant("x", retriever, admission=SloAdmission(AdmissionSettings(slo_s=0)))
    m.assistant.search.vocabulary  # noqa: B018 - built at load, as AssistantModel.start does
    m.assistant.search.taxonomy  # noqa: B018 - built at load too (AssistantModel.start's warm-up)
    m.assistant.streams = lambda: fake_streams  # type: ignore[method-assign]
    m.watcher, m.tasks, m.metrics = CancelWatcher(interval=0.01), set(), NullMetrics()
    return m


def _sink(sender: FakeSender) -> Any:
    from rufus.serving.triton_backend import TritonSink

    return TritonSink(sender)


def test_adapter_never_polls_a_finished_request(monkeypatch, retriever):
    from rufus.assistant.triton_model import AssistantRequest

    fake = FakeStreams(plan_of("product_search", ["tv"]), ["a", "b", "c"])
    m = _adapter(monkeypatch, retriever, fake)
    senders = [FakeSender() for _ in range(5)]

    async def go():
        m.loop = asyncio.get_running_loop()
        for s in senders:
            m._start(AssistantRequest("tv", []), _sink(s))
        while m.tasks:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)

    asyncio.run(go())
    for s in senders:
        assert s.sent[-1][2] and s.sent[-1][1] is None and "products" in s.sent[0][0]
        assert sum(final for _, _, final in s.sent) == 1
        assert s.polls_after_final == 0


def test_adapter_cancels_on_client_disconnect(monkeypatch, retriever):
    from rufus.assistant.triton_model import AssistantRequest

    fake = FakeStreams(plan_of("product_search", ["tv"]), ["[1] a"], hang=True)
    m = _adapter(monkeypatch, retriever, fake)
    s = FakeSender(cancel_after=3)

    async def go():
        m.loop = asyncio.get_running_loop()
        m._start(AssistantRequest("tv", []), _sink(s))
        for _ in range(500):
            if s.sent and s.sent[-1][2]:
                break
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert s.sent[-1][1].code == "CANCELLED" and s.sent[-1][2]
    assert "rufus_llm" in fake.closed and s.polls_after_final == 0


def test_conversation_key_goes_with_every_call_of_the_turn(retriever):
    """The answer-prefix prefill and the answer carry the key, so behind the ingress they land
    on the unit holding this conversation's prefix; the plan goes to the least busy unit
    (no key); without a key none is sent."""
    history = [{"role": "user", "content": "I need running shoes"},
               {"role": "assistant", "content": "Here are some running shoes."}]
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["Try ", "these."])
    run(Assistant("x", retriever), fake, "any in red?", history, conversation="c-42")
    assert sorted(fake.keys, key=str) == sorted([("rufus_qp_medusa", None), ("rufus_llm", "c-42"),
                                                  ("rufus_llm", "c-42")], key=str)
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["Try ", "these."])
    run(Assistant("x", retriever), fake, "any in red?", history)
    assert {k for _, k in fake.keys} == {None}


def test_the_plan_request_accepts_the_turns_plan_time_limit(retriever):
    """The planner's own SLO admission (300 ms) gives way to the turn's: the plan request
    states the assistant's plan time limit as ``slo_ms``; the answer requests state none."""
    fake = FakeStreams(plan_of("product_search", ["running shoes"]), ["Try ", "these."])
    run(Assistant("x", retriever, plan_timeout_s=2.5), fake, "running shoes")
    assert ("rufus_qp_medusa", {"slo_ms": 2500}) in fake.parameters
    assert all(p is None for m, p in fake.parameters if m == "rufus_llm")


def test_product_lines_are_names_and_their_reason_menus():
    """A product line is its number, its name without colour or size variants (its model:
    the product type is the cards', fewer prefill tokens), and the menu of reasons the
    grammar allows for it (the facts the model chooses among); no digits of price or rating
    (prefill tokens; the card and the pick line show them)."""
    ps = list(default_catalog())[:3]
    menus = reason_options(ps, "running shoes")
    lines = product_lines(ps, "running shoes").split("\n")
    assert len(lines) == 3
    for i, (p, line, menu) in enumerate(zip(ps, lines, menus, strict=True), start=1):
        assert line == f"[{i}] {p.model}: {'; '.join(menu)}" and p.model in family(p)
        assert f"{p.price:.2f}" not in line


def test_adapter_refusal_is_unavailable_on_grpc(monkeypatch, retriever):
    """rufus_assistant's Triton adapter: a turn the admission refuses gets UNAVAILABLE
    (retryable: the ingress or client tries another unit) as its one, final response."""
    from rufus.assistant.triton_model import AssistantRequest

    fake = FakeStreams(plan_of("product_search", ["tv"]), [], hang=True)
    m = _adapter(monkeypatch, retriever, fake)
    m.assistant.admission = SloAdmission(AdmissionSettings(base_s=0.9, per_waiting_s=1.0,
                                                                     warm_after=0))
    busy, refused = FakeSender(), FakeSender()

    async def go():
        m.loop = asyncio.get_running_loop()
        m._start(AssistantRequest("tv", []), _sink(busy))
        await asyncio.sleep(0.05)
        m._start(AssistantRequest("tv", []), _sink(refused))
        for _ in range(200):
            if refused.sent:
                break
            await asyncio.sleep(0.01)
        for t in list(m.tasks):
            t.cancel()
        await asyncio.sleep(0.05)

    asyncio.run(go())
    (_, err, final), = refused.sent
    assert final and err.code == "UNAVAILABLE" and "SLO" in err.message


def test_adapter_admits_on_the_execute_thread(monkeypatch, retriever):
    """AssistantModel.submit (Triton's execute thread) admits or refuses before the request
    reaches the pipeline's loop, so a refusal does not wait behind streaming answers; the
    ticket of an admitted request is returned however its task ends."""
    from rufus.assistant.triton_model import AssistantRequest
    from rufus.errors import Unavailable
    from rufus.serving.admission import AdmissionSettings, SloAdmission

    fake = FakeStreams(plan_of("product_search", ["tv"]), [], hang=True)
    m = _adapter(monkeypatch, retriever, fake)
    adm = m.assistant.admission = SloAdmission(AdmissionSettings(base_s=0.9, per_waiting_s=1.0,
                                                                     warm_after=0))

    async def go():
        m.loop = asyncio.get_running_loop()
        m.submit(AssistantRequest("tv", []), _sink(FakeSender()), 0.0)
        await asyncio.sleep(0.05)
        assert adm.waiting == 1
        with pytest.raises(Unavailable):
            m.submit(AssistantRequest("tv", []), _sink(FakeSender()), 0.0)
        for t in list(m.tasks):
            t.cancel()
        await asyncio.sleep(0.05)

    asyncio.run(go())
    assert (adm.waiting, adm.decoding) == (0, 0)
