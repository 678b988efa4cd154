"""run_generate's contract with a fake engine (the real one is covered by integration tests):
every request ends with exactly one final response, errors carry the right code, the
admission counter always comes back down, cancellation aborts inside the engine."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("vllm")

from rufus.errors import AtCapacity, Unavailable
from rufus.serving.cancel import CancelWatcher
from rufus.serving.engine import READY, EngineHost, EngineSpec
from rufus.serving.engine_api import Completion, Output
from rufus.serving.generation import run_generate
from rufus.serving.metrics import Metrics
from rufus.serving.request import GenerateRequest


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text.split())))

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return " ".join(m["content"] for m in messages) + " assistant:"


@dataclass
class FakeHost(EngineHost):
    """Just enough of EngineHost: admission and a scripted generate()."""

    script: list[Output] = field(default_factory=list)
    delay: float = 0.0
    fail: BaseException | None = None
    aborted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        EngineHost.__init__(self, EngineSpec({}), max_outstanding=2)
        self.engine = object()
        self.state = READY
        self.tokenizer = FakeTokenizer()
        self.max_model_len = 50

    async def generate(self, prompt, sampling_params, request_id):
        for out in self.script:
            await asyncio.sleep(self.delay)
            if request_id in self.aborted:
                return
            yield out
        if self.fail is not None:
            raise self.fail

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class Sink:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.sent: list[tuple[Any, Any, bool]] = []
        self.cancel_after = cancel_after

    def send(self, outputs, error, final):
        self.sent.append((outputs, error, final))

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


def serve(host: FakeHost, req: GenerateRequest, sink: Sink, rid: str = "r1") -> None:
    async def main() -> None:
        await run_generate(host, CancelWatcher(interval=0.01), req, sink, Metrics(), 0.0, rid)

    asyncio.run(main())


def stream_script(n: int) -> list[Output]:
    return [Output([Completion(f"t{i}", [i], "length" if i == n - 1 else None)], i == n - 1)
            for i in range(n)]


def req(**kw) -> GenerateRequest:
    base = {"prompt": "a b c", "stream": True, "sampling": {"max_tokens": 5}}
    return GenerateRequest(**{**base, **kw})


def test_stream_sends_deltas_and_one_final():
    host, sink = FakeHost(script=stream_script(3)), Sink()
    serve(host, req(), sink)
    assert [f for _, _, f in sink.sent] == [False, False, True]
    assert b"".join(o["text_output"][0] for o, _, _ in sink.sent) == b"t0t1t2"
    assert host.outstanding == 0


def test_non_stream_prepends_prompt_unless_excluded():
    host, sink = FakeHost(script=[Output([Completion(" x", [1, 2], "stop")], True)]), Sink()
    serve(host, req(stream=False), sink)
    ((out, err, final),) = sink.sent
    assert err is None and final and out["text_output"][0] == b"a b c x"


def test_prompt_too_long_is_invalid_arg_naming_the_field():
    host, sink = FakeHost(script=stream_script(1)), Sink()
    serve(host, req(prompt="w " * 60), sink)
    ((_, err, final),) = sink.sent
    assert final and err.code == "INVALID_ARG" and err.message.startswith("text_input: prompt has 60")


def test_engine_death_mid_stream_is_unavailable():
    host = FakeHost(script=stream_script(5)[:2], fail=Unavailable("engine died: boom"))
    sink = Sink()
    serve(host, req(), sink)
    assert sink.sent[-1][1].code == "UNAVAILABLE" and sink.sent[-1][2]
    assert sum(1 for *_, f in sink.sent if f) == 1 and host.outstanding == 0


def test_admission_bound():
    host = FakeHost(script=stream_script(1))
    host.outstanding = 2
    sink = Sink()
    serve(host, req(), sink)
    ((_, err, _),) = sink.sent
    assert err.code == "UNAVAILABLE" and "at capacity" in err.message
    assert host.outstanding == 2  # a refused request never counted
    with pytest.raises(AtCapacity):
        host.admit()


def test_cancellation_aborts_in_engine_and_ends_stream():
    host, sink = FakeHost(script=stream_script(50), delay=0.005), Sink(cancel_after=2)
    serve(host, req(), sink, rid="c1")
    assert "c1" in host.aborted
    assert sink.sent[-1][1].code == "CANCELLED" and sink.sent[-1][2]
    assert host.outstanding == 0


def test_dead_engine_error_does_not_pin_the_request_that_saw_it():
    """The error kept for reporting must not hold the frames of the request that noticed
    the death, nor its Triton response sender through them."""
    host = EngineHost(EngineSpec({}), name="t")
    reported: list[BaseException] = []
    host.on_dead = reported.append

    class Sender:
        pass

    def serve(sender: Sender) -> None:
        try:
            raise RuntimeError("engine core died")
        except RuntimeError as exc:
            host.mark_dead(exc)

    sender = Sender()
    ref = weakref.ref(sender)
    serve(sender)
    del sender
    gc.collect()
    assert ref() is None, "the stored error keeps the request's frames alive"
    assert host.dead_reason == "RuntimeError: engine core died"
    host.restart.enabled = False
    asyncio.run(host._handle_death())
    assert "engine core died" in str(reported[0])
    assert host.state == "failed" and "engine core died" in str(host.dead_reason)
