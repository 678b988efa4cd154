"""The Triton Python-backend side, shared by every model in ``model_repository/``.

Each ``model.py`` subclasses :class:`EngineModel` and only names its request parser and
its request handler. Everything Triton-specific lives here: reading tensors, turning
results and :class:`~rufus.serving.generation.ServiceError` into ``InferenceResponse`` objects,
the response-sender thread, metrics registration and unloading a model whose engine died
(so Triton's readiness endpoints report it not ready).
"""

from __future__ import annotations

import gc
import json
import locale
import logging
import os
import queue
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from rufus.serving.config import load_engine_config
from rufus.serving.engine import EngineHost
from rufus.serving.generation import CancelWatcher, ServiceError, new_request_id
from rufus.serving.metrics import BufferedMetrics, Metrics, TritonMetrics, scheduler_stat_logger
from rufus.serving.requests import InvalidInput

try:  # only importable inside the Triton Python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - unit tests import this module without Triton
    pb_utils = None

log = logging.getLogger("rufus.triton")


def prepare_process() -> None:
    """Work around the stub's environment before vLLM is imported.

    The stub's embedded interpreter runs with LC_CTYPE=C, so ``open()`` defaults to ASCII
    and torch.compile dies on UTF-8 sources; logs go nowhere unless configured.
    """
    try:
        locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    except locale.Error:
        pass
    os.environ.setdefault("PYTHONIOENCODING", "utf-8")
    logging.basicConfig(
        level=os.environ.get("RUFUS_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def config_param(model_config: dict[str, Any], name: str, default: str = "") -> str:
    """A ``parameters`` entry of config.pbtxt; ``RUFUS_<NAME>`` in the environment wins."""
    env = os.environ.get("RUFUS_" + name.upper())
    if env is not None:
        return env
    return model_config.get("parameters", {}).get(name, {}).get("string_value", default)


def send_now(sender: Any, outputs: dict[str, np.ndarray] | None, error: ServiceError | None,
             final: bool) -> None:
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
    try:
        sender.send(to_triton_response(outputs, error), flags=flags)
    except Exception:  # a client gone mid-stream must not stop others
        log.exception("sending a response failed")


# "loop" (default): send on the thread that produced the response. "thread": hand it to a
# sender thread, as the official backend does. Measured (docs/benchmarks.md): with a
# sender thread, 16 streams on 2 cores hit the GIL convoy effect -- every send releases
# and re-acquires the GIL against the busy engine loop -- and responses arrived in bursts.
SEND_MODE = os.environ.get("RUFUS_SEND_MODE", "loop")


class TritonSink:
    """Sends responses for one request (directly, or through the sender thread)."""

    def __init__(self, sender: Any, out_queue: queue.Queue[Any]) -> None:
        self.sender = sender
        self.queue = out_queue

    def send(self, outputs: dict[str, np.ndarray] | None, error: ServiceError | None,
             final: bool) -> None:
        if SEND_MODE == "thread":
            self.queue.put((self.sender, outputs, error, final))
        else:
            send_now(self.sender, outputs, error, final)

    def is_cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


def to_triton_response(outputs: dict[str, np.ndarray] | None, error: ServiceError | None) -> Any:
    tensors = [pb_utils.Tensor(k, v) for k, v in (outputs or {}).items()]
    if error is None:
        return pb_utils.InferenceResponse(output_tensors=tensors)
    code = getattr(pb_utils.TritonError, error.code, pb_utils.TritonError.INTERNAL)
    # Triton's gRPC stream carries only the message, not the code: put the code in it so
    # streaming clients (and our retrying client) can tell INVALID_ARG from UNAVAILABLE.
    return pb_utils.InferenceResponse(
        output_tensors=tensors,
        error=pb_utils.TritonError(f"[{error.code}] {error.message}", code=code),
    )


def _describe(obj: Any) -> str:
    """A short name for what holds a response sender (for the stalled-unload warning)."""
    code = getattr(obj, "f_code", None) or getattr(obj, "cr_code", None)
    return f"{type(obj).__name__}({code.co_name})" if code else type(obj).__name__


def read_inputs(request: Any, names: set[str]) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {}
    for name in names:
        t = pb_utils.get_input_tensor_by_name(request, name)
        out[name] = None if t is None else t.as_numpy()
    return out


class EngineModel:
    """Base ``TritonPythonModel``: an :class:`EngineHost` plus Triton plumbing.

    Subclasses set ``INPUTS`` and implement :meth:`handle` (a coroutine serving one parsed
    request) and :meth:`parse` (Triton inputs -> typed request, raising InvalidInput).
    """

    INPUTS: set[str] = set()
    model_dir: Path

    # --------------------------------------------------------------- lifecycle
    def initialize(self, args: dict[str, Any]) -> None:
        prepare_process()
        self.args = args
        self.model_config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.model_dir = Path(args["model_repository"]) / args["model_version"]
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(
                f"{self.name}: config.pbtxt must set model_transaction_policy.decoupled=true"
            )
        self.engine_config = load_engine_config(self.model_dir / "model.json", self.name)
        log.info("%s: engine args from %s (overrides %s): %s", self.name,
                 self.engine_config.source, self.engine_config.overrides or "none",
                 self.engine_config.engine_args)
        self.metrics: Metrics = self._make_metrics()
        self._sinks: weakref.WeakSet[TritonSink] = weakref.WeakSet()
        self._finalized = False
        self.default_max_tokens = int(config_param(self.model_config, "default_max_tokens", "256"))
        self.host = EngineHost(
            self.engine_config.engine_args,
            max_outstanding=int(config_param(self.model_config, "max_outstanding_requests", "0")),
            stat_loggers=[scheduler_stat_logger(self.metrics)],
            on_dead=self._on_engine_dead,
            on_poll=lambda host: self.metrics.set_engine_requests(host.num_running()),
            name=self.name,
        )
        self.setup()
        self.host.start()
        self.watcher = CancelWatcher(self.host)
        self._responses: queue.Queue[Any] = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, name=f"{self.name}-send",
                                        daemon=True)
        self._sender.start()
        self.ready()

    def setup(self) -> None:
        """Hook: adjust ``self.host.engine_args`` before the engine starts.

        The base makes the unit's model (``RUFUS_UNIT_MODEL``) the leader of a multi-node
        unit when RUFUS_NNODES > 1 (rufus/multinode/control.py); overrides should call ``super().setup()``.
        """
        from rufus.multinode.control import attach_leader

        self.unit = attach_leader(self.name, self.host)

    def ready(self) -> None:
        """Hook: the engine is up (e.g. warm-up, loading side artifacts)."""

    def _make_metrics(self) -> Metrics:
        if config_param(self.model_config, "REPORT_CUSTOM_METRICS", "true").lower() != "true":
            return Metrics()
        try:
            return BufferedMetrics(
                TritonMetrics(pb_utils, self.name, str(self.args["model_version"])))
        except Exception as exc:  # noqa: BLE001 - metrics disabled on the server
            log.warning("%s: custom metrics unavailable (%s)", self.name, exc)
            return Metrics()

    def _on_engine_dead(self, err: BaseException) -> None:
        """Unload ourselves so /v2/health/ready and model readiness turn false."""
        try:
            pb_utils.unload_model(self.name)
            log.error("%s: unloading model after engine failure: %s", self.name, err)
        except Exception as exc:  # noqa: BLE001 - needs --model-control-mode=explicit
            log.error("%s: engine failed (%s) and the model could not be unloaded (%s); "
                      "start tritonserver with --model-control-mode=explicit", self.name, err, exc)
            return
        timer = threading.Timer(self.UNLOAD_CHECK_S, self._check_unloaded)
        timer.daemon = True
        timer.start()

    UNLOAD_CHECK_S = 20.0

    def _check_unloaded(self) -> None:
        """Triton finalizes an instance only after every request it handed us is released
        (its response sender gone). If finalize has not come, say what in Python still
        holds senders; none means the hold is on Triton's side."""
        if self._finalized:
            return
        gc.collect()
        live = list(self._sinks)
        holders = sorted({_describe(r) for sink in live for r in gc.get_referrers(sink)
                          if r is not live})
        log.warning("%s: not finalized %.0f s after the unload request; %d response "
                    "sender(s) still alive, held by %s. Restart the server if the model "
                    "stays UNLOADING.", self.name, self.UNLOAD_CHECK_S, len(live),
                    holders or "nothing in Python (Triton side)")

    def finalize(self) -> None:
        self._finalized = True
        log.info("%s: finalizing (outstanding=%d)", self.name, self.host.outstanding)
        self.host.shutdown(timeout=15)
        self._responses.put(None)
        self._sender.join(10)
        self.metrics.close()
        log.info("%s: finalized", self.name)

    # --------------------------------------------------------------- requests
    def _send_loop(self) -> None:
        while True:
            item = self._responses.get()
            if item is None:
                return
            send_now(*item)

    def parameters_json(self, request: Any) -> str | None:
        raw = request.parameters()
        return raw if raw and raw != "{}" else None

    def execute(self, requests: list[Any]) -> None:
        arrival = time.monotonic()
        for request in requests:
            sink = TritonSink(request.get_response_sender(), self._responses)
            self._sinks.add(sink)
            try:
                parsed = self.parse(read_inputs(request, self.INPUTS), self.parameters_json(request))
            except InvalidInput as exc:
                log.info("%s: rejected request: %s", self.name, exc)
                self.metrics.count_request("invalid")
                sink.send(None, ServiceError("INVALID_ARG", str(exc)), True)
                continue
            if not self.host.healthy:
                sink.send(None, ServiceError(
                    "UNAVAILABLE", f"{self.name}: engine unavailable ({self.host.dead_reason})"), True)
                continue
            rid = new_request_id(self.name)
            self.host.submit(self.handle(parsed, sink, arrival, rid))
        return None

    def parse(self, inputs: dict[str, np.ndarray | None], parameters: str | None) -> Any:
        raise NotImplementedError

    async def handle(self, parsed: Any, sink: TritonSink, arrival: float, request_id: str) -> None:
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

