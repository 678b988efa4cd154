"""Serving metrics, one interface for both models.

TTFT and inter-token latency are measured where the client sees them (from the moment
Triton hands us the request to the moment a response is queued), not inside vLLM, so they
include our own overhead. Scheduler gauges (running, waiting, KV-cache usage) come from a
vLLM stat logger. ``TritonMetrics`` publishes everything on Triton's Prometheus endpoint,
labelled by model and version.

Alongside our ``rufus_*`` families, the ``vllm:*`` families of the official Triton vLLM
backend (same names, descriptions, kinds, buckets and model/version labels, fed from vLLM's
iteration stats as it does) so existing dashboards keep working, plus vLLM's own
``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` gauges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rufus.machine import cpu as machine
from rufus.wire import CAPACITY_GAUGES  # EngineCapacity field -> (family, description)

TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0]
ITL_BUCKETS = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5]
LATENCY_BUCKETS = [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]

# The official backend's vllm:* histograms (src/utils/metrics.py there).
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0]
VLLM_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
VLLM_E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
VLLM_N_BUCKETS = [1, 2, 5, 10, 20]


def buckets_1_2_5(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's build_1_2_5_buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


@dataclass
class VllmIteration:
    """What the official backend reports from one vLLM ``IterationStats``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    request_prompt_tokens: list[int] = field(default_factory=list)
    request_generation_tokens: list[int] = field(default_factory=list)
    n: list[int] = field(default_factory=list)

    @classmethod
    def from_stats(cls, it: Any) -> VllmIteration:
        done = list(getattr(it, "finished_requests", None) or [])
        return cls(
            prompt_tokens=int(getattr(it, "num_prompt_tokens", 0) or 0),
            generation_tokens=int(getattr(it, "num_generation_tokens", 0) or 0),
            ttft=list(getattr(it, "time_to_first_tokens_iter", None) or []),
            tpot=list(getattr(it, "inter_token_latencies_iter", None) or []),
            e2e=[r.e2e_latency for r in done],
            request_prompt_tokens=[r.num_prompt_tokens for r in done],
            request_generation_tokens=[r.num_generation_tokens for r in done],
            n=list(getattr(it, "n_params_iter", None) or []),
        )


@dataclass(frozen=True)
class EngineCapacity:
    """What the engine was configured and sized to hold, read once from vLLM's config.

    Exported so the unit agent (proxy/agent.py) can weigh units of different sizes against
    each other; the agent, not the leader, turns these into one capacity figure.
    ``kv_cache_tokens`` is 0 when vLLM has not sized its cache (never after start-up: the
    engine client learns ``num_gpu_blocks`` in its handshake, before stat loggers exist).
    """

    sequences: int  # max_num_seqs x data-parallel engines: the most it batches at once
    kv_cache_tokens: int  # num_gpu_blocks x block_size (summed over data-parallel engines)
    max_model_len: int
    nodes: int
    tensor_parallel: int
    pipeline_parallel: int

    @classmethod
    def from_vllm_config(cls, cfg: Any) -> EngineCapacity | None:
        """None for a config without a scheduler (nothing to report)."""
        sched = getattr(cfg, "scheduler_config", None)
        if sched is None or not getattr(sched, "max_num_seqs", None):
            return None
        par = getattr(cfg, "parallel_config", None)
        cache = getattr(cfg, "cache_config", None)
        model = getattr(cfg, "model_config", None)

        def num(obj: Any, name: str, default: int = 0) -> int:
            value = getattr(obj, name, None)
            return int(value) if value else default

        return cls(
            sequences=int(sched.max_num_seqs) * num(par, "data_parallel_size", 1),
            kv_cache_tokens=num(cache, "num_gpu_blocks") * num(cache, "block_size"),
            max_model_len=num(model, "max_model_len"),
            nodes=num(par, "nnodes", 1),
            tensor_parallel=num(par, "tensor_parallel_size", 1),
            pipeline_parallel=num(par, "pipeline_parallel_size", 1),
        )


class Metrics:
    """No-op base: used in unit tests and when the server runs with metrics disabled."""

    def observe_ttft(self, seconds: float) -> None: ...
    def observe_itl(self, seconds: float, tokens: int = 1) -> None: ...
    def observe_latency(self, seconds: float) -> None: ...
    def add_tokens(self, prompt: int, generation: int) -> None: ...
    def count_request(self, outcome: str) -> None: ...
    def set_outstanding(self, n: int) -> None: ...
    def set_scheduler(self, running: int, waiting: int, kv_usage: float) -> None: ...
    def set_engine_requests(self, n: int) -> None: ...
    def set_capacity(self, cap: EngineCapacity) -> None: ...
    def init_vllm(self, max_model_len: int) -> None: ...
    def record_vllm(self, it: VllmIteration) -> None: ...
    def record_prefix_cache(self, queries: int, hits: int) -> None: ...
    def close(self) -> None: ...


class TritonMetrics(Metrics):
    """Custom metric families through the Python backend's ``pb_utils.MetricFamily``."""

    def __init__(self, pb_utils: Any, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        fam = pb_utils.MetricFamily
        self._families: list[Any] = []

        def family(name: str, desc: str, kind: Any) -> Any:
            f = fam(name=name, description=desc, kind=kind)
            self._families.append(f)
            return f

        self._fam = fam
        hist = fam.HISTOGRAM
        self.ttft = family("rufus_time_to_first_token_seconds", "Time to first token", hist
                           ).Metric(labels=labels, buckets=TTFT_BUCKETS)
        self.itl = family("rufus_inter_token_latency_seconds", "Inter-token latency", hist
                          ).Metric(labels=labels, buckets=ITL_BUCKETS)
        self.latency = family("rufus_request_latency_seconds", "End-to-end request latency",
                              hist).Metric(labels=labels, buckets=LATENCY_BUCKETS)
        self.prompt_tokens = family("rufus_prompt_tokens_total", "Prompt tokens processed",
                                    fam.COUNTER).Metric(labels=labels)
        self.gen_tokens = family("rufus_generation_tokens_total", "Tokens generated",
                                 fam.COUNTER).Metric(labels=labels)
        self._requests = family("rufus_requests_total", "Finished requests by outcome",
                                fam.COUNTER)
        self._request_metrics: dict[str, Any] = {}
        self._labels = labels
        gauge = fam.GAUGE
        self.outstanding = family("rufus_requests_outstanding",
                                  "Requests admitted and not finished (admission control)",
                                  gauge).Metric(labels=labels)
        self.running = family("rufus_requests_running", "Requests running in vLLM", gauge
                              ).Metric(labels=labels)
        self.waiting = family("rufus_requests_waiting", "Requests waiting in vLLM", gauge
                              ).Metric(labels=labels)
        self.engine_reqs = family("rufus_engine_requests",
                                  "Requests vLLM holds (running + waiting), sampled every 0.5 s",
                                  gauge).Metric(labels=labels)
        self.kv = family("rufus_kv_cache_usage_ratio", "KV-cache usage (0-1)", gauge
                         ).Metric(labels=labels)
        self._family = family
        # which CPU class this model's figures come from (rufus/machine/cpu.py)
        cpu = {k: v for k, v in machine.describe().items() if k != "flags"}
        self.cpu_info = family("rufus_cpu_info", "This machine's CPU class, native bf16 and "
                               "cores (value 1)", gauge).Metric(labels={**labels, **cpu})
        self.cpu_info.set(1)
        self.vllm: dict[str, Any] = {}
        self.capacity: dict[str, Any] = {}  # rufus_engine_* capacity gauges, once known
        # vLLM's own gauge names (the official backend does not report these)
        self.vllm_running = family("vllm:num_requests_running",
                                   "Number of requests in model execution batches.", gauge
                                   ).Metric(labels=labels)
        self.vllm_waiting = family("vllm:num_requests_waiting",
                                   "Number of requests waiting to be processed.", gauge
                                   ).Metric(labels=labels)
        # vLLM's prefix-cache counters (tokens): the hit rate conversation affinity buys
        self.prefix_queries = family("vllm:prefix_cache_queries_total",
                                     "Prefix cache queries, in terms of number of queried "
                                     "tokens.", fam.COUNTER).Metric(labels=labels)
        self.prefix_hits = family("vllm:prefix_cache_hits_total",
                                  "Prefix cache hits, in terms of number of cached tokens.",
                                  fam.COUNTER).Metric(labels=labels)

    def init_vllm(self, max_model_len: int) -> None:
        """The official backend's vllm:* families; created once vLLM says max_model_len."""
        if self.vllm:
            return
        fam, labels = self._family, self._labels
        kinds = self._fam
        counter, hist = kinds.COUNTER, kinds.HISTOGRAM
        tokens = buckets_1_2_5(max_model_len)
        spec = [
            ("prompt_tokens", "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
             counter, None),
            ("generation_tokens", "vllm:generation_tokens_total",
             "Number of generation tokens processed.", counter, None),
            ("ttft", "vllm:time_to_first_token_seconds",
             "Histogram of time to first token in seconds.", hist, VLLM_TTFT_BUCKETS),
            ("tpot", "vllm:time_per_output_token_seconds",
             "Histogram of time per output token in seconds.", hist, VLLM_TPOT_BUCKETS),
            ("e2e", "vllm:e2e_request_latency_seconds",
             "Histogram of end to end request latency in seconds.", hist, VLLM_E2E_BUCKETS),
            ("request_prompt_tokens", "vllm:request_prompt_tokens",
             "Number of prefill tokens processed.", hist, tokens),
            ("request_generation_tokens", "vllm:request_generation_tokens",
             "Number of generation tokens processed.", hist, tokens),
            ("n", "vllm:request_params_n", "Histogram of the n request parameter.", hist,
             VLLM_N_BUCKETS),
        ]
        for key, name, desc, kind, buckets in spec:
            f = fam(name, desc, kind)
            self.vllm[key] = (f.Metric(labels=labels) if buckets is None
                              else f.Metric(labels=labels, buckets=buckets))

    def record_vllm(self, it: VllmIteration) -> None:
        if not self.vllm:
            return
        for key in ("prompt_tokens", "generation_tokens"):
            value = getattr(it, key)
            if value:
                self.vllm[key].increment(value)
        for key in ("ttft", "tpot", "e2e", "request_prompt_tokens",
                    "request_generation_tokens", "n"):
            for value in getattr(it, key):
                self.vllm[key].observe(value)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_itl(self, seconds: float, tokens: int = 1) -> None:
        per = seconds / max(tokens, 1)
        for _ in range(max(tokens, 1)):
            self.itl.observe(per)

    def observe_latency(self, seconds: float) -> None:
        self.latency.observe(seconds)

    def add_tokens(self, prompt: int, generation: int) -> None:
        if prompt:
            self.prompt_tokens.increment(prompt)
        if generation:
            self.gen_tokens.increment(generation)

    def count_request(self, outcome: str) -> None:
        m = self._request_metrics.get(outcome)
        if m is None:
            m = self._requests.Metric(labels={**self._labels, "outcome": outcome})
            self._request_metrics[outcome] = m
        m.increment(1)

    def set_outstanding(self, n: int) -> None:
        self.outstanding.set(n)

    def set_capacity(self, cap: EngineCapacity) -> None:
        """Created on first report, so no scrape shows a capacity of 0 before the engine
        has one (a reader could take 0 for a unit that can take nothing)."""
        for key, (name, desc) in CAPACITY_GAUGES.items():
            if key not in self.capacity:
                self.capacity[key] = self._family(name, desc, self._fam.GAUGE).Metric(
                    labels=self._labels)
            self.capacity[key].set(getattr(cap, key))

    def record_prefix_cache(self, queries: int, hits: int) -> None:
        if queries:
            self.prefix_queries.increment(queries)
        if hits:
            self.prefix_hits.increment(hits)

    def close(self) -> None:
        """Drop metrics, then families, while the stub's shared memory still exists.

        Left to interpreter shutdown, MetricFamily destructors touch freed shared memory and
        the stub segfaults on exit (seen with Triton 2.51)."""
        self.set_outstanding = lambda n: None  # type: ignore[method-assign]
        self.set_scheduler = lambda *a: None  # type: ignore[method-assign]
        self.set_engine_requests = lambda n: None  # type: ignore[method-assign]
        self.set_capacity = lambda cap: None  # type: ignore[method-assign]
        self.capacity.clear()
        for name in ("ttft", "itl", "latency", "prompt_tokens", "gen_tokens", "outstanding",
                     "running", "waiting", "kv", "engine_reqs", "vllm_running", "vllm_waiting",
                     "prefix_queries", "prefix_hits"):
            setattr(self, name, None)
        self.record_vllm = lambda it: None  # type: ignore[method-assign]
        self.record_prefix_cache = lambda queries, hits: None  # type: ignore[method-assign]
        self.vllm.clear()
        self._request_metrics.clear()
        self._requests = None
        self._families.clear()
        import gc

        gc.collect()

    def set_engine_requests(self, n: int) -> None:
        self.engine_reqs.set(n)

    def set_scheduler(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv.set(kv_usage)
        self.vllm_running.set(running)
        self.vllm_waiting.set(waiting)


# estimate minus measured, seconds: positive is a pessimistic estimate (refuses too early),
# negative an optimistic one (admits what will be late)
ADMISSION_ERROR_BUCKETS = [-2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0]


class AdmissionMetrics:
    """An SLO-admitting model's families (rufus/serving/admission.py): what a new request
    would get now (the unit agent routes on it), the estimate's error per admitted request,
    and the SLO it is compared with. ``prefix`` names them (``rufus_assistant_first_token``,
    ``rufus_qp_plan``); ``what`` is the measured latency, in words."""

    def __init__(self, pb_utils: Any, prefix: str, what: str, labels: dict[str, str],
                 slo_s: float) -> None:
        fam = pb_utils.MetricFamily
        self.families = [
            fam(name=f"{prefix}_estimate_seconds",
                description=f"Admission: the {what} a new request would get now, from the "
                            "live queue (refused above the SLO; rufus/serving/admission.py)",
                kind=fam.GAUGE),
            fam(name=f"{prefix}_estimate_error_seconds",
                description=f"Admission: estimate minus measured {what}, per admitted request",
                kind=fam.HISTOGRAM),
            fam(name=f"{prefix}_slo_seconds",
                description=f"Admission: the {what} SLO new requests are admitted against "
                            "(0: admission off); the unit agent compares the estimate with it",
                kind=fam.GAUGE)]
        self.estimate_metric = self.families[0].Metric(labels=labels)
        self.error_metric = self.families[1].Metric(labels=labels,
                                                    buckets=ADMISSION_ERROR_BUCKETS)
        self.slo_metric = self.families[2].Metric(labels=labels)
        self.slo_metric.set(slo_s)

    def estimate(self, seconds: float) -> None:
        self.estimate_metric.set(seconds)

    def estimate_error(self, seconds: float) -> None:
        self.error_metric.observe(seconds)

    def close(self) -> None:
        """Metrics, then families (see :meth:`TritonMetrics.close`)."""
        self.estimate_metric = self.error_metric = self.slo_metric = None
        self.families.clear()


class MetricBuffer:
    """Keeps Triton metric IPC off the serving loop, for any metrics object.

    Every ``pb_utils`` metric update is a round trip to the Triton process; done per token
    on an event loop it delays every stream. Here the loop only appends to a deque (atomic
    under the GIL) and a daemon thread replays the calls on ``inner`` every ``interval``
    seconds; a gauge keeps only its latest value.
    """

    def __init__(self, inner: Any, interval: float = 0.5, name: str = "rufus-metrics") -> None:
        import collections
        import threading

        self.inner = inner
        self.interval = interval
        self._events: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self._gauges: dict[str, tuple[Any, ...]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def event(self, method: str, *args: Any) -> None:
        """Replay ``inner.<method>(*args)`` later, in order."""
        self._events.append((method, args))

    def gauge(self, method: str, *args: Any) -> None:
        """Replay ``inner.<method>(*args)`` later; a newer call replaces an older one."""
        self._gauges[method] = args

    def flush(self) -> None:
        while self._events:
            name, args = self._events.popleft()
            getattr(self.inner, name)(*args)
        for name in list(self._gauges):
            args = self._gauges.pop(name)
            getattr(self.inner, name)(*args)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # metrics must never take the model down
                import logging

                logging.getLogger("rufus.serving.metrics").exception("metrics flush failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self.flush()
        finally:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()


class BufferedMetrics(Metrics):
    """:class:`Metrics` through a :class:`MetricBuffer`: the hot path never waits on IPC."""

    def __init__(self, inner: Metrics, interval: float = 0.5) -> None:
        self.inner = inner
        self.buffer = MetricBuffer(inner, interval)

    def observe_ttft(self, seconds: float) -> None:
        self.buffer.event("observe_ttft", seconds)

    def observe_itl(self, seconds: float, tokens: int = 1) -> None:
        self.buffer.event("observe_itl", seconds, tokens)

    def observe_latency(self, seconds: float) -> None:
        self.buffer.event("observe_latency", seconds)

    def add_tokens(self, prompt: int, generation: int) -> None:
        self.buffer.event("add_tokens", prompt, generation)

    def count_request(self, outcome: str) -> None:
        self.buffer.event("count_request", outcome)

    def set_outstanding(self, n: int) -> None:
        self.buffer.gauge("set_outstanding", n)

    def set_scheduler(self, running: int, waiting: int, kv_usage: float) -> None:
        self.buffer.gauge("set_scheduler", running, waiting, kv_usage)

    def set_engine_requests(self, n: int) -> None:
        self.buffer.gauge("set_engine_requests", n)

    def set_capacity(self, cap: EngineCapacity) -> None:
        self.buffer.gauge("set_capacity", cap)

    def init_vllm(self, max_model_len: int) -> None:
        self.buffer.event("init_vllm", max_model_len)

    def record_vllm(self, it: VllmIteration) -> None:
        self.buffer.event("record_vllm", it)

    def record_prefix_cache(self, queries: int, hits: int) -> None:
        self.buffer.event("record_prefix_cache", queries, hits)

    def flush(self) -> None:
        self.buffer.flush()

    def close(self) -> None:
        self.buffer.close()


def scheduler_stat_logger(metrics: Metrics) -> Any:
    """A vLLM stat-logger factory that forwards scheduler and iteration stats to ``metrics``
    (the official backend's vllm:* families come from the iteration stats)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SchedulerLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index
            try:
                metrics.init_vllm(int(vllm_config.model_config.max_model_len))
            except AttributeError:  # a config without a model: no vllm:* token histograms
                pass
            # the engine's configured size, for the unit agent's capacity weight; vLLM has
            # sized the KV cache by now (num_gpu_blocks comes in the engine handshake, which
            # AsyncLLM completes before it builds its stat loggers)
            cap = EngineCapacity.from_vllm_config(vllm_config)
            if cap is not None:
                metrics.set_capacity(cap)

        def record(self, scheduler_stats: Any, iteration_stats: Any = None,
                   *args: Any, **kwargs: Any) -> None:
            if iteration_stats is not None:
                metrics.record_vllm(VllmIteration.from_stats(iteration_stats))
            if scheduler_stats is None:
                return
            pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
            if pcs is not None and (pcs.queries or pcs.hits):
                metrics.record_prefix_cache(int(pcs.queries), int(pcs.hits))
            metrics.set_scheduler(
                int(getattr(scheduler_stats, "num_running_reqs", 0)),
                int(getattr(scheduler_stats, "num_waiting_reqs", 0)),
                float(getattr(scheduler_stats, "kv_cache_usage", 0.0)),
            )

        def log_engine_initialized(self) -> None:
            pass

    return _SchedulerLogger
