"""BufferedMetrics replays hot-path updates into the real sink off the event loop."""

from rufus.serving.metrics import BufferedMetrics, Metrics


class Recorder(Metrics):
    def __init__(self):
        self.calls = []
        self.closed = False

    def observe_ttft(self, seconds):
        self.calls.append(("ttft", seconds))

    def add_tokens(self, prompt, generation):
        self.calls.append(("tokens", prompt, generation))

    def set_outstanding(self, n):
        self.calls.append(("outstanding", n))

    def close(self):
        self.closed = True


def test_events_kept_in_order_gauges_keep_latest_value():
    rec = Recorder()
    m = BufferedMetrics(rec, interval=60)  # flush only on close
    m.observe_ttft(0.1)
    m.set_outstanding(3)
    m.add_tokens(5, 7)
    m.set_outstanding(1)
    assert rec.calls == []  # nothing reached the sink on the hot path
    m.close()
    assert rec.calls == [("ttft", 0.1), ("tokens", 5, 7), ("outstanding", 1)]
    assert rec.closed


# ------------------------------------------------------------ vllm:* (official backend names)

class FakeMetric:
    def __init__(self, family, labels, buckets=None):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.values: list[float] = []

    def increment(self, v):
        self.values.append(v)

    def observe(self, v):
        self.values.append(v)

    def set(self, v):
        self.values = [v]


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeMetric] = []
        FakeFamily.made[name] = self

    def Metric(self, labels, buckets=None):
        m = FakeMetric(self, labels, buckets)
        self.metrics.append(m)
        return m


class FakePbUtils:
    MetricFamily = FakeFamily


# What the official backend reports (src/utils/metrics.py, README "Triton Metrics").
OFFICIAL = {
    "vllm:prompt_tokens_total": ("counter", None),
    "vllm:generation_tokens_total": ("counter", None),
    "vllm:time_to_first_token_seconds": (
        "histogram", [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                      2.5, 5.0, 7.5, 10.0]),
    "vllm:time_per_output_token_seconds": (
        "histogram", [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]),
    "vllm:e2e_request_latency_seconds": (
        "histogram", [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]),
    "vllm:request_prompt_tokens": ("histogram", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]),
    "vllm:request_generation_tokens": ("histogram", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]),
    "vllm:request_params_n": ("histogram", [1, 2, 5, 10, 20]),
}


def test_vllm_families_match_the_official_backend():
    from types import SimpleNamespace

    from rufus.serving.metrics import TritonMetrics, VllmIteration, scheduler_stat_logger

    FakeFamily.made = {}
    tm = TritonMetrics(FakePbUtils, "m", "1")
    logger = scheduler_stat_logger(tm)(SimpleNamespace(model_config=SimpleNamespace(
        max_model_len=1024)))
    for name, (kind, buckets) in OFFICIAL.items():
        fam = FakeFamily.made[name]
        assert fam.kind == kind, name
        (metric,) = fam.metrics
        assert metric.labels == {"model": "m", "version": "1"}
        assert metric.buckets == buckets, name
    finished = SimpleNamespace(e2e_latency=1.5, num_prompt_tokens=7, num_generation_tokens=3)
    it = SimpleNamespace(num_prompt_tokens=7, num_generation_tokens=3,
                         time_to_first_tokens_iter=[0.2], inter_token_latencies_iter=[0.03, 0.04],
                         finished_requests=[finished], n_params_iter=[1])
    sched = SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5)
    logger.record(sched, it)
    got = {n: FakeFamily.made[n].metrics[0].values for n in OFFICIAL}
    assert got["vllm:prompt_tokens_total"] == [7]
    assert got["vllm:time_per_output_token_seconds"] == [0.03, 0.04]
    assert got["vllm:e2e_request_latency_seconds"] == [1.5]
    assert got["vllm:request_params_n"] == [1]
    assert FakeFamily.made["vllm:num_requests_running"].metrics[0].values == [2]
    assert FakeFamily.made["vllm:num_requests_waiting"].metrics[0].values == [1]
    assert VllmIteration.from_stats(SimpleNamespace()).prompt_tokens == 0
    tm.close()
