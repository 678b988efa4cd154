"""The shopping assistant: question -> plan -> product retrieval -> streamed, grounded answer.

    assistant = Assistant("127.0.0.1:8001", default_retriever())
    async with contextlib.aclosing(assistant.stream("running shoes under $80")) as events:
        async for ev in events:
            ...   # plan, products (cards), text deltas, done

Events, always in this order: one ``plan`` (the planner's plan and its ``fallback`` flag),
one ``products`` (product cards; empty for intents that need no search), any number of
``text`` (answer deltas, links already rendered), one ``done`` (``finish_reason``,
``timings`` in seconds). Bad input raises :class:`rufus.errors.InvalidInput` naming the field before
any model is called. Stopping early (closing the generator, or cancelling the task that
iterates it) cancels the planner / answer gRPC streams at once; Triton then marks those
requests cancelled and the models abort them in their engines (polled every 0.25 s).

Paths by the plan's intent (docs/architecture.md, "Shopping assistant"):

- product_search / product_comparison / product_question / recommendation, and every
  fallback plan: retrieval with the plan's queries and filters (a fallback plan searches the
  question itself, with a price cap read from it) -> rufus_llm with the products as context.
- order_status / returns_refunds: no search, no model: a fixed reply that says where the
  real answer is (the model has no order or policy data and would make it up).
- other (off-topic): no search; rufus_llm answers briefly and offers shopping help.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from rufus.assistant import card_answers
from rufus.assistant.answer import (
    MAX_PICKS,
    REPETITION_PENALTY,
    CatalogNames,
    PickRenderer,
    answer_grammar,
    reason_options,
)
from rufus.assistant.prompt import (
    SERVICE_REPLIES,
    LinkRenderer,
    answer_messages,
    answer_prefix_messages,
    cards,
    clip,
    diversify,
    price_cap,
)
from rufus.assistant.settings import AssistantSettings, PipelineSettings
from rufus.client import AsyncStreams, RequestFailed, output_str
from rufus.errors import RufusError
from rufus.retrieval.base import MAX_QUERY_CHARS, ProductSource, Retriever, query_terms
from rufus.retrieval.catalog import Product
from rufus.retrieval.grounding import GroundedSearch, SearchOutcome
from rufus.serving.admission import SloAdmission, Ticket
from rufus.serving.validation import check_history, check_question
from rufus.telemetry import tracing

log = logging.getLogger("rufus.assistant")

PRODUCT_INTENTS = frozenset({"product_search", "product_comparison", "product_question",
                             "recommendation"})
# What of each earlier turn the planner sees. Its training turns are short (data/qp/
# train.jsonl): a whole answer is out of distribution (its product names leak into the
# search queries) and every character of prompt costs plan time on the critical path
# (docs/benchmarks-history.md, "Shopping assistant").
PLANNER_HISTORY_CHARS = {"user": 300, "assistant": 80}

EventType = Literal["plan", "products", "text", "done", "render"]


@dataclass(frozen=True)
class AssistantEvent:
    type: EventType
    plan: dict[str, Any] | None = None           # plan
    fallback: bool = False                       # plan
    fallback_reason: str = ""                    # plan
    products: list[dict[str, Any]] | None = None  # products: id, title, brand, price, rating, url, image_url
    text: str = ""                               # text
    finish_reason: str = ""                      # done: stop | length | service (system-written)
    # done: seconds (*_s); answer_tokens, answer_prompt_tokens (the answer model's usage)
    timings: dict[str, float] = field(default_factory=dict)
    path: str = ""                               # products, done: products | service | general
    seconds: float = 0.0                         # render (internal to the pipeline)


class AssistantMetrics(Protocol):
    def observe(self, stage: str, seconds: float) -> None: ...
    def count(self, outcome: str, path: str) -> None: ...
    def dropped(self, kind: str) -> None: ...
    def estimate(self, seconds: float) -> None: ...
    def estimate_error(self, seconds: float) -> None: ...


class NullMetrics:
    def observe(self, stage: str, seconds: float) -> None:
        pass

    def count(self, outcome: str, path: str) -> None:
        pass

    def dropped(self, kind: str) -> None:
        pass

    def estimate(self, seconds: float) -> None:
        pass

    def estimate_error(self, seconds: float) -> None:
        pass


# The general (off-topic) answer: one or two sentences (SYSTEM_GENERAL), bounded.
GENERAL_MAX_TOKENS = 64


def validate_request(question: Any, history: Any) -> list[dict[str, str]]:
    """Check question and history with the planner's own bounds (a valid assistant request
    is a valid planner request); returns the history as clean {role, content} turns."""
    check_question(question)
    return check_history(history)


def fallback_plan(question: str) -> dict[str, Any]:
    """The planner's documented fallback (question passed through), plus a price cap read
    from the question, so "running shoes under $80" still gets its filter."""
    q = " ".join(question.split())[:80] or "?"
    cap = price_cap(question)
    return {"intent": "other", "query_type": "conversational", "search_queries": [q],
            "filters": {"max_price": cap} if cap is not None else {}}


def with_stated_price_cap(plan: dict[str, Any], question: str) -> dict[str, Any]:
    """A price cap the customer states in this question ("under $50") is a hard constraint:
    added when the planner left it out (measured: the planner sometimes drops it)."""
    cap = price_cap(question)
    filters = plan.get("filters") or {}
    if cap is None or "max_price" in filters or plan.get("intent") not in PRODUCT_INTENTS:
        return plan
    return {**plan, "filters": {**filters, "max_price": cap}}


def search_queries(plan: dict[str, Any], question: str, history: Sequence[dict[str, str]]) -> list[str]:
    """The plan's queries; when none has a content word ("any under $60?") and there is a
    previous user turn, that turn is searched instead (the filters stay this turn's)."""
    queries = [q for q in plan.get("search_queries", []) if isinstance(q, str)] or [question]
    if any(query_terms(q) for q in queries):
        return queries
    for turn in reversed(history):
        if turn["role"] == "user" and query_terms(turn["content"]):
            return [turn["content"][:80]]
    return queries


class Assistant:
    """The pipeline, as a library: construct from Triton's gRPC URL and a retriever."""

    def __init__(self, url: str, retriever: Retriever, *,
                 planner_model: str = AssistantSettings.planner_model,
                 answer_model: str = AssistantSettings.answer_model,
                 k: int = AssistantSettings.num_products,
                 max_tokens: int = AssistantSettings.answer_max_tokens,
                 answer_products: int = AssistantSettings.answer_products,
                 plan_timeout_s: float | None = None, metrics: AssistantMetrics | None = None,
                 prewarm: bool | None = None, admission: SloAdmission | None = None) -> None:
        """Defaults: rufus/assistant/settings.py; ``None``: from the environment
        (:class:`~rufus.assistant.settings.PipelineSettings`)."""
        self.url = url
        self.retriever = retriever
        self.search = GroundedSearch(retriever)
        # the served catalog's names (a retriever that cannot list them: the default data's),
        # and its listings by URL and model: what an earlier answer linked, a model's colours
        listed = list(retriever.iter_products()) if isinstance(retriever, ProductSource) else []
        self.names = CatalogNames.from_products(listed) if listed else CatalogNames.default()
        self.by_url = {p.url: p for p in listed}
        self.by_model: dict[str, list[Product]] = {}
        for p in listed:
            if p.model:
                self.by_model.setdefault(p.model, []).append(p)
        self.catalog_keys = frozenset(k for p in listed for k in p.attributes)
        self._catalog_names = False
        self.planner_model = planner_model
        self.answer_model = answer_model
        self.k = k
        if answer_products < 1:
            raise ValueError(f"answer_products must be at least 1, got {answer_products}")
        # the answer prompt lists the first answer_products of the k cards (prompt.py)
        self.answer_products = answer_products
        self.max_tokens = max_tokens
        if plan_timeout_s is None or prewarm is None or admission is None:
            env = PipelineSettings.from_env()  # RUFUS_ASSISTANT_*, typed
            plan_timeout_s = env.plan_timeout_s if plan_timeout_s is None else plan_timeout_s
            prewarm = env.prewarm if prewarm is None else prewarm
            admission = SloAdmission(env.admission) if admission is None else admission
        self.plan_timeout_s = plan_timeout_s
        self.metrics: AssistantMetrics = metrics or NullMetrics()
        # SLO-aware admission (rufus/serving/admission.py): RUFUS_ASSISTANT_SLO_S etc.
        self.admission = admission
        self.admission.on_estimate = self.metrics.estimate
        self.admission.on_error = self.metrics.estimate_error
        # follow-ups: prefill the answer prompt's known prefix while the planner runs
        self.prewarm = prewarm
        self._io: AsyncStreams | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def streams(self) -> AsyncStreams:
        """One gRPC client per event loop (an aio channel belongs to the loop it was made on)."""
        loop = asyncio.get_running_loop()
        if self._io is None or self._loop is not loop:
            self._io, self._loop = AsyncStreams(self.url), loop
        return self._io

    async def aclose(self) -> None:
        if self._io is not None:
            await self._io.close()
            self._io = None

    async def plan(self, question: str, history: list[dict[str, str]],
                   conversation: str | None = None, trace: dict[str, str] | None = None
                   ) -> tuple[dict[str, Any], bool, str]:
        """(plan, fallback, reason). A planner that fails or is slower than the timeout
        gives the fallback plan: the assistant still answers."""
        tensors: dict[str, Any] = {"question": question}
        if history:
            tensors["history"] = [{"role": m["role"],
                                   "content": clip(m["content"], PLANNER_HISTORY_CHARS.get(m["role"], 300))}
                                  for m in history]
        last: dict[str, Any] = {}
        try:
            async with asyncio.timeout(self.plan_timeout_s):
                # slo_ms: the planner's own admission (300 ms) gives way to this turn's,
                # which admitted it already; the time limit still bounds the plan
                async with contextlib.aclosing(self.streams().stream(
                        self.planner_model, tensors, conversation=conversation,
                        parameters={"slo_ms": min(max(1, round(self.plan_timeout_s * 1e3)),
                                               600_000)}, trace=trace)) as s:
                    async for outs in s:
                        last = outs
            plan = json.loads(output_str(last, "plan"))
            fallback = bool(last["fallback"].reshape(-1)[0]) if "fallback" in last else False
            reason = output_str(last, "fallback_reason")
        except (RequestFailed, TimeoutError, ValueError, KeyError) as exc:
            why = clip(str(exc), 200) if str(exc) else (
                f"no plan within {self.plan_timeout_s:g} s" if isinstance(exc, TimeoutError)
                else type(exc).__name__)
            log.warning("planner failed, using the fallback plan: %s", why)
            return fallback_plan(question), True, f"planner unavailable: {why}"
        if fallback:
            return fallback_plan(question), True, reason
        return with_stated_price_cap(plan, question), False, ""

    async def _prewarm(self, turns: list[dict[str, str]], conversation: str | None,
                       span: Any = None) -> None:
        """A one-token rufus_llm request for the answer prompt's prefix (system message and
        earlier turns), sent with the plan request. On a follow-up that prefix is most of
        the answer prompt and is not in vLLM's prefix cache yet; prefilled here, on the
        core the planner does not use, it is cached by the time the answer request comes,
        which then prefills only the products and the question. Best effort: any failure
        only means the answer request prefills it itself. Behind an ingress it pays only
        where the answer request lands on the same unit: the conversation key does that."""
        tensors = {"messages": answer_prefix_messages(turns), "stream": False,
                   "exclude_input_in_output": True,
                   "sampling_parameters": {"max_tokens": 1, "temperature": 0.0}}
        ps = _child(span, "prefill answer prefix")
        try:
            async with contextlib.aclosing(self.streams().stream(
                    self.answer_model, tensors, conversation=conversation,
                    trace=tracing.headers(ps))) as s:
                async for _ in s:
                    pass
            tracing.end(ps)
        except BaseException as exc:  # best effort by design, never the turn's failure
            tracing.end(ps, exc)
            if not isinstance(exc, Exception):
                raise
            log.debug("answer-prefix prefill failed (harmless): %s", exc)

    def _retrieve(self, plan: dict[str, Any], question: str,
                  history: list[dict[str, str]]) -> SearchOutcome:
        """The plan's search, grounded against the catalog (rufus.retrieval.grounding: a
        brand that is no catalog brand becomes a query word, the question's stated price
        wins, typos are corrected, empty results relax the filters); diversified top k."""
        if not self._catalog_names:  # once: the served catalog's brands (its vocabulary);
            # a new object, swapped in whole: renderers on the loop read the old one meanwhile
            names = CatalogNames(dict(self.names.phrases))
            names.add_brands(self.search.vocabulary.brands.values())
            self.names, self._catalog_names = names, True
        earlier = [t["content"][:MAX_QUERY_CHARS] for t in history if t["role"] == "user"]
        found = self.search.search(search_queries(plan, question, history),
                                   plan.get("filters"), question, 4 * self.k, earlier[-2:])
        return dataclasses.replace(found, products=diversify(found.products, self.k))

    def _by_reference(self, question: str, turns: list[dict[str, str]]
                      ) -> card_answers.CardAnswer | None:
        """A follow-up about the products the previous answer listed ("the first two", "the
        second one", "does it come in blue?"), answered from their cards; None otherwise."""
        urls = card_answers.previous_links(turns)
        if not urls or not self.by_url:
            return None
        at = card_answers.positions(question, len(urls))
        if not at and card_answers.refers_to_it(question) and not self.search.names_a_type(question):
            at = [0]
        products = [self.by_url[urls[i]] for i in at if urls[i] in self.by_url]
        if not products:
            return None
        return card_answers.plan(question, products, self.catalog_keys, by_reference=True)

    def _card_lines(self, card: card_answers.CardAnswer, question: str
                    ) -> tuple[list[str], list[Product], bool]:
        """The system-written lines of a card answer, the products they show, and whether
        the model must still pick (a "which" that no spec on the cards decides)."""
        if card.kind == "compare":
            lines = card_answers.render_table(card)
            decided = card_answers.decide(card, question) if card.which else None
            return lines + ([decided] if decided else []), card.products, card.which and not decided
        if card.kind in ("colour", "variant"):
            p = card.products[0]
            render = card_answers.render_colour if card.kind == "colour" else card_answers.render_variant
            lines = render(card, self.by_model.get(p.model, [p]))
            shown = [x for x in self.by_model.get(p.model, [p]) if x.url in lines[-1]] or [p]
            return lines, shown, False
        if card.kind == "details":
            return card_answers.render_details(card), card.products, False
        return card_answers.render_attribute(card), card.products, False

    def admit(self) -> Ticket:
        """Admission for a new turn (rufus/serving/admission.py): a ticket, or a retryable
        :class:`~rufus.errors.Unavailable` (counted) when its first answer text is estimated
        past the SLO. Before any work, so a refusal costs microseconds."""
        try:
            return self.admission.admit()
        except RufusError as exc:
            self.metrics.count(exc.outcome, "none")
            raise

    async def stream(self, question: str, history: list[dict[str, str]] | None = None,
                     conversation: str | None = None, ticket: Ticket | None = None,
                     span: Any = None) -> AsyncGenerator[AssistantEvent, None]:
        """One turn, as events. ``conversation``: the conversation key, passed on to the
        answer model's requests (prefill and answer) so that behind an ingress they land on
        the unit holding this conversation's prefix (rufus.client.CONVERSATION_HEADER). The
        plan request goes without it, to the least busy unit: the planner keeps no prefix
        cache across requests, so the key would only pile plans onto one unit (measured:
        docs/benchmarks-history.md, "Conversation affinity"). ``span``: the turn's span
        (rufus/telemetry/tracing.py); each stage becomes a child span of it, and the planner's
        and answer model's requests join the trace."""
        try:
            turns = validate_request(question, history)
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        if ticket is None:
            ticket = self.admit()
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        path, outcome = "none", "error"
        warm = asyncio.create_task(self._prewarm(turns, conversation, span)) \
            if turns and self.prewarm else None
        try:
            ps = _child(span, "plan", **{"gen_ai.request.model": self.planner_model})
            plan, fallback, reason = await self.plan(question, turns, trace=tracing.headers(ps))
            timings["plan_s"] = time.monotonic() - t0
            tracing.end(ps, **{"rufus.plan.intent": str(plan.get("intent", "")),
                               "rufus.plan.fallback": fallback,
                               "rufus.plan.fallback_reason": reason[:120] or None})
            yield AssistantEvent("plan", plan=plan, fallback=fallback, fallback_reason=reason)

            intent = plan.get("intent", "other")
            products: list[Product] = []
            found: SearchOutcome | None = None
            # "compare the first two", "does the second one come in blue?": the products the
            # previous answer listed, answered from their cards
            card = self._by_reference(question, turns)
            if card is None and intent == "other" and self.search.names_a_type(question):
                # a need the planner took for small talk ("keep an eye on the baby while she
                # naps"): the catalog has its product type, so it is searched
                intent = "product_search"
            if card is not None and card.kind == "picks":
                # "is the third one good for lattes?": the usual picks, over that product
                path, products, card = "products", card.products, None
            elif card is not None:
                path = "products"
            elif fallback or intent in PRODUCT_INTENTS:
                path = "products"
                t = time.monotonic()
                rs = _child(span, "retrieval")
                found = await asyncio.to_thread(self._retrieve, plan, question, turns)
                products = found.products
                timings["retrieval_s"] = time.monotonic() - t
                if rs is not None:
                    tracing.end(rs, **_search_attributes(found))
                named = card_answers.targets(question, found.products, found.models)
                card = card_answers.plan(question, named, self.catalog_keys) if named else None
            else:
                path = "service" if intent in SERVICE_REPLIES else "general"
            lines: list[str] = []
            model_picks = False  # a "which" the cards' specs do not decide: the model picks
            rd = _child(span, "render cards", **{"rufus.path": path})
            if card is not None:
                lines, products, model_picks = self._card_lines(card, question)
            timings["cards_s"] = time.monotonic() - t0
            shown = cards(products)
            tracing.end(rd, **{"rufus.cards": len(shown),
                               "rufus.card_answer": card.kind if card is not None else None})
            yield AssistantEvent("products", products=shown, path=path)

            finish = "service"
            if card is not None:
                finish = "stop"
                # system-written from the cards, each line out as soon as it is known
                for line in lines:
                    timings.setdefault("first_token_s", time.monotonic() - t0)
                    yield AssistantEvent("text", text=line)
                if model_picks:
                    # "which is better for flights, A or B?": the model picks one of them
                    # from a menu of their differences
                    menus = card_answers.difference_menus(card.products, question)
                    async with contextlib.aclosing(self._answer(
                            question, card.products, turns, False, t0, timings, conversation,
                            ["\nMy pick:"], ticket, menus=menus, max_picks=1,
                            span=span)) as answer:
                        async for ev in answer:
                            if ev.type == "done":
                                finish = ev.finish_reason
                            else:
                                yield ev
            elif path == "service" or (found is not None and not products):
                # system-written: a fixed reply, or what was searched and what the catalog has
                reply = SERVICE_REPLIES[intent] if path == "service" else \
                    self.search.no_results_reply(found, question)  # type: ignore[arg-type]
                timings["first_token_s"] = time.monotonic() - t0
                yield AssistantEvent("text", text=reply)
            else:
                finish = ""
                # aclosing: closing this generator must close the answer stream at once
                # (an unclosed async generator is only finalized by the garbage collector)
                met = ({p.id: card_answers.met_text(found.constraints, p)
                        for p in products[:self.answer_products]} if found is not None else {})
                said, met = card_answers.shared_met(met)
                notes = [*(found.notes if found else []), *([said] if said else [])]
                async with contextlib.aclosing(self._answer(
                        question, products, turns, path == "general", t0, timings,
                        conversation, notes, ticket, met=met, span=span)) as answer:
                    async for ev in answer:
                        if ev.type == "done":
                            finish = ev.finish_reason
                        else:
                            yield ev
            timings["total_s"] = time.monotonic() - t0
            outcome = "fallback" if fallback else "ok"
            yield AssistantEvent("done", finish_reason=finish, timings=dict(timings), path=path)
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            ticket.done()
            if warm is not None and not warm.done():
                warm.cancel()
            self.metrics.count(outcome, path)
            for stage, secs in timings.items():
                if stage.endswith("_s"):  # answer_tokens is a count, not a stage
                    self.metrics.observe(stage.removesuffix("_s"), secs)

    async def _answer(self, question: str, products: list[Product], turns: list[dict[str, str]],
                      general: bool, t0: float, timings: dict[str, float],
                      conversation: str | None = None, notes: Sequence[str] = (),
                      ticket: Ticket | None = None, menus: list[list[str]] | None = None,
                      max_picks: int = MAX_PICKS, met: dict[str, str] | None = None,
                      span: Any = None) -> AsyncGenerator[AssistantEvent, None]:
        """The answer model's stream, rendered. With products: picks under the answer
        grammar (rufus.assistant.answer), every fact rendered from the cards, the search's
        notes ahead of the first pick. Off-topic: the model's short reply, links removed."""
        products = products[:self.answer_products]  # [n] links only to what the model saw
        sampling: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": 0.0,
                                    "repetition_penalty": REPETITION_PENALTY}
        renderer: PickRenderer | LinkRenderer
        if general:
            renderer = LinkRenderer(products)
            sampling["max_tokens"] = min(self.max_tokens, GENERAL_MAX_TOKENS)
        else:
            options = reason_options(products, question) if menus is None else menus
            renderer = PickRenderer(products, self.names, options, on_drop=self.metrics.dropped,
                                    met=met)
            sampling["structured_outputs"] = {"grammar": answer_grammar(options, max_picks)}
        tensors = {
            "messages": answer_messages(question, products, turns, general=general, menus=menus),
            "stream": True, "exclude_input_in_output": True, "return_finish_reason": True,
            "return_num_output_tokens": True, "return_num_input_tokens": True,
            "sampling_parameters": sampling,
        }
        lead = "".join(f"{n}\n" for n in notes) + ("\n" if notes else "")
        sent = time.monotonic()
        finish = ""
        an = _child(span, "answer", **{"gen_ai.request.model": self.answer_model,
                                       "gen_ai.operation.name": "chat",
                                       "rufus.answer.general": general})
        render_s = 0.0
        try:
            # aclosing: closing this generator closes the answer model's stream at once
            async with contextlib.aclosing(self._answer_stream(
                    an, tensors, conversation, renderer, lead, timings, t0, sent,
                    ticket)) as inner:
                async for ev in inner:
                    if ev.type == "render":
                        render_s, finish = ev.seconds, ev.finish_reason
                    else:
                        yield ev
        except BaseException as exc:
            tracing.end(an, exc if not isinstance(exc, GeneratorExit) else None,
                        **{"rufus.cancelled": isinstance(exc, GeneratorExit
                                                         | asyncio.CancelledError) or None})
            raise
        tokens = int(timings.get("answer_tokens", 0))
        tracing.end(an, **{"gen_ai.usage.input_tokens": int(timings.get("answer_prompt_tokens", 0))
                           or None, "gen_ai.usage.output_tokens": tokens,
                           "gen_ai.response.finish_reasons": [finish or "stop"],
                           "rufus.render_ms": round(render_s * 1e3, 3)})
        yield AssistantEvent("done", finish_reason=finish or "stop")

    async def _answer_stream(self, an: Any, tensors: dict[str, Any], conversation: str | None,
                             renderer: PickRenderer | LinkRenderer, lead: str,
                             timings: dict[str, Any], t0: float, sent: float,
                             ticket: Ticket | None) -> AsyncGenerator[AssistantEvent, None]:
        """The answer model's stream through the renderer (``an``: the answer's span, which
        the request to the answer model joins). Ends with a ``render`` event: the seconds
        spent rendering, and the answer model's finish reason."""
        finish = ""
        tokens = 0
        render_s = 0.0
        async with contextlib.aclosing(self.streams().stream(
                self.answer_model, tensors, conversation=conversation,
                trace=tracing.headers(an))) as s:
            async for outs in s:
                delta = output_str(outs, "text_output")
                finish = output_str(outs, "finish_reason") or finish
                if "num_output_tokens" in outs:
                    tokens += int(np.asarray(outs["num_output_tokens"]).reshape(-1).sum())
                if "num_input_tokens" in outs:
                    timings["answer_prompt_tokens"] = float(
                        np.asarray(outs["num_input_tokens"]).reshape(-1)[0])
                if delta and "answer_ttft_s" not in timings:
                    timings["answer_ttft_s"] = time.monotonic() - sent
                    if an is not None:
                        an.add_event("first_token")
                r0 = time.perf_counter()
                text = renderer.feed(delta)
                render_s += time.perf_counter() - r0
                if text:
                    timings.setdefault("first_token_s", time.monotonic() - t0)
                    if ticket is not None:
                        ticket.first_token()  # what the admission estimate learns from
                    yield AssistantEvent("text", text=lead + text)
                    lead = ""
        tail = renderer.flush()
        if tail or lead:
            timings.setdefault("first_token_s", time.monotonic() - t0)
            yield AssistantEvent("text", text=lead + tail)
        timings["answer_tokens"] = float(tokens)
        yield AssistantEvent("render", finish_reason=finish, seconds=render_s)


def _child(span: Any, name: str, **attributes: Any) -> Any:
    """A child span of the turn's span, None without one (tracing off: nothing is made)."""
    if span is None:
        return None
    return tracing.start_span(name, span, attributes=attributes)


def turn_span(name: str, parent: Any, model: str, history_turns: int, arrival: float,
              admitted: tuple[float, float], ticket: Ticket, kind: str = "internal") -> Any:
    """One assistant turn's span (from ``arrival``, monotonic) with its admission as the first
    child: the estimate and the queue it was made from (``admitted``: its start and end).
    The Triton model's and the OpenAI frontend's turns are made here alike."""
    span = tracing.start_span(name, parent, kind, {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "rufus.history_turns": history_turns}, start_ns=tracing.mono_to_ns(arrival))
    tracing.child_span(span, "admission", tracing.mono_to_ns(admitted[0]),
                       tracing.mono_to_ns(admitted[1]),
                       **{"rufus.admission.estimate_s": round(ticket.estimate_s, 4),
                          "rufus.admission.waiting": int(ticket.x[1]),
                          "rufus.admission.answering": int(ticket.x[2]),
                          "rufus.admission.decision": "admitted"})
    return span


def _search_attributes(found: SearchOutcome) -> dict[str, Any]:
    """What retrieval did, without customer text: counts, filter and product-type names."""
    f = found.filters
    applied = [k for k, v in (("brand", f.brand), ("max_price", f.max_price),
                              ("min_price", f.min_price), ("categories", f.categories),
                              ("models", f.models)) if v]
    return {"rufus.search.queries": len(found.queries),
            "rufus.search.hits": len(found.products),
            "rufus.search.filters": applied,
            "rufus.search.relaxed": list(found.relaxed),
            "rufus.search.corrected": len(found.corrected),
            "rufus.search.categories": list(found.categories)[:8],
            "rufus.search.constraints_met": len(found.constraints),
            "rufus.search.constraints_dropped": len(found.dropped)}
