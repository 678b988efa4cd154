"""rufus_assistant: the assistant pipeline as a decoupled Triton model (gRPC streaming).

Inputs ``question`` and optional ``history`` (JSON list of {role, content}, as the planner).
First response: ``plan`` (JSON), ``fallback`` and ``products`` (JSON cards); then one
``text_output`` delta per response; the final response carries ``finish_reason`` and
``timings`` (JSON, seconds). The pipeline runs on its own event loop inside the stub and
calls rufus_qp_medusa and rufus_llm on the *same* server over gRPC (address from
``RUFUS_TRITON_GRPC_URL``, which rufus.harness.server sets): gRPC calls can be cancelled,
BLS requests cannot (Triton 2.51). A watcher polls ``is_cancelled()`` of live requests every
0.25 s (on the pipeline's loop) and cancels the request's task, which cancels its gRPC
streams.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rufus.assistant.pipeline import Assistant, AssistantMetrics, validate_request
from rufus.client import RequestFailed
from rufus.serving.generation import ServiceError
from rufus.serving.requests import InvalidInput, _text
from rufus.serving.triton_backend import (
    add_io,
    config_param,
    pb_utils,
    prepare_process,
    read_inputs,
    send_now,
)

log = logging.getLogger("rufus.assistant.triton")

CANCEL_POLL_S = 0.25
STAGE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


def _opt(name: str) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_STRING", "dims": [1], "optional": True}


ASSISTANT_INPUTS = [_opt("question"), _opt("history")]
ASSISTANT_OUTPUTS = [
    {"name": n, "data_type": t, "dims": [-1]} for n, t in (
        ("plan", "TYPE_STRING"), ("fallback", "TYPE_BOOL"), ("products", "TYPE_STRING"),
        ("text_output", "TYPE_STRING"), ("finish_reason", "TYPE_STRING"),
        ("timings", "TYPE_STRING"))
]


@dataclass
class AssistantRequest:
    question: str
    history: list[dict[str, str]]


def parse_assistant_request(inputs: dict[str, np.ndarray | None]) -> AssistantRequest:
    """Validate the tensors of one request; every error names the input field."""
    if inputs.get("question") is None:
        raise InvalidInput("question", "missing: send the customer's question")
    question = _text("question", inputs["question"])  # type: ignore[arg-type]
    history: Any = None
    if inputs.get("history") is not None:
        raw = _text("history", inputs["history"])  # type: ignore[arg-type]
        try:
            history = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput("history", f"is not valid JSON ({exc.msg})") from None
    return AssistantRequest(question, validate_request(question, history))


def _bytes(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


class TritonAssistantMetrics:
    """pb_utils metric families; updates are queued and published by a daemon thread every
    0.5 s (each update is IPC to the server, kept off the pipeline's event loop)."""

    def __init__(self, model: str, version: str) -> None:
        fam = pb_utils.MetricFamily
        self.labels = {"model": model, "version": version}
        self.stage_family = fam(name="rufus_assistant_stage_seconds",
                                description="Assistant stage latency: plan, retrieval, cards "
                                            "(time to first chunk), answer_ttft, first_token "
                                            "(time to first answer text), total",
                                kind=fam.HISTOGRAM)
        self.req_family = fam(name="rufus_assistant_requests_total",
                              description="Assistant requests by outcome and path",
                              kind=fam.COUNTER)
        self.stages: dict[str, Any] = {}
        self.counters: dict[tuple[str, str], Any] = {}
        self.events: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="assistant-metrics", daemon=True)
        self.thread.start()

    def observe(self, stage: str, seconds: float) -> None:
        self.events.append(("observe", (stage, seconds)))

    def count(self, outcome: str, path: str) -> None:
        self.events.append(("count", (outcome, path)))

    def flush(self) -> None:
        while self.events:
            kind, args = self.events.popleft()
            if kind == "observe":
                stage, secs = args
                if stage not in self.stages:
                    self.stages[stage] = self.stage_family.Metric(
                        labels={**self.labels, "stage": stage}, buckets=STAGE_BUCKETS)
                self.stages[stage].observe(secs)
            else:
                if args not in self.counters:
                    self.counters[args] = self.req_family.Metric(
                        labels={**self.labels, "outcome": args[0], "path": args[1]})
                self.counters[args].increment(1)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.flush()
            except Exception:  # metrics must never take the model down
                log.exception("metrics flush failed")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        with contextlib.suppress(Exception):
            self.flush()
        # metrics, then families, while the stub's shared memory exists (a MetricFamily
        # destroyed at interpreter shutdown segfaults the 2.51 stub; rufus.serving.metrics)
        self.stages.clear()
        self.counters.clear()
        self.stage_family = self.req_family = None
        import gc

        gc.collect()


class AssistantModel:
    """``TritonPythonModel`` for rufus_assistant (model_repository/rufus_assistant)."""

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        return add_io(auto_complete_model_config, ASSISTANT_INPUTS, ASSISTANT_OUTPUTS)

    def initialize(self, args: dict[str, Any]) -> None:
        prepare_process()
        from rufus.retrieval import default_retriever, index_path

        cfg = json.loads(args["model_config"])
        url = os.environ.get("RUFUS_TRITON_GRPC_URL") or config_param(cfg, "triton_grpc_url",
                                                                       "127.0.0.1:8001")
        self.metrics: AssistantMetrics | TritonAssistantMetrics
        if pb_utils is not None and config_param(cfg, "REPORT_CUSTOM_METRICS", "true") == "true":
            self.metrics = TritonAssistantMetrics(args["model_name"], args["model_version"])
        else:
            from rufus.assistant.pipeline import NullMetrics

            self.metrics = NullMetrics()
        t = time.monotonic()
        retriever = default_retriever()
        log.info("rufus_assistant: %d products (%s, index %s) in %.2f s; models via gRPC at %s",
                 len(retriever), retriever.name, index_path(), time.monotonic() - t, url)
        self.assistant = Assistant(
            url, retriever,
            planner_model=config_param(cfg, "planner_model", "rufus_qp_medusa"),
            answer_model=config_param(cfg, "answer_model", "rufus_llm"),
            k=int(config_param(cfg, "num_products", "5")),
            max_tokens=int(config_param(cfg, "answer_max_tokens", "160")),
            metrics=self.metrics)
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="assistant-loop",
                                            daemon=True)
        self.loop_thread.start()
        self.live: dict[object, tuple[Any, asyncio.Task[None]]] = {}
        self.poller: asyncio.Task[None] | None = None

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_assistant_request(read_inputs(request, {"question", "history"}))
            except InvalidInput as exc:
                self.metrics.count("invalid", "none")
                send_now(sender, None, ServiceError("INVALID_ARG", str(exc)), True)
                continue
            self.loop.call_soon_threadsafe(self._start, parsed, sender)
        return None

    # Everything below runs on the loop thread. ``live`` is only touched there, and a request
    # leaves it *before* its final response is sent: asking Triton ``is_cancelled()`` for a
    # request whose final response went out crashes tritonserver 2.51 (SIGSEGV in
    # TRITONBACKEND_ResponseFactoryIsCancelled, seen when a watcher thread raced the send).
    def _start(self, req: AssistantRequest, sender: Any) -> None:
        key = object()
        task = self.loop.create_task(self._serve(req, sender, key))
        self.live[key] = (sender, task)
        if self.poller is None or self.poller.done():
            self.poller = self.loop.create_task(self._poll_cancel())

    async def _poll_cancel(self) -> None:
        """A client that went away cancels its task (and so its planner/answer streams).
        Polled on the loop, like rufus_llm's CancelWatcher (a polling thread measured worse)."""
        while self.live:
            await asyncio.sleep(CANCEL_POLL_S)
            for key, (sender, task) in list(self.live.items()):
                try:
                    cancelled = bool(sender.is_cancelled())
                except Exception:  # a broken sender counts as gone
                    log.debug("is_cancelled failed", exc_info=True)
                    cancelled = True
                if cancelled and self.live.pop(key, None) is not None:
                    task.cancel()

    def _final(self, key: object, sender: Any, outputs: dict[str, np.ndarray] | None,
               error: ServiceError | None) -> None:
        self.live.pop(key, None)
        send_now(sender, outputs, error, True)

    async def _serve(self, req: AssistantRequest, sender: Any, key: object) -> None:
        first: dict[str, np.ndarray] = {}
        try:
            async with contextlib.aclosing(self.assistant.stream(req.question, req.history)) as events:
                async for ev in events:
                    if ev.type == "plan":
                        first["plan"] = _bytes(json.dumps(ev.plan))
                        first["fallback"] = np.array([ev.fallback], dtype=bool)
                    elif ev.type == "products":
                        first["products"] = _bytes(json.dumps(ev.products))
                        send_now(sender, first, None, False)
                    elif ev.type == "text":
                        send_now(sender, {"text_output": _bytes(ev.text)}, None, False)
                    else:
                        self._final(key, sender, {"text_output": _bytes(""),
                                                  "finish_reason": _bytes(ev.finish_reason),
                                                  "timings": _bytes(json.dumps(ev.timings))}, None)
        except asyncio.CancelledError:
            self._final(key, sender, None, ServiceError("CANCELLED", "request was cancelled"))
        except InvalidInput as exc:
            self._final(key, sender, None, ServiceError("INVALID_ARG", str(exc)))
        except RequestFailed as exc:
            code = "UNAVAILABLE" if exc.status in ("UNAVAILABLE", "NOT_FOUND", "") else "INTERNAL"
            log.warning("assistant request failed upstream: %s", exc)
            self._final(key, sender, None, ServiceError(code, f"answer model failed: {exc}"))
        except Exception as exc:
            log.exception("assistant request failed")
            self._final(key, sender, None,
                        ServiceError("INTERNAL", f"assistant failed: {type(exc).__name__}"))
        finally:
            self.live.pop(key, None)

    def finalize(self) -> None:
        def cancel_all() -> None:
            for _sender, task in self.live.values():
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.assistant.aclose(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(5)
        close = getattr(self.metrics, "close", None)
        if close is not None:
            close()
