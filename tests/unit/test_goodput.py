"""Open-loop goodput benchmark (lab/goodput.py) against fake targets, no server.

Everything runs on a virtual-time event loop: a sleep advances the clock instead of waiting,
so a 60 s sweep takes milliseconds and every latency below is exact."""

from __future__ import annotations

import asyncio
import itertools
import json
import selectors
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from lab import goodput as gp
from lab.goodput import Outcome, RequestResult


class _VirtualSelector(selectors.BaseSelector):
    """Nothing is ever ready: a wait of ``timeout`` moves the loop's clock on by it."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        self.keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self.keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("virtual loop idle with nothing scheduled: deadlock")
        self.loop.now += max(timeout, 0.0)
        return []

    def get_map(self) -> Any:
        return self.keys


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (only pure-asyncio code: no I/O, no threads)."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self.now


def run(coro: Awaitable[Any]) -> Any:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def fake(latency: Callable[[str], float] | float, event: str = "answer",
         capacity: int | None = None, refusal_s: float = 0.01) -> Callable[[str], Awaitable[Outcome]]:
    """A target answering after ``latency`` seconds; with ``capacity``, one that refuses
    (UNAVAILABLE, retryable, after ``refusal_s``) while that many are in flight."""
    inflight = 0

    async def target(question: str) -> Outcome:
        nonlocal inflight
        loop = asyncio.get_running_loop()
        if capacity is not None and inflight >= capacity:
            await asyncio.sleep(refusal_s)
            return Outcome(events={"error": loop.time()}, error_code="UNAVAILABLE",
                           error="server at capacity", retryable=True)
        inflight += 1
        try:
            await asyncio.sleep(latency(question) if callable(latency) else latency)
            return Outcome(events={event: loop.time()}, responded=True)
        finally:
            inflight -= 1

    return target


def rate_run(target: Callable[[str], Awaitable[Outcome]], rate: float, duration: float,
             seed: int = 0, drain: float = 60.0) -> list[RequestResult]:
    return run(gp.run_rate(target, gp.question_cycle(["q1", "q2", "q3"], seed), rate,
                           duration, event="answer", seed=seed, drain_s=drain))


def row(rate: float, share: float) -> dict[str, Any]:
    return {"offered_rate": rate, "share_within_slo": share}


# --- schedule and questions ------------------------------------------------------------

def test_poisson_schedule_reproducible_by_seed_and_near_the_rate() -> None:
    a = gp.poisson_schedule(2.0, 3000.0, seed=7)
    assert a == gp.poisson_schedule(2.0, 3000.0, seed=7)
    assert a != gp.poisson_schedule(2.0, 3000.0, seed=8)
    assert a == sorted(a) and 0 <= a[0] and a[-1] < 3000.0
    assert len(a) / 3000.0 == pytest.approx(2.0, rel=0.05)  # 6000 expected, sd ~77
    gaps = [b - x for x, b in itertools.pairwise(a)]
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.05)
    # exponential gaps: the standard deviation equals the mean (a fixed pace would be 0)
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.1)
    assert gp.poisson_schedule(0.0, 10.0, 1) == [] and gp.poisson_schedule(1.0, 0.0, 1) == []


def test_questions_are_the_single_turn_product_questions_in_a_seeded_cycle() -> None:
    qs = gp.load_questions()
    rows = [json.loads(x) for x in gp.QUESTIONS_PATH.read_text().splitlines() if x.strip()]
    expected = [r["question"] for r in rows
                if r["intent"] in gp.PRODUCT_INTENTS and not r.get("history")]
    assert qs == expected and len(set(qs)) == len(qs) > 100
    # the default holds every held-out single-turn product question of the planner's set
    assert set(gp.load_questions(gp.EVAL_PATH)) <= set(qs)
    cyc = gp.question_cycle(qs, seed=3)
    first = [next(cyc) for _ in range(len(qs))]
    assert sorted(first) == sorted(qs) and first != qs       # each once, shuffled
    assert [next(cyc) for _ in range(5)] == first[:5]         # then the same order again
    again = gp.question_cycle(qs, seed=3)
    assert [next(again) for _ in range(10)] == first[:10]


# --- runs on the virtual clock -------------------------------------------------------------

def test_open_loop_starts_every_arrival_on_time_and_measures_from_the_schedule() -> None:
    res = rate_run(fake(0.2), rate=5.0, duration=60.0, seed=1)
    assert [r.scheduled for r in res] == gp.poisson_schedule(5.0, 60.0, 1)
    # a fixed 0.2 s service with no queue in the fake: every latency exact, no lag
    assert all(r.ok and r.latency == pytest.approx(0.2) and r.lag == pytest.approx(0.0)
               for r in res)
    s = gp.summarize(res, 5.0, 60.0, slo_s=0.3)
    assert s["arrivals"] == len(res) and s["achieved_rate"] == pytest.approx(len(res) / 60.0)
    assert s["completed"] == len(res) and s["share_within_slo"] == 1.0
    assert s["goodput"] == pytest.approx(len(res) / 60.0)
    assert s["p50_s"] == pytest.approx(0.2) and s["p99_s"] == pytest.approx(0.2)
    assert s["refused"] == 0 and s["errors"] == 0 and s["over_2x_slo"] == 0


def test_in_flight_requests_do_not_hold_back_arrivals() -> None:
    """Open loop: a 30 s service does not delay the next arrivals (a closed loop would)."""
    res = rate_run(fake(30.0), rate=2.0, duration=20.0, seed=2)
    assert len(res) == len(gp.poisson_schedule(2.0, 20.0, 2)) > 20
    assert all(r.ok and r.latency == pytest.approx(30.0) and r.lag == pytest.approx(0.0)
               for r in res)


def test_latency_stats_share_and_goodput_math() -> None:
    lat = {"q1": 0.1, "q2": 0.5, "q3": 2.5}   # within, within, over 2x a 1 s SLO
    res = rate_run(fake(lambda q: lat[q]), rate=1.0, duration=300.0, seed=4)
    s = gp.summarize(res, 1.0, 300.0, slo_s=1.0)
    n = {q: sum(r.question == q for r in res) for q in lat}
    assert s["arrivals"] == len(res) == sum(n.values())
    assert s["within_slo"] == n["q1"] + n["q2"]
    assert s["share_within_slo"] == pytest.approx((n["q1"] + n["q2"]) / len(res))
    assert s["goodput"] == pytest.approx((n["q1"] + n["q2"]) / 300.0)
    assert s["over_2x_slo"] == n["q3"]
    assert s["p50_s"] == pytest.approx(0.5) and s["p99_s"] == pytest.approx(2.5)
    assert s["max_s"] == pytest.approx(2.5)


def test_summarize_on_hand_made_results() -> None:
    res = [RequestResult(0.0, latency=0.2, ok=True), RequestResult(1.0, latency=0.4, ok=True),
           RequestResult(2.0, latency=3.0, ok=True),
           RequestResult(3.0, error_code="UNAVAILABLE", refused=True, refusal_latency=0.05),
           RequestResult(4.0, error_code="INTERNAL"), RequestResult(5.0, error_code=gp.LATE)]
    s = gp.summarize(res, 1.0, 10.0, slo_s=0.5)
    assert s["arrivals"] == 6 and s["completed"] == 3 and s["within_slo"] == 2
    assert s["share_within_slo"] == pytest.approx(2 / 6) and s["goodput"] == pytest.approx(0.2)
    assert s["refused"] == 1 and s["refusal_p99_s"] == pytest.approx(0.05)
    assert s["errors"] == 2 and s["error_codes"] == {"INTERNAL": 1, gp.LATE: 1}
    assert s["late"] == 1 and s["over_2x_slo"] == 1
    assert s["p50_s"] == pytest.approx(0.4)
    empty = gp.summarize([], 1.0, 10.0, slo_s=0.5)
    assert empty["arrivals"] == 0 and empty["share_within_slo"] != empty["share_within_slo"]


def test_refused_requests_are_counted_as_refused_and_not_within_slo() -> None:
    # one slot, 1 s service at 3/s offered: most arrivals find it busy and are refused fast
    res = rate_run(fake(1.0, capacity=1, refusal_s=0.01), rate=3.0, duration=100.0, seed=5)
    refused = [r for r in res if r.refused]
    assert refused and all(r.error_code == "UNAVAILABLE" and not r.ok for r in refused)
    assert all(r.refusal_latency == pytest.approx(0.01) for r in refused)
    s = gp.summarize(res, 3.0, 100.0, slo_s=2.0)
    assert s["refused"] == len(refused) and s["errors"] == 0
    assert s["within_slo"] == s["completed"] == len(res) - len(refused)
    assert s["share_within_slo"] == pytest.approx(s["completed"] / len(res))
    assert s["share_within_slo"] < 0.5
    assert s["refusal_p99_s"] == pytest.approx(0.01)
    # the accepted ones ran unqueued: their latency is the service time
    assert s["p99_s"] == pytest.approx(1.0)


def test_an_error_after_a_response_is_not_a_refusal() -> None:
    async def target(q: str) -> Outcome:
        await asyncio.sleep(0.5)
        return Outcome(events={"cards": asyncio.get_running_loop().time(), "error": 0.0},
                       error_code="UNAVAILABLE", retryable=True, responded=True)

    res = rate_run(target, rate=1.0, duration=10.0)
    assert res and all(not r.refused and not r.ok and r.error_code == "UNAVAILABLE" for r in res)
    assert gp.summarize(res, 1.0, 10.0, 1.0)["errors"] == len(res)


def test_missing_event_and_exceptions_are_failures_not_crashes() -> None:
    async def no_event(q: str) -> Outcome:
        return Outcome(events={"done": asyncio.get_running_loop().time()})

    async def boom(q: str) -> Outcome:
        raise ConnectionError("gone")

    assert all(r.error_code == gp.NO_EVENT for r in rate_run(no_event, 1.0, 10.0))
    res = rate_run(boom, 1.0, 10.0)
    assert res and all(r.error_code == "ConnectionError" and not r.refused for r in res)


def test_requests_unfinished_at_the_drain_bound_are_late() -> None:
    res = rate_run(fake(lambda q: 1000.0 if q == "q2" else 0.1), rate=1.0, duration=30.0,
                   drain=60.0)
    late = [r for r in res if r.error_code == gp.LATE]
    assert late and all(r.question == "q2" and not r.ok for r in late)
    s = gp.summarize(res, 1.0, 30.0, slo_s=1.0)
    assert s["late"] == len(late) and s["within_slo"] == len(res) - len(late)


def test_a_slow_target_makes_goodput_collapse() -> None:
    """A single-server queue with 0.5 s service: under capacity (2/s) nearly everything is
    within a 1 s SLO; beyond it the queue grows without bound and goodput falls towards 0
    while the offered rate keeps rising."""
    def queue(service: float) -> Callable[[str], Awaitable[Outcome]]:
        lock = asyncio.Lock()

        async def target(q: str) -> Outcome:
            async with lock:
                await asyncio.sleep(service)
            return Outcome(events={"answer": asyncio.get_running_loop().time()}, responded=True)

        return target

    rows = []
    for rate in (0.5, 1.0, 4.0):
        res = rate_run(queue(0.5), rate, duration=120.0, seed=6, drain=600.0)
        rows.append(gp.summarize(res, rate, 120.0, slo_s=1.0))
    low, mid, over = rows
    assert low["share_within_slo"] > 0.95 and low["goodput"] == pytest.approx(0.5, rel=0.2)
    assert mid["share_within_slo"] > 0.7
    assert over["share_within_slo"] < 0.05 and over["goodput"] < 0.2
    assert over["p99_s"] > 100 and over["over_2x_slo"] > 0.9 * over["arrivals"]
    assert gp.capacity_at_slo(rows, 0.95) == 0.5


def test_sweep_runs_every_rate_with_the_target_opened_once() -> None:
    class Fake:
        name, event, default_slo_s = "fake", "plan", 0.3

        def __init__(self) -> None:
            self.opened = self.closed = 0
            self.calls = 0
            self.inner = fake(0.1, event="plan")

        async def open(self) -> None:
            self.opened += 1

        async def close(self) -> None:
            self.closed += 1

        async def __call__(self, q: str) -> Outcome:
            self.calls += 1
            return await self.inner(q)

    t = Fake()
    seen: list[float] = []
    rows, raw = run(gp.sweep(t, ["a", "b"], [1.0, 2.0], 30.0, seed=9, warmup=2, gap_s=2.0,
                             on_row=lambda r: seen.append(r["offered_rate"])))
    assert t.opened == t.closed == 1 and seen == [1.0, 2.0]
    assert [r["slo_s"] for r in rows] == [0.3, 0.3] and set(raw) == {"1", "2"}
    assert t.calls == 2 + sum(r["arrivals"] for r in rows)
    assert all(r["share_within_slo"] == 1.0 for r in rows)
    assert json.dumps([gp.result_dict(x) for x in raw["1"]])  # JSON-able (nan -> null)


def test_a_sweep_asks_each_question_once_before_any_repeats() -> None:
    """Warm-up and rates take one cycle: a second rate does not replay the first one's
    questions (a replay finds them cached), and every repeat is counted."""
    qs = [f"q{i}" for i in range(40)]
    asked: list[str] = []
    target = fake(0.1, event="plan")

    class Fake:
        name, event, default_slo_s = "fake", "plan", 0.3

        async def open(self) -> None: ...

        async def close(self) -> None: ...

        async def __call__(self, q: str) -> Outcome:
            asked.append(q)
            return await target(q)

    rows, raw = run(gp.sweep(Fake(), qs, [1.0, 1.0], 15.0, seed=4, warmup=3))
    n = 3 + sum(r["arrivals"] for r in rows)
    assert 15 < n - 3 < 40  # both windows fit in one cycle
    assert len(set(asked)) == len(asked) == n  # nothing asked twice
    assert [r["repeats"] for r in rows] == [0, 0]
    rows, raw = run(gp.sweep(Fake(), qs[:10], [2.0], 15.0, seed=4, warmup=2))
    res = raw["2"]
    # 10 questions: the 2 warm-up ones and the window's first 8 are new, the rest repeats
    assert [x.repeat for x in res[:8]] == [False] * 8 and all(x.repeat for x in res[8:])
    assert rows[0]["repeats"] == len(res) - 8 > 0
    assert gp.rate_key({"2": [], "2#2": []}, 2.0) == "2#3" and gp.rate_key({}, 1.5) == "1.5"


# --- capacity ------------------------------------------------------------------------------

def test_capacity_at_slo() -> None:
    assert gp.capacity_at_slo([row(0.5, 1.0), row(1, 0.995), row(2, 0.97), row(3, 0.4)]) == 1
    assert gp.capacity_at_slo([row(3, 0.4), row(1, 1.0), row(2, 0.99)]) == 2   # any order
    assert gp.capacity_at_slo([row(1, 0.9), row(2, 0.5)]) is None
    assert gp.capacity_at_slo([row(1, 1.0), row(2, 1.0)]) == 2
    assert gp.capacity_at_slo([]) is None
    # non-monotone: the first failing rate ends it, a higher rate passing again is ignored
    assert gp.capacity_at_slo([row(1, 1.0), row(2, 0.9), row(3, 1.0)]) == 1
    assert gp.capacity_at_slo([row(1, 1.0), row(2, float("nan"))]) == 1
    assert gp.capacity_at_slo([row(1, 0.96), row(2, 0.9)], min_share=0.95) == 1


# --- the OpenAI stream's product list ---------------------------------------------------------

def test_card_splitter_finds_the_answer_after_the_product_list() -> None:
    from rufus.frontend.assistant_hook import card_markdown

    cards = card_markdown([{"title": "Earbuds [X]", "url": "https://e/1", "brand": "Sony",
                            "price": 39.0, "rating": 4.4},
                           {"title": "Buds", "url": "https://e/2"}])
    assert cards.endswith("\n\n")
    for expected in (True, None):
        s = gp.CardSplitter()
        s.expected = expected
        assert s.feed(cards) is False
        assert s.feed("The") is True and s.feed(" best") is True
    s = gp.CardSplitter()                 # the list split over two deltas
    assert s.feed(cards[:10]) is False and s.feed(cards[10:]) is False and s.feed("A") is True
    s = gp.CardSplitter()                 # list and answer in one delta
    assert s.feed(cards + "Pick 1") is True
    s = gp.CardSplitter()                 # no products: the first content is the answer
    s.expected = False
    assert s.feed("Sorry, nothing under $5.") is True
    assert gp.CardSplitter().feed("I could not find that.") is True


def test_openai_target_parses_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SSE stream as the frontend writes it (role chunk with ``x_rufus_products``, the
    list, answer deltas, [DONE]), through httpx's mock transport on the real loop."""
    import httpx

    from rufus.frontend.assistant_hook import card_markdown
    from rufus.frontend.render import ChunkWriter

    prods = [{"title": "Buds", "url": "https://e/2", "price": 20.0}]
    w = ChunkWriter("chat", "rufus-assistant", False)
    sse = (w.role(0, {"x_rufus_products": prods}) + w.delta(0, card_markdown(prods), None)
           + w.delta(0, "Try", None) + w.delta(0, " these", None) + w.delta(0, "", "stop")
           + w.done())

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/v1/chat/completions" and body["stream"] is True
        if body["messages"][0]["content"] == "busy":
            return httpx.Response(503, json={"error": {"message": "at capacity"}})
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    async def go() -> tuple[Outcome, Outcome]:
        t = gp.OpenAITarget("127.0.0.1:9")
        assert t.base == "http://127.0.0.1:9/v1"
        await t.open()
        await t.http.aclose()
        t.http = httpx.AsyncClient(base_url=t.base, transport=httpx.MockTransport(handler))
        try:
            return await t("buds"), await t("busy")
        finally:
            await t.close()

    ok, busy = asyncio.run(go())
    assert {"cards", "answer", "done"} <= set(ok.events) and not ok.error_code
    assert ok.events["cards"] <= ok.events["answer"] and ok.info["finish_reason"] == "stop"
    assert busy.error_code == "HTTP_503" and busy.retryable and not busy.responded
    r = gp._result(0.0, 0.0, 0.0, busy, "answer", "busy")
    assert r.refused and not r.ok


def test_cpu_class_reads_the_three_flags() -> None:
    info = "flags\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\nflags : avx512f\n"
    assert gp.cpu_class(info, {})["flags"] == ["avx512_bf16", "avx512f"]
    got = gp.cpu_class("flags : avx2 amx_bf16", {"ATEN_CPU_CAPABILITY": "avx2"})
    assert got["flags"] == ["amx_bf16"] and got["ATEN_CPU_CAPABILITY"] == "avx2"
    line = gp.format_row(gp.summarize([RequestResult(0.0, latency=0.1, ok=True)], 1.0, 1.0, 0.3))
    assert len(line.split()) == len(gp.TABLE_HEADER.split())


# --- the gRPC targets against a fake Triton ---------------------------------------------------

def _response(req: Any, outputs: dict[str, Any], final: bool = False) -> Any:
    """A ModelStreamInferResponse with BYTES/BOOL outputs, as Triton streams them."""
    import struct

    from tritonclient.grpc import service_pb2

    resp = service_pb2.ModelInferResponse(model_name=req.model_name, id=req.id)
    for name, value in outputs.items():
        out = resp.outputs.add(name=name, datatype="BOOL" if isinstance(value, bool) else "BYTES")
        out.shape.extend([1])
        raw = value.to_bytes(1, "little") if isinstance(value, bool) else \
            struct.pack("<I", len(value.encode())) + value.encode()
        resp.raw_output_contents.append(raw)
    if final:
        resp.parameters["triton_final_response"].bool_param = True
    return service_pb2.ModelStreamInferResponse(infer_response=resp)


def _question(req: Any) -> str:
    import struct

    i = [x.name for x in req.inputs].index("question")
    raw = req.raw_input_contents[i]
    return raw[4:4 + struct.unpack("<I", raw[:4])[0]].decode()


def test_grpc_targets_read_tritons_stream() -> None:
    """Planner and assistant targets through tritonclient's aio stream against a fake
    servicer: the events they record and a retryable error read as a refusal."""
    from concurrent import futures

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelStreamInfer(self, requests: Any, context: Any) -> Any:  # gRPC naming
            for req in requests:
                q = _question(req)
                if q == "busy":
                    yield service_pb2.ModelStreamInferResponse(
                        error_message=f"[UNAVAILABLE] server at capacity ({req.model_name})")
                elif req.model_name == "rufus_qp_medusa":
                    yield _response(req, {"plan": '{"intent": "product_search"}',
                                          "fallback": False}, final=True)
                else:
                    # rufus/assistant/triton_model.py: plan, fallback and cards together
                    yield _response(req, {"plan": "{}", "fallback": True, "products": "[]",
                                          "text_output": ""})
                    yield _response(req, {"text_output": "Try"})
                    if q == "dies":
                        yield service_pb2.ModelStreamInferResponse(
                            error_message="[UNAVAILABLE] engine died")
                        return
                    yield _response(req, {"text_output": " these", "finish_reason": "stop"})
                    yield _response(req, {}, final=True)
                return

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def go() -> dict[str, Outcome]:
        got = {}
        for name, cls in (("planner", gp.PlannerTarget), ("assistant", gp.AssistantTarget)):
            t = cls(f"127.0.0.1:{port}")
            await t.open()
            try:
                for q in ("buds", "busy", "dies"):
                    got[f"{name}-{q}"] = await t(q)
            finally:
                await t.close()
        return got

    try:
        got = asyncio.run(go())
    finally:
        server.stop(0)
    plan = got["planner-buds"]
    assert "plan" in plan.events and not plan.error_code and plan.info["fallback"] is False
    ans = got["assistant-buds"]
    assert not ans.error_code and ans.info == {"fallback": True, "finish_reason": "stop"}
    assert ans.events["cards"] <= ans.events["answer"] <= ans.events["done"]
    for key in ("planner-busy", "assistant-busy"):
        r = gp._result(0.0, 0.0, 0.0, got[key], "answer", "busy")
        assert got[key].error_code == "UNAVAILABLE" and r.refused and not r.ok
    died = gp._result(0.0, 0.0, 0.0, got["assistant-dies"], "answer", "dies")
    assert "answer" in got["assistant-dies"].events and not died.refused and not died.ok


def test_a_fresh_stack_is_started_for_a_rate_and_stopped_after_even_on_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """--fresh-stack: tritonserver with make serve's models on free ports, its gRPC URL
    yielded once ready, and stopped by pid whatever the rate's run did."""
    import rufus.launch.server as server

    events: list[str] = []

    class FakeServer:
        def __init__(self, models: list[str], grpc_port: int, **kw: Any) -> None:
            self.models, self.grpc_port = models, grpc_port
            self.metrics_port = kw["metrics_port"]

        def start(self) -> None:
            events.append("start " + ",".join(self.models))

        def wait_ready(self) -> float:
            events.append("ready")
            return 1.0

        def stop(self) -> None:
            events.append("stop")

    monkeypatch.setattr(server, "TritonServer", FakeServer)
    with gp.fresh_stack("planner", tmp_path / "s.log") as (url, metrics):
        host, port = url.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert metrics.startswith("http://127.0.0.1:") and metrics.endswith("/metrics")
    assert events == ["start " + ",".join(gp.STACK_MODELS), "ready", "stop"]
    events.clear()
    with pytest.raises(RuntimeError), gp.fresh_stack("assistant", tmp_path / "s.log"):
        raise RuntimeError("the rate failed")
    assert events[-1] == "stop"


def test_calibration_reads_the_admissions_estimate_error_around_a_rate() -> None:
    """The estimate's calibration per rate: the admitted requests' mean error and the shares
    within 100 ms, too early (pessimistic) and too late, from the histogram's deltas."""
    import http.server
    import threading

    fam = gp.ESTIMATE_ERROR["assistant"]
    bodies = []
    for count, total, under_m01, under_01 in ((10, 1.0, 2, 9), (30, -1.0, 8, 26)):
        labels = 'model="rufus_assistant",version="1"'
        lines = [f'{fam}_bucket{{le="-0.1",{labels}}} {under_m01}',
                 f'{fam}_bucket{{le="0.1",{labels}}} {under_01}',
                 f'{fam}_bucket{{le="+Inf",{labels}}} {count}',
                 f'{fam}_count{{{labels}}} {count}',
                 f'{fam}_sum{{{labels}}} {total}']
        bodies.append("\n".join(["# TYPE x histogram", *lines]) + "\n")

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.pop(0).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
        before, after = gp.scrape_histogram(url, fam), gp.scrape_histogram(url, fam)
    finally:
        srv.shutdown()
        srv.server_close()
    c = gp.calibration(before, after)
    assert c is not None and c["admitted"] == 20
    assert c["mean_error_s"] == pytest.approx(-0.1)
    assert c["optimistic"] == pytest.approx(6 / 20) and c["within_band"] == pytest.approx(11 / 20)
    assert c["pessimistic"] == pytest.approx(3 / 20)
    assert "of 20" in gp.format_calibration(c)
    # 20 new: 6 at or below -0.1, 11 in (-0.1, 0.1], 3 above: the median within (-0.1, 0.1]
    assert -0.1 < c["median_error_s"] <= 0.1
    without_sum = {**after, "has_sum": False}
    assert gp.calibration(before, without_sum)["mean_error_s"] is None
    assert gp.calibration(None, after) is None
