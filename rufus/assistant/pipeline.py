"""The shopping assistant: question -> plan -> product retrieval -> streamed, grounded answer.

    assistant = Assistant("127.0.0.1:8001", default_retriever())
    async with contextlib.aclosing(assistant.stream("running shoes under $80")) as events:
        async for ev in events:
            ...   # plan, products (cards), text deltas, done

Events (rufus/assistant/turn_events.py), always in this order: one :class:`PlanEvent` (the
planner's plan and its ``fallback`` flag), one :class:`ProductsEvent` (product cards; empty
for intents that need no search), any number of :class:`TextEvent` (answer deltas, links
already rendered), one :class:`DoneEvent` (``finish_reason``, ``timings`` in seconds).
Bad input raises :class:`rufus.errors.InvalidInput` naming the field before any model is
called. Stopping early (closing the generator, or cancelling the task that iterates it)
cancels the planner / answer gRPC streams at once; Triton then marks those requests
cancelled and the models abort them in their engines (polled every 0.25 s).

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
import re
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rufus.assistant import answer_stream, card_answers
from rufus.assistant.answer import CatalogNames
from rufus.assistant.prompt import (
    SERVICE_REPLIES,
    answer_prefix_messages,
    cards,
    clip,
    diversify,
    price_cap,
)
from rufus.assistant.settings import AssistantSettings, PipelineSettings

# the turn's events, metrics sink and spans: named here too, where callers import them from
from rufus.assistant.turn_events import AssistantEvent as AssistantEvent
from rufus.assistant.turn_events import AssistantMetrics as AssistantMetrics
from rufus.assistant.turn_events import DoneEvent as DoneEvent
from rufus.assistant.turn_events import NullMetrics as NullMetrics
from rufus.assistant.turn_events import PlanEvent as PlanEvent
from rufus.assistant.turn_events import ProductsEvent as ProductsEvent
from rufus.assistant.turn_events import (
    ReplyEnd,
    TurnOutcome,
    TurnPath,
    child,
    search_attributes,
)
from rufus.assistant.turn_events import TextEvent as TextEvent
from rufus.assistant.turn_events import turn_span as turn_span
from rufus.client import AsyncStreams, RequestFailed, output_str
from rufus.errors import RufusError
from rufus.qp.plan import Plan, as_plan
from rufus.qp.plan import fallback_plan as planner_fallback
from rufus.retrieval.base import MAX_QUERY_CHARS, ProductSource, Retriever, query_terms
from rufus.retrieval.catalog import Product
from rufus.retrieval.search import GroundedSearch, SearchOutcome
from rufus.serving.admission import SloAdmission, Ticket
from rufus.serving.validation import check_history, check_question
from rufus.telemetry import tracing

log = logging.getLogger("rufus.assistant")

# what an order or a return question says; a service intent without any of it is the planner's
# slip when the question names a product
_SERVICE_WORDS = re.compile(r"\b(?:orders?|ordered|packages?|parcels?|deliver\w*|ship\w*|track\w*|"
                            r"arriv\w*|return\w*|refund\w*|exchang\w*|cancel\w*|receipt|"
                            r"purchase[ds]?|bought|money back)\b")
PRODUCT_INTENTS = frozenset({"product_search", "product_comparison", "product_question",
                             "recommendation"})
# What of each earlier turn the planner sees. Its training turns are short (data/qp/
# train.jsonl): a whole answer is out of distribution (its product names leak into the
# search queries) and every character of prompt costs plan time on the critical path
# (docs/benchmarks-history.md, "Shopping assistant").
PLANNER_HISTORY_CHARS = {"user": 300, "assistant": 80}


def validate_request(question: Any, history: Any) -> list[dict[str, str]]:
    """Check question and history with the planner's own bounds (a valid assistant request
    is a valid planner request); returns the history as clean {role, content} turns."""
    check_question(question)
    return check_history(history)


def fallback_plan(question: str) -> Plan:
    """The planner's documented fallback (rufus.qp.plan: the question passed through), plus
    a price cap read from the question, so "running shoes under $80" still gets its filter."""
    cap = price_cap(question)
    plan = planner_fallback(question)
    if cap is not None:
        plan["filters"] = {"max_price": cap}
    return plan


def with_stated_price_cap(plan: Plan, question: str) -> Plan:
    """A price cap the customer states in this question ("under $50") is a hard constraint:
    added when the planner left it out (measured: the planner sometimes drops it)."""
    cap = price_cap(question)
    filters = plan["filters"]
    if cap is None or "max_price" in filters or plan["intent"] not in PRODUCT_INTENTS:
        return plan
    return {**plan, "filters": {**filters, "max_price": cap}}


def search_queries(plan: Plan, question: str, history: Sequence[dict[str, str]]) -> list[str]:
    """The plan's queries; when none has a content word ("any under $60?") and there is a
    previous user turn, that turn is searched instead (the filters stay this turn's)."""
    queries = [q for q in plan["search_queries"] if isinstance(q, str)] or [question]
    if any(query_terms(q) for q in queries):
        return queries
    for turn in reversed(history):
        if turn["role"] == "user" and query_terms(turn["content"]):
            return [turn["content"][:80]]
    return queries


@dataclass
class _Turn:
    """One turn's state as its steps fill it in. The path is kept the moment it is chosen,
    so that a turn failing later (in retrieval, say) is still counted under it."""

    question: str
    turns: list[dict[str, str]]
    conversation: str | None
    ticket: Ticket
    span: Any
    t0: float
    timings: dict[str, float] = field(default_factory=dict)
    path: TurnPath = "none"
    intent: Any = "other"
    products: list[Product] = field(default_factory=list)
    found: SearchOutcome | None = None
    card: card_answers.CardAnswer | None = None


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
                   ) -> tuple[Plan, bool, str]:
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
            plan = as_plan(json.loads(output_str(last, "plan")))
            if plan is None:
                raise ValueError("the planner's plan does not satisfy plan_schema.json")
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
        ps = child(span, "prefill answer prefix")
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

    def _retrieve(self, plan: Plan, question: str,
                  history: list[dict[str, str]]) -> SearchOutcome:
        """The plan's search, grounded against the catalog (rufus.retrieval.search: a
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
        and answer model's requests join the trace. Its steps: admission, plan, route (with
        the search), cards, reply; :meth:`_settle` counts the turn however it ended."""
        turns, ticket = self._admit_turn(question, history, ticket)
        turn = _Turn(question, turns, conversation, ticket, span, time.monotonic())
        outcome: TurnOutcome = "error"
        warm = asyncio.create_task(self._prewarm(turns, conversation, span)) \
            if turns and self.prewarm else None
        try:
            plan, fallback, reason = await self._plan_step(turn)
            yield PlanEvent(plan, fallback, reason)
            await self._route(turn, plan, fallback)
            shown, lines, model_picks = self._render_cards(turn)
            yield ProductsEvent(shown, turn.path)
            finish = ""
            async with contextlib.aclosing(self._reply(turn, lines, model_picks)) as reply:
                async for ev in reply:
                    match ev:
                        case ReplyEnd():
                            finish = ev.finish_reason
                        case TextEvent():
                            yield ev
            turn.timings["total_s"] = time.monotonic() - turn.t0
            outcome = "fallback" if fallback else "ok"
            yield DoneEvent(finish, dict(turn.timings), turn.path)
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            self._settle(turn, outcome, warm)

    def _admit_turn(self, question: Any, history: Any, ticket: Ticket | None
                    ) -> tuple[list[dict[str, str]], Ticket]:
        """The turn's checked history and its ticket: bad input is refused before admission
        (and hands back a ticket it came with), a turn past the SLO before any model call."""
        try:
            turns = validate_request(question, history)
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        return turns, self.admit() if ticket is None else ticket

    async def _plan_step(self, turn: _Turn) -> tuple[Plan, bool, str]:
        """The plan under its span, timed from the turn's start (:meth:`plan`)."""
        ps = child(turn.span, "plan", **{"gen_ai.request.model": self.planner_model})
        plan, fallback, reason = await self.plan(turn.question, turn.turns,
                                                 trace=tracing.headers(ps))
        turn.timings["plan_s"] = time.monotonic() - turn.t0
        tracing.end(ps, **{"rufus.plan.intent": plan["intent"],
                           "rufus.plan.fallback": fallback,
                           "rufus.plan.fallback_reason": reason[:120] or None})
        return plan, fallback, reason

    async def _route(self, turn: _Turn, plan: Plan, fallback: bool) -> None:
        """The turn's path, and what it answers over: the products an earlier answer listed,
        a search's, or none (a fixed reply, a general answer)."""
        question = turn.question
        turn.intent = plan["intent"]
        # "compare the first two", "does the second one come in blue?": the products the
        # previous answer listed, answered from their cards
        card = self._by_reference(question, turn.turns)
        if card is None and turn.intent == "other" and self.search.names_a_type(question):
            # a need the planner took for small talk ("keep an eye on the baby while she
            # naps"): the catalog has its product type, so it is searched
            turn.intent = "product_search"
        if card is None and turn.intent in SERVICE_REPLIES and not _SERVICE_WORDS.search(
                question.lower()) and self.search.names_a_type(question):
            # "can you set the temperature on the stagg ekg" taken for an order question: no
            # word of an order or a return in it, and it names a product of the catalog
            turn.intent = "product_question"
        if card is not None and card.kind == "picks":
            # "is the third one good for lattes?": the usual picks, over that product
            turn.path, turn.products = "products", card.products
        elif card is not None:
            turn.path, turn.card = "products", card
        elif fallback or turn.intent in PRODUCT_INTENTS:
            turn.path = "products"
            await self._search_step(turn, plan)
        else:
            turn.path = "service" if turn.intent in SERVICE_REPLIES else "general"

    async def _search_step(self, turn: _Turn, plan: Plan) -> None:
        """The plan's search, off the event loop and under its span; then the card answer
        for a question about products it found by name (None: the usual picks)."""
        t = time.monotonic()
        rs = child(turn.span, "retrieval")
        found = await asyncio.to_thread(self._retrieve, plan, turn.question, turn.turns)
        turn.found, turn.products = found, found.products
        turn.timings["retrieval_s"] = time.monotonic() - t
        if rs is not None:
            tracing.end(rs, **search_attributes(found))
        named = card_answers.targets(turn.question, found.products, found.models)
        turn.card = card_answers.plan(turn.question, named, self.catalog_keys) if named else None

    def _render_cards(self, turn: _Turn) -> tuple[list[dict[str, Any]], list[str], bool]:
        """The product cards to show and a card answer's system-written lines, under their
        span; True: a "which" the cards' specs do not decide, so the model picks."""
        lines: list[str] = []
        model_picks = False
        rd = child(turn.span, "render cards", **{"rufus.path": turn.path})
        if turn.card is not None:
            lines, turn.products, model_picks = self._card_lines(turn.card, turn.question)
        turn.timings["cards_s"] = time.monotonic() - turn.t0
        shown = cards(turn.products)
        tracing.end(rd, **{"rufus.cards": len(shown),
                           "rufus.card_answer": turn.card.kind if turn.card is not None else None})
        return shown, lines, model_picks

    async def _reply(self, turn: _Turn, lines: list[str], model_picks: bool
                     ) -> AsyncGenerator[TextEvent | ReplyEnd, None]:
        """The answer's text events, then one :class:`ReplyEnd` with its finish reason: a card
        answer (each line out as soon as it is known; then the model's pick, where it must
        pick), a system-written reply, or the answer model's answer."""
        card = turn.card
        answer: AsyncGenerator[TextEvent | ReplyEnd, None]
        if card is not None:
            # system-written from the cards, each line out as soon as it is known
            for line in lines:
                turn.timings.setdefault("first_token_s", time.monotonic() - turn.t0)
                yield TextEvent(line)
            if not model_picks:
                yield ReplyEnd("stop")
                return
            # "which is better for flights, A or B?": the model picks one of them from a
            # menu of their differences
            menus = card_answers.difference_menus(card.products, turn.question)
            answer = answer_stream.answer(
                self, turn.question, card.products, turn.turns, False, turn.t0, turn.timings,
                turn.conversation, ["\nMy pick:"], turn.ticket, menus=menus, max_picks=1,
                span=turn.span)
        elif (reply := self._system_reply(turn)) is not None:
            # system-written: a fixed reply, or what was searched and what the catalog has
            turn.timings["first_token_s"] = time.monotonic() - turn.t0
            yield TextEvent(reply)
            yield ReplyEnd("service")
            return
        else:
            answer = self._model_answer(turn)
        # aclosing: closing this generator must close the answer stream at once
        # (an unclosed async generator is only finalized by the garbage collector)
        async with contextlib.aclosing(answer) as events:
            async for ev in events:
                yield ev

    def _system_reply(self, turn: _Turn) -> str | None:
        """A reply the system writes, no model: a service intent's fixed one, or, when the
        search found nothing, what was searched and what the catalog has. None: the model's."""
        if turn.path == "service":
            return SERVICE_REPLIES[turn.intent]
        if turn.found is not None and not turn.products:
            return self.search.no_results_reply(turn.found, turn.question)
        return None

    def _model_answer(self, turn: _Turn) -> AsyncGenerator[TextEvent | ReplyEnd, None]:
        """The answer model's stream over the turn's products (none: off-topic), with the
        search's notes and, said once where all share it, what each product meets."""
        found = turn.found
        met = ({p.id: card_answers.met_text(found.constraints, p)
                for p in turn.products[:self.answer_products]} if found is not None else {})
        said, met = card_answers.shared_met(met)
        notes = [*(found.notes if found else []), *([said] if said else [])]
        return answer_stream.answer(
            self, turn.question, turn.products, turn.turns, turn.path == "general", turn.t0,
            turn.timings, turn.conversation, notes, turn.ticket, met=met, span=turn.span)

    def _settle(self, turn: _Turn, outcome: TurnOutcome, warm: asyncio.Task[None] | None) -> None:
        """A turn's end, whatever ended it: its ticket back, the prefill stopped, its outcome
        (under the path it reached) and stage seconds counted."""
        turn.ticket.done()
        if warm is not None and not warm.done():
            warm.cancel()
        self.metrics.count(outcome, turn.path)
        for stage, secs in turn.timings.items():
            if stage.endswith("_s"):  # answer_tokens is a count, not a stage
                self.metrics.observe(stage.removesuffix("_s"), secs)
