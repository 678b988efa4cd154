"""Unit capacity: what rufus_llm exports from its engine's configuration, how the agent reads
it and folds it into the weight HAProxy routes by (caps, unknown capacity, the reference)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from proxy.agent import (
    MAX_WEIGHT_PERCENT,
    TYPICAL_SEQUENCE_TOKENS,
    AgentConfig,
    Capacity,
    Load,
    Snapshot,
    UnitAgent,
    agent_reply,
    parse_capacity,
    weight_percent,
)
from rufus.env import EnvError
from rufus.serving.metrics import (
    CAPACITY_GAUGES,
    BufferedMetrics,
    EngineCapacity,
    Metrics,
    TritonMetrics,
    scheduler_stat_logger,
)


def vllm_config(seqs: int = 8, blocks: int | None = 100, block: int = 16, nnodes: int = 1,
                tp: int = 1, pp: int = 1, dp: int = 1, max_len: int = 1024) -> SimpleNamespace:
    """The attributes of vLLM's VllmConfig the stat logger reads (names checked below)."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=seqs),
        cache_config=SimpleNamespace(num_gpu_blocks=blocks, block_size=block),
        parallel_config=SimpleNamespace(nnodes=nnodes, tensor_parallel_size=tp,
                                        pipeline_parallel_size=pp, data_parallel_size=dp),
        model_config=SimpleNamespace(max_model_len=max_len))


# ------------------------------------------------------------------ what the leader exports
def test_engine_capacity_from_vllm_config():
    cap = EngineCapacity.from_vllm_config(vllm_config(seqs=8, blocks=3000, block=16, nnodes=2,
                                                      pp=2, dp=2))
    assert cap == EngineCapacity(sequences=16, kv_cache_tokens=48_000, max_model_len=1024,
                                 nodes=2, tensor_parallel=1, pipeline_parallel=2)
    # a cache not sized yet reports 0 tokens, not an error; no scheduler: nothing to report
    assert EngineCapacity.from_vllm_config(vllm_config(blocks=None)).kv_cache_tokens == 0
    assert EngineCapacity.from_vllm_config(SimpleNamespace()) is None


def test_the_vllm_config_names_read_exist_in_vllm():
    """The real config classes carry every attribute ``from_vllm_config`` reads."""
    import dataclasses

    config = pytest.importorskip("vllm.config")
    want = {"SchedulerConfig": {"max_num_seqs"}, "CacheConfig": {"num_gpu_blocks", "block_size"},
            "ParallelConfig": {"nnodes", "tensor_parallel_size", "pipeline_parallel_size",
                               "data_parallel_size"},
            "ModelConfig": {"max_model_len"}}
    for cls, names in want.items():
        fields = {f.name for f in dataclasses.fields(getattr(config, cls))}
        assert names <= fields, (cls, names - fields)


class Family:
    """pb_utils.MetricFamily stand-in that renders Prometheus text like Triton does."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict[str, Family] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.values: dict[str, float] = {}
        Family.made[name] = self

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> SimpleNamespace:
        key = ",".join(f'{k}="{v}"' for k, v in labels.items())
        fam = self

        def put(v: float) -> None:
            fam.values[key] = v

        return SimpleNamespace(set=put, increment=put, observe=put)

    @classmethod
    def text(cls) -> str:
        return "".join(f"{f.name}{{{k}}} {v}\n" for f in cls.made.values()
                       for k, v in f.values.items())


def test_the_stat_logger_exports_capacity_the_agent_reads():
    Family.made = {}
    tm = TritonMetrics(SimpleNamespace(MetricFamily=Family), "rufus_llm", "1")
    assert not any(n in Family.made for n, _ in CAPACITY_GAUGES.values()), \
        "no capacity family before the engine reports one (it would read as 0)"
    scheduler_stat_logger(tm)(vllm_config(seqs=8, blocks=2900, block=16, nnodes=2, pp=2))
    text = Family.text()
    assert 'rufus_engine_capacity_sequences{model="rufus_llm",version="1"} 8' in text
    cap = parse_capacity(text, ["rufus_llm"])
    assert cap == Capacity(model="rufus_llm", max_num_seqs=8, kv_cache_tokens=46_400,
                           max_model_len=1024, nodes=2, tensor_parallel=1, pipeline_parallel=2)
    assert cap.sequences == 8  # 45 sequences of 1024 tokens fit: the batch limit binds
    tm.close()
    assert tm.capacity == {}


def test_buffered_capacity_is_a_gauge():
    class Rec(Metrics):
        def __init__(self) -> None:
            self.caps: list[EngineCapacity] = []

        def set_capacity(self, cap: EngineCapacity) -> None:
            self.caps.append(cap)

    rec = Rec()
    m = BufferedMetrics(rec, interval=60)
    a = EngineCapacity(8, 0, 1024, 1, 1, 1)
    b = EngineCapacity(2, 0, 1024, 1, 1, 1)
    m.set_capacity(a)
    m.set_capacity(b)
    m.close()
    assert rec.caps == [b]


# ------------------------------------------------------------------ what the agent reads
def metrics_text(model: str, seqs: int, kv: int = 0, max_len: int = 2048, nodes: int = 1) -> str:
    lab = f'{{model="{model}",version="1"}}'
    return (f"# HELP rufus_engine_capacity_sequences x\n"
            f"rufus_engine_capacity_sequences{lab} {seqs}\n"
            f"rufus_engine_kv_cache_tokens{lab} {kv}\nrufus_engine_max_model_len{lab} {max_len}\n"
            f"rufus_engine_nodes{lab} {nodes}\nrufus_engine_tensor_parallel_size{lab} 1\n"
            f"rufus_engine_pipeline_parallel_size{lab} {nodes}\n")


def test_parse_capacity_takes_the_units_first_model():
    text = metrics_text("rufus_qp_medusa", 4) + metrics_text("rufus_llm", 64, nodes=2)
    cap = parse_capacity(text, ["rufus_llm", "rufus_qp_medusa"])
    assert cap is not None and cap.model == "rufus_llm" and cap.max_num_seqs == 64
    assert cap.nodes == 2
    # a model the unit does not serve is ignored; none reporting: unknown
    assert parse_capacity(metrics_text("other", 8), ["rufus_llm"]) is None
    assert parse_capacity('rufus_requests_outstanding{model="rufus_llm"} 3\n', ["rufus_llm"]) is None
    assert parse_capacity(metrics_text("rufus_llm", 0), ["rufus_llm"]) is None


@pytest.mark.parametrize("seqs,kv,max_len,want", [
    (8, 0, 2048, 8),                                   # cache size unknown: the batch limit
    (64, 100 * TYPICAL_SEQUENCE_TOKENS, 2048, 64),     # room for 100: the batch limit binds
    (64, 10 * TYPICAL_SEQUENCE_TOKENS, 2048, 10),      # room for 10 typical sequences
    (64, 10 * 256, 256, 10),                           # short context: sequences of max_model_len
    (64, 100, 2048, 1),                                # never below 1
])
def test_capacity_is_the_batch_limit_bounded_by_the_kv_cache(seqs, kv, max_len, want):
    assert Capacity("rufus_llm", seqs, kv, max_len).sequences == want


# ------------------------------------------------------------------ the weight
def cap(n: int) -> Capacity:
    return Capacity("rufus_llm", n)


@pytest.mark.parametrize("load,capacity,reference,want", [
    (None, None, 64, 100),                   # unknown load and capacity: full weight, as before
    (Load(5, 1, 4, 0.2), None, 8, 80),       # unknown capacity: load alone (4 of 5 running)
    (None, cap(8), 8, 100),
    (None, cap(2), 8, 25),
    (Load(5, 1, 4, 0.2), cap(2), 8, 20),     # load factor x capacity / reference
    (None, cap(16), 8, 200),                 # above the reference: more than 100 %
    (None, cap(64), 8, MAX_WEIGHT_PERCENT),  # HAProxy's cap (weight 256 on weight 100)
    (Load(9, 9, 0, 1.0), cap(1), 64, 1),     # never 0 (0 would drain the unit)
    (None, cap(64), 64, 100),                # the default reference: a default unit = 100
])
def test_weight_percent(load, capacity, reference, want):
    assert weight_percent(load, capacity=capacity, reference=reference) == want


def test_agent_reply_carries_capacity():
    snap = Snapshot(checks=[], capacity=cap(2))
    assert agent_reply(snap, stale=False).startswith("down")  # no probe yet: health first
    from proxy.agent import NodeCheck

    snap.checks = [NodeCheck("leader", "server ready", True, "ready")]
    assert agent_reply(snap, False, reference=8) == "up ready 25%\n"
    assert agent_reply(snap, True, reference=8).startswith("down #agent poll stale")


def test_reference_from_the_environment_is_validated():
    assert AgentConfig.from_env({}).capacity_reference == 64
    assert AgentConfig.from_env({"RUFUS_CAPACITY_REFERENCE": "8"}).capacity_reference == 8
    for bad in ("0", "-3", "eight", "1.5"):
        with pytest.raises(EnvError, match="RUFUS_CAPACITY_REFERENCE"):
            AgentConfig.from_env({"RUFUS_CAPACITY_REFERENCE": bad})


# ------------------------------------------------------------------ the agent end to end
LEADER = "http://leader:8000"


class Unit:
    """The agent's probe function over a dict of URL -> (status, body)."""

    def __init__(self, metrics: str) -> None:
        self.answers: dict[str, tuple[int | None, str]] = {
            f"{LEADER}/v2/health/ready": (200, ""),
            f"{LEADER}/v2/models/rufus_llm/ready": (200, ""),
            f"{LEADER}/metrics": (200, metrics),
        }

    def __call__(self, url: str, timeout: float) -> tuple[int | None, str]:
        return self.answers.get(url, (None, "ConnectionRefusedError: refused"))


LOAD = ('rufus_requests_outstanding{model="rufus_llm",version="1"} 1\n'
        'rufus_requests_running{model="rufus_llm",version="1"} 1\n')


def test_agent_reports_capacity_in_load_metrics_and_weight(caplog):
    unit = Unit(LOAD + metrics_text("rufus_llm", 2, kv=46_000, max_len=1024))
    agent = UnitAgent(AgentConfig(leader_http=LEADER, leader_metrics=f"{LEADER}/metrics",
                                  unit="u0", capacity_reference=8), fetch=unit)
    with caplog.at_level("INFO", logger="proxy.agent"):
        agent.poll_once()
    assert "capacity: 2 sequences" in caplog.text
    body = agent.load()
    assert body["capacity"] == 2 and body["capacity_reference"] == 8
    assert body["weight_percent"] == 25 and body["engine"]["kv_cache_tokens"] == 46_000
    json.dumps(body)
    text = agent.metrics()
    assert 'rufus_unit_capacity_sequences{unit="u0"} 2' in text
    assert 'rufus_unit_capacity_reference_sequences{unit="u0"} 8' in text
    assert 'rufus_unit_weight_percent{unit="u0"} 25' in text
    assert agent_reply(*agent.current(), reference=8) == "up ready 25%\n"
    # a poll whose metrics time out keeps the capacity: the unit must not jump to 100 %
    unit.answers[f"{LEADER}/metrics"] = (None, "TimeoutError: timed out")
    agent.poll_once()
    assert agent.load()["capacity"] == 2 and agent.load()["weight_percent"] == 25


def test_agent_without_capacity_gauges_keeps_todays_weight():
    agent = UnitAgent(AgentConfig(leader_http=LEADER, leader_metrics=f"{LEADER}/metrics",
                                  unit="u0", capacity_reference=8), fetch=Unit(LOAD))
    agent.poll_once()
    body = agent.load()
    assert body["capacity"] is None and body["engine"] is None and body["weight_percent"] == 100
    assert "rufus_unit_capacity_sequences" not in agent.metrics()


def test_a_unit_beyond_the_cap_is_warned_about(caplog):
    agent = UnitAgent(AgentConfig(leader_http=LEADER, leader_metrics=f"{LEADER}/metrics",
                                  unit="u0", capacity_reference=8),
                      fetch=Unit(LOAD + metrics_text("rufus_llm", 64)))
    with caplog.at_level("WARNING", logger="proxy.agent"):
        agent.poll_once()
    assert "RUFUS_CAPACITY_REFERENCE" in caplog.text
    assert agent.load()["weight_percent"] == MAX_WEIGHT_PERCENT


# ------------------------------------------------------------------ entrypoints
def test_agent_refuses_a_bad_reference_naming_it():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "proxy.agent"], cwd=root, capture_output=True,
                       text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root),
                            "RUFUS_CAPACITY_REFERENCE": "none"})
    assert r.returncode == 2 and "RUFUS_CAPACITY_REFERENCE" in r.stderr, r.stderr[-1000:]


def test_capacity_bench_summary_and_bar():
    from lab.capacity_bench import summarize

    def phase(policy: str, tok_s: float, p99: float, streams: dict[str, int]) -> dict:
        return {"policy": policy, "wall_s": 10.0, "requests": 20, "output_tok_s": tok_s,
                "ttft_p50_ms": p99 / 4, "ttft_p99_ms": p99, "errors": 0,
                "per_unit_streams": streams}

    s = summarize([phase("capacity", 200, 900, {"unit0": 16, "unit1": 4}),
                   phase("equal", 150, 2000, {"unit0": 10, "unit1": 10}),
                   phase("equal", 150, 2200, {"unit0": 10, "unit1": 10}),
                   phase("capacity", 220, 1100, {"unit0": 15, "unit1": 5})])
    assert s["capacity"]["per_unit_share"] == {"unit0": 0.775, "unit1": 0.225}
    assert s["equal"]["ttft_p99_ms"] == 2100 and s["capacity"]["output_tok_s"] == 210
    assert s["bar_met"] and s["throughput_ratio_capacity_over_equal"] == 1.4


def test_the_default_reference_is_the_default_units_batch_limit():
    """A fleet of default units (model.json) weighs exactly as before capacities existed."""
    from pathlib import Path

    from proxy.agent import DEFAULT_CAPACITY_REFERENCE

    model_json = Path(__file__).resolve().parents[2] / "model_repository/rufus_llm/1/model.json"
    assert json.loads(model_json.read_text())["max_num_seqs"] == DEFAULT_CAPACITY_REFERENCE
    assert weight_percent(None, capacity=cap(DEFAULT_CAPACITY_REFERENCE)) == 100
