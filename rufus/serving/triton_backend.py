"""The Triton Python-backend side, shared by every model in ``model_repository/``.

Each ``model.py`` is a thin adapter over a subclass of :class:`TritonModel`, which declares
its inputs and outputs (an :class:`~rufus.serving.validation.InputSpec` table), its parser
and how a parsed request is served. Everything Triton-specific lives here: reading tensors,
turning results and :mod:`rufus.errors` errors into ``InferenceResponse`` objects, metrics
registration, and reporting the engine's state (``rufus_engine_ready`` and friends) while
:class:`~rufus.serving.engine.EngineHost` replaces a dead engine in place. The model is never
unloaded for that: Triton 2.51 sometimes never finalized an unloaded instance, which then
could not be loaded again without a restart. Only this module and the metrics publishers
(:mod:`rufus.serving.metrics`, the assistant's and planner's metric families) touch
``pb_utils``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import locale
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from rufus.env import env_opt, env_str, lab_on, setdefault_environ
from rufus.errors import InvalidInput, RufusError, Unavailable, client_error
from rufus.machine import caches
from rufus.machine import cpu as machine
from rufus.serving.cancel import CancelWatcher
from rufus.serving.config import load_engine_config
from rufus.serving.engine import FAILED, READY, RESTARTING, EngineHost, EngineSpec, EngineState
from rufus.serving.generation import new_request_id
from rufus.serving.metrics import BufferedMetrics, Metrics, TritonMetrics, scheduler_stat_logger
from rufus.serving.model_settings import EngineModelSettings, ModelSettings
from rufus.serving.validation import InputSpec, Limits, OutputSpec, split_metadata
from rufus.telemetry import tracing
from rufus.wire import CONVERSATION_HEADER

try:  # only importable inside the Triton Python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - unit tests import this module without Triton
    pb_utils = None

log = logging.getLogger("rufus.triton")


def prepare_process() -> None:
    """Work around the stub's environment before vLLM is imported.

    The stub's embedded interpreter runs with LC_CTYPE=C, so ``open()`` defaults to ASCII
    and torch.compile dies on UTF-8 sources; logs go nowhere unless configured; compiled
    artefacts go to one directory keyed by this CPU (:mod:`rufus.machine.caches`).
    """
    try:
        locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    except locale.Error:
        pass
    setdefault_environ("PYTHONIOENCODING", "utf-8")
    logging.basicConfig(
        level=env_str("RUFUS_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    caches.configure()  # before vLLM is imported: compile caches keyed by this CPU


# The resource attribute a model's spans carry: a dotted name, passed as a keyword to
# tracing.setup's **resource (a TypedDict: it binds to no named parameter such as ``env``).
_ModelResource = TypedDict("_ModelResource", {"triton.model": str})


def setup_tracing(model: str) -> None:
    """Each model's stub is its own process: its spans say ``service.name`` = the model
    (off unless an OTLP endpoint is set; rufus/telemetry/tracing.py)."""
    try:
        tracing.setup(model, **_ModelResource({"triton.model": model}))
    except Exception as exc:  # noqa: BLE001 - a bad tracing setting must not stop the model
        log.error("%s: tracing stays off: %s", model, exc)


def request_trace_parent(request: Any, forwarded: dict[str, str]) -> Any:
    """The context a request's span joins: the caller's ``traceparent`` that tritonserver
    forwarded as a parameter, else Triton's own span when tritonserver traces in
    OpenTelemetry mode (``--trace-config mode=opentelemetry``) and the request came without
    one, else None (the trace starts at this model).

    The caller's comes first. Triton's own spans come from its C++ exporter, which was seen
    to send a request's span long after the models' spans, or to give the context of
    another trace; a model's span under it then left the caller's trace broken. Under the
    caller's span the models' spans join the trace whatever Triton exports, and Triton's
    request and compute spans sit beside them."""
    parent = tracing.extract(forwarded.get("traceparent"), forwarded.get("tracestate"))
    if parent is not None:
        return parent
    try:
        trace = request.trace()
        raw = trace.get_context() if trace is not None else None
        if raw:
            ctx = json.loads(raw) if isinstance(raw, str) else raw
            if isinstance(ctx, dict) and tracing.valid_traceparent(ctx.get("traceparent")):
                return tracing.extract(ctx["traceparent"], ctx.get("tracestate"))
    except Exception:  # noqa: BLE001 - an older stub or Triton's tracing off
        pass
    return None


def freeze_heap(name: str, collect: bool = True) -> None:
    """Collect once, then move every object alive after the start into the collector's
    permanent generation (``gc.freeze``), as vLLM's own server does after its start.

    A stub holds torch, vLLM and transformers, and a full collection walks every object they
    made (its cost and the effect on the first request: docs/benchmarks.md). Without this,
    the first full collection falls on a client's request and later ones on the p99.
    Objects made after the freeze are collected as usual; frozen ones are still freed by
    reference counting. Calling it again is cheap: a collection skips frozen objects (an
    engine model freezes before it forks its EngineCore, then once more when initialize() ends).
    ``RUFUS_LAB_OFF=gc_freeze`` turns it off (the benchmark's baseline). ``collect=False``: freeze
    only, right before the EngineCore's fork, where a collection found a few hundred
    unreachable objects among 630,000 and cost 0.6-0.9 s of every start."""
    if not lab_on("gc_freeze"):
        return
    t0 = time.monotonic()
    if collect:
        gc.collect()
    gc.freeze()
    log.info("%s: %d objects frozen out of the garbage collector's scans (%.2f s)",
             name, gc.get_freeze_count(), time.monotonic() - t0)


class TritonSink:
    """The responses of one request, sent on the thread that produced them (the serving loop).

    Not through a sender thread, as the official backend does: with one, streams on 2 cores
    hit the GIL convoy effect (every send releases and re-acquires the GIL against the busy
    engine loop) and responses arrived in bursts (docs/benchmarks.md, docs/architecture.md).
    Once the final response is sent, ``is_cancelled`` answers without asking Triton: asking
    it about a finished request crashes tritonserver 2.51 (SIGSEGV in
    ``TRITONBACKEND_ResponseFactoryIsCancelled``, seen when a watcher raced the final send).
    """

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.done = False

    def send(self, outputs: dict[str, np.ndarray] | None, error: RufusError | None,
             final: bool) -> None:
        if self.done:
            return
        self.done = final
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            self.sender.send(to_triton_response(outputs, error), flags=flags)
        except Exception:  # a client gone mid-stream must not stop others
            log.exception("sending a response failed")

    def is_cancelled(self) -> bool:
        return False if self.done else bool(self.sender.is_cancelled())


def to_triton_response(outputs: dict[str, np.ndarray] | None, error: RufusError | None) -> Any:
    tensors = [pb_utils.Tensor(k, v) for k, v in (outputs or {}).items()]
    if error is None:
        return pb_utils.InferenceResponse(output_tensors=tensors)
    code = getattr(pb_utils.TritonError, error.code, pb_utils.TritonError.INTERNAL)
    # Triton's gRPC stream carries only the message, not the code: the wire form puts the
    # code in it (rufus.errors.from_wire reads it back).
    return pb_utils.InferenceResponse(
        output_tensors=tensors, error=pb_utils.TritonError(error.wire(), code=code))


class EngineStateMetrics:
    """The engine's health on Triton's metrics endpoint, published at once (rare updates).

    Triton's ``/v2/models/<m>/ready`` only says the model is loaded (the Python backend has
    no readiness hook, and the model is not unloaded on engine death); ``rufus_engine_ready``
    says whether it can serve. The unit agent and the rig supervisor read it.
    """

    def __init__(self, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        fam = pb_utils.MetricFamily
        self._families = [
            fam(name="rufus_engine_ready", kind=fam.GAUGE,
                description="1 while the engine serves; 0 while dead, restarting or given up"),
            fam(name="rufus_engine_failed", kind=fam.GAUGE,
                description="1 once the engine gave up after too many failures in a window "
                            "(restart the server)"),
            fam(name="rufus_engine_failures_total", kind=fam.COUNTER,
                description="Engine deaths seen"),
            fam(name="rufus_engine_restarts_total", kind=fam.COUNTER,
                description="Engines replaced in place after a death"),
            fam(name="rufus_engine_restart_backoff_seconds", kind=fam.GAUGE,
                description="Backoff before the pending engine restart (0 when none)"),
        ]
        (self.ready, self.failed, self.failures, self.restarts,
         self.backoff) = (f.Metric(labels=labels) for f in self._families)

    def update(self, host: EngineHost, state: EngineState) -> None:
        self.ready.set(1 if state == READY else 0)
        self.failed.set(1 if state == FAILED else 0)
        self.backoff.set(host.next_restart_in if state == RESTARTING else 0)
        # counters only go up: publish the difference since the last update
        self._bump("failures", self.failures, host.failure_count)
        self._bump("restarts", self.restarts, host.restarts)

    def _bump(self, key: str, metric: Any, total: int) -> None:
        seen = getattr(self, "_seen_" + key, 0)
        if total > seen:
            metric.increment(total - seen)
            setattr(self, "_seen_" + key, total)

    def close(self) -> None:
        self.ready = self.failed = self.failures = self.restarts = self.backoff = None
        self._families.clear()


def read_inputs(request: Any, names: set[str]) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {}
    for name in names:
        t = pb_utils.get_input_tensor_by_name(request, name)
        out[name] = None if t is None else t.as_numpy()
    return out


WARMUP_TIMEOUT_S = 300.0


class CollectingSink:
    """A warm-up request's responses (never sent anywhere)."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, np.ndarray]] = []
        self.error: RufusError | None = None
        self.final = False

    def send(self, outputs: dict[str, np.ndarray] | None, error: RufusError | None,
             final: bool) -> None:
        if outputs is not None:
            self.outputs.append(outputs)
        self.error = error or self.error
        self.final = self.final or final

    def is_cancelled(self) -> bool:
        return False


def mark_initialized(name: str) -> None:
    """Tell the launcher that this stub's ``initialize()`` returned (a file named after the
    model in ``$RUFUS_INIT_MARKERS``), so it can tell a load tritonserver silently gave up on
    from a slow one (rufus/launch/server.py ``TritonServer.stalled_loads``). Best effort."""
    where = env_opt("RUFUS_INIT_MARKERS")
    if where:
        try:
            (Path(where) / name).write_text(f"{time.time():.3f}\n")
        except OSError as exc:
            log.warning("%s: could not write the init marker in %s: %s", name, where, exc)


class TritonModel:
    """Base ``TritonPythonModel``: the request path every model shares.

    A subclass declares ``INPUT_SPECS`` / ``OUTPUT_SPECS`` (its IO table, next to the model),
    implements :meth:`start` (build what serves), :meth:`parse` (Triton inputs -> a typed
    request, raising :class:`~rufus.errors.InvalidInput`), :meth:`submit` (hand a parsed
    request to its serving loop) and :meth:`count_refused` (its metric for a request that
    never started). Any exception on the way becomes one error of the vocabulary
    (:func:`rufus.errors.client_error`): never a traceback or a server path.
    """

    INPUT_SPECS: tuple[InputSpec, ...] = ()
    OUTPUT_SPECS: tuple[OutputSpec, ...] = ()
    # its config.pbtxt parameters, typed (rufus/serving/model_settings.py)
    SETTINGS: type[ModelSettings] = ModelSettings
    settings: ModelSettings
    model_dir: Path

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        return add_io(auto_complete_model_config, [s.config() for s in cls.INPUT_SPECS],
                      [s.config() for s in cls.OUTPUT_SPECS])

    def initialize(self, args: dict[str, Any]) -> None:
        prepare_process()
        self.args = args
        self.model_config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.version = str(args["model_version"])
        self.model_dir = Path(args["model_repository"]) / args["model_version"]
        self.input_names = {spec.name for spec in self.INPUT_SPECS}
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(
                f"{self.name}: config.pbtxt must set model_transaction_policy.decoupled=true"
            )
        self.settings = self.SETTINGS.from_config(self.model_config)  # a bad value names its key
        setup_tracing(self.name)
        self.start()
        freeze_heap(self.name)
        mark_initialized(self.name)

    def warmup_enabled(self) -> bool:
        """``warmup`` in config.pbtxt (``RUFUS_WARMUP``): serve warm-up requests before
        reporting ready (default true; docs/serving.md, "What ready guarantees")."""
        return self.settings.warmup

    def start(self) -> None:
        raise NotImplementedError

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> Any:
        raise NotImplementedError

    def submit(self, parsed: Any, sink: TritonSink, arrival: float) -> None:
        raise NotImplementedError

    def count_refused(self, err: RufusError) -> None:
        """Hook: count a request answered with ``err`` before it started."""

    def with_conversation(self, parsed: Any, key: str) -> Any:
        """Hook: a request that carried the conversation key (routing metadata, already
        validated). Leaf models ignore it: the ingress used it to pick this unit."""
        return parsed

    def with_trace(self, parsed: Any, parent: Any) -> Any:
        """Hook: the trace context this request joins (only called when tracing is on).
        The base sets ``parsed.trace`` where the request type has it."""
        if hasattr(parsed, "trace"):
            parsed.trace = parent
        return parsed

    def parameters_json(self, request: Any) -> str | None:
        raw = request.parameters()
        return raw if raw and raw != "{}" else None

    def execute(self, requests: list[Any]) -> None:
        arrival = time.monotonic()
        for request in requests:
            sink = TritonSink(request.get_response_sender())
            parent = None
            try:
                params, conversation, trace = split_metadata(self.parameters_json(request),
                                                             CONVERSATION_HEADER)
                if tracing.enabled():
                    parent = request_trace_parent(request, trace)
                parsed = self.parse(read_inputs(request, self.input_names), params)
                if conversation:
                    parsed = self.with_conversation(parsed, conversation)
                if tracing.enabled():
                    parsed = self.with_trace(parsed, parent)
                self.submit(parsed, sink, arrival)
            except Exception as exc:  # noqa: BLE001 - every failure gets a client error
                err = client_error(exc, log, f"{self.name}: parsing a request")
                if isinstance(err, InvalidInput):
                    log.info("%s: rejected request: %s", self.name, err)
                self.count_refused(err)
                sink.send(None, err, True)
                if tracing.enabled():  # a refusal is a (short) trace of its own too
                    tracing.end(tracing.start_span(f"{self.name} refused", parent, "server",
                                                   {"gen_ai.request.model": self.name},
                                                   start_ns=tracing.mono_to_ns(arrival)), err)
        return None


class EngineModel(TritonModel):
    """A model served by an engine (rufus_llm, the planner): an :class:`EngineHost` on its
    own event loop thread, admission, cancellation and the engine's health metrics.

    Subclasses implement :meth:`handle` (a coroutine serving one parsed request on the
    engine's loop) and :meth:`parse`; ``engine_spec`` and ``ready`` are hooks around the
    start.
    """

    SETTINGS: type[EngineModelSettings] = EngineModelSettings
    settings: EngineModelSettings
    # which pass mix decides ``"dtype": "measured"`` (rufus/machine/precision.py)
    precision_workload = "answer"

    def start(self) -> None:
        from rufus.multinode.control import attach_leader, unit_topology
        from rufus.multinode.topology import apply_topology

        log.info("%s: this CPU: %s", self.name, machine.describe())
        self.engine_config = load_engine_config(self.model_dir / "model.json", self.name,
                                                workload=self.precision_workload)
        log.info("%s: engine args from %s (overrides %s): %s", self.name,
                 self.engine_config.source, self.engine_config.overrides or "none",
                 self.engine_config.engine_args)
        self.metrics: Metrics = self._make_metrics()
        self.engine_metrics = self._make_engine_metrics()
        self.default_max_tokens = self.settings.default_max_tokens
        spec = self.engine_spec(EngineSpec(
            self.engine_config.engine_args,
            stat_loggers=(scheduler_stat_logger(self.metrics),),
            # frozen before the EngineCore is forked from this process, so the child inherits
            # it frozen; initialize() freezes again at its end, walking only what came since
            before_fork=lambda: freeze_heap(self.name, collect=False)))
        # the unit's model (RUFUS_UNIT_MODEL) leads a multi-node unit when LWS_GROUP_SIZE > 1
        # (rufus/multinode/control.py): its engine args for this node, no in-place restart
        # (one node cannot rejoin a broken unit alone: its supervisor recreates the unit)
        topo = unit_topology(self.name)
        restart = replace(self.settings.restart)  # the host's own copy
        if topo is not None:
            spec = replace(spec, engine_args=apply_topology(dict(spec.engine_args), topo))
            restart.enabled = False
        self.host = EngineHost(
            spec,
            max_outstanding=self.settings.max_outstanding_requests,
            on_dead=self._on_engine_dead,
            on_poll=lambda host: self.metrics.set_engine_requests(host.num_running()),
            on_state=self._on_engine_state,
            on_restarted=self.ready,
            name=self.name,
            restart=restart,
            warmup=self.warm_up if self.warmup_enabled() else None,
        )
        self.watcher = CancelWatcher()
        self.unit = None if topo is None else attach_leader(self.name, self.host, topo)
        self.host.start()
        self.ready()

    def engine_spec(self, spec: EngineSpec) -> EngineSpec:
        """Hook: the engine this model serves, from the base ``spec`` (model.json's engine
        args, the scheduler stat logger, the heap freeze before a fork); an override returns
        its own (``dataclasses.replace``). Runs once, before the host is built."""
        return spec

    def ready(self) -> None:
        """Hook: the engine is up and warm (e.g. loading side artifacts)."""

    def warmup_requests(self) -> list[list[Any]]:
        """Hook: the warm-up, as rounds of parsed requests (a round's requests run
        concurrently): one of each kind the model serves, so ready means warm."""
        return []

    async def warm_up(self) -> None:
        """Serve :meth:`warmup_requests` through the model's own request path before the
        engine reports READY (at start and after every in-place restart); any failure
        fails the start. ``warmup: "false"`` in config.pbtxt (or ``RUFUS_WARMUP=false``)
        turns it off."""
        n = 0
        for round_ in self.warmup_requests():
            sinks = [CollectingSink() for _ in round_]
            await asyncio.wait_for(asyncio.gather(*(
                self.handle(parsed, sink, time.monotonic(),
                            new_request_id(f"{self.name}-warmup"), internal=True)
                for parsed, sink in zip(round_, sinks, strict=True))), WARMUP_TIMEOUT_S)
            for sink in sinks:
                if sink.error is not None or not sink.final:
                    raise RuntimeError(f"warm-up request failed: {sink.error}")
            n += len(round_)
        log.info("%s: %d warm-up requests served", self.name, n)

    def request_limits(self) -> Limits:
        """The configured input bounds plus what the running engine knows (built once)."""
        limits = getattr(self, "_limits", None)
        if limits is None:
            limits = self._limits = self.settings.limits.with_engine(self.host.engine,
                                                                      self.host.loras)
        return limits

    def _make_metrics(self) -> Metrics:
        if not self.settings.report_custom_metrics:
            return Metrics()
        try:
            return BufferedMetrics(TritonMetrics(pb_utils, self.name, self.version))
        except Exception as exc:  # noqa: BLE001 - metrics disabled on the server
            log.warning("%s: custom metrics unavailable (%s)", self.name, exc)
            return Metrics()

    def _on_engine_dead(self, err: BaseException) -> None:
        """In-flight requests have their errors; the host now replaces the engine."""
        log.error("%s: engine failed (%s); requests get UNAVAILABLE until it is replaced "
                  "(rufus_engine_ready 0)", self.name, err)

    def _on_engine_state(self, host: EngineHost, state: EngineState) -> None:
        if self.engine_metrics is not None:
            self.engine_metrics.update(host, state)
        if state == FAILED:
            self._unload_for_good(host.dead_reason or "engine failed")

    def _unload_for_good(self, why: str) -> None:
        """The host gave up (too many failures, or a multi-node unit broke): unload, so
        Triton's readiness turns false and liveness probes / the unit supervisor restart
        the server (or the whole unit). Nothing is loaded again in this process, so an
        unload Triton never finalizes costs nothing."""
        try:
            pb_utils.unload_model(self.name)
            log.error("%s: unloading (readiness false) until the server is restarted: %s",
                      self.name, why)
        except Exception as exc:  # noqa: BLE001 - needs --model-control-mode=explicit
            log.error("%s: engine stays down (%s) and the model could not be unloaded (%s); "
                      "start tritonserver with --model-control-mode=explicit", self.name,
                      why, exc)

    def _make_engine_metrics(self) -> EngineStateMetrics | None:
        if pb_utils is None or type(self.metrics) is Metrics:  # metrics disabled
            return None
        try:
            return EngineStateMetrics(self.name, self.version)
        except Exception as exc:  # noqa: BLE001 - metrics disabled on the server
            log.warning("%s: engine state metrics unavailable (%s)", self.name, exc)
            return None

    def finalize(self) -> None:
        log.info("%s: finalizing (outstanding=%d)", self.name, self.host.outstanding)
        self.host.shutdown(timeout=15)
        self.metrics.close()
        if self.engine_metrics is not None:
            self.engine_metrics.close()
        log.info("%s: finalized", self.name)

    # --------------------------------------------------------------- requests
    def submit(self, parsed: Any, sink: TritonSink, arrival: float) -> None:
        if not self.host.healthy:
            raise Unavailable(f"{self.name}: {self.host.unavailable_reason()}")
        self.host.submit(self.handle(parsed, sink, arrival, new_request_id(self.name)))

    def count_refused(self, err: RufusError) -> None:
        self.metrics.count_request(err.outcome)

    async def handle(self, parsed: Any, sink: Any, arrival: float, request_id: str,
                     internal: bool = False) -> None:
        raise NotImplementedError


def add_io(auto_complete_model_config: Any, inputs: list[dict[str, Any]],
           outputs: list[dict[str, Any]]) -> Any:
    """auto_complete_config helper: add what config.pbtxt leaves out, keep what it has."""
    cfg = auto_complete_model_config.as_dict()
    have_in = {i["name"] for i in cfg.get("input", [])}
    have_out = {o["name"] for o in cfg.get("output", [])}
    for i in inputs:
        if i["name"] not in have_in:
            auto_complete_model_config.add_input(i)
    for o in outputs:
        if o["name"] not in have_out:
            auto_complete_model_config.add_output(o)
    auto_complete_model_config.set_model_transaction_policy({"decoupled": True})
    auto_complete_model_config.set_max_batch_size(0)
    return auto_complete_model_config

