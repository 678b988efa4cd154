"""A unit's load and capacity, read from its leader's Prometheus text, and the weight they
give it at the load balancer (:func:`weight_percent`: load factor x capacity / reference)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.prometheus import prometheus_samples
from rufus.wire import CAPACITY_GAUGES

# The capacity (sequences) that weighs 100 % unless RUFUS_CAPACITY_REFERENCE says otherwise:
# the default model.json's max_num_seqs, so a fleet of default units weighs as before.
DEFAULT_CAPACITY_REFERENCE = 64


@dataclass
class Load:
    outstanding: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    # the assistant's SLO admission (rufus/serving/admission.py): the first answer text a
    # new turn would get now, and the SLO it is admitted against (None: not served here)
    first_token_estimate_s: float | None = None
    first_token_slo_s: float | None = None


# A sequence of this many tokens (bounded by max_model_len) is what the unit's KV cache is
# measured in: a shopping turn here is a prompt with product cards and history (a few hundred
# tokens) plus an answer of up to a few hundred.
TYPICAL_SEQUENCE_TOKENS = 1024
# HAProxy 2.6 turns ``up ready N%`` into weight = initial weight x N / 100 and silently clamps
# it at 256 (its largest server weight; measured with haproxy 2.6.12, tests/integration/
# test_capacity_haproxy.py). render() gives every unit weight 100, so 256 % is the most a
# reply can mean; the agent clamps itself so /load and /metrics show what HAProxy applies.
MAX_WEIGHT_PERCENT = 256


@dataclass
class Capacity:
    """The unit's size, from the ``rufus_engine_*`` gauges its engine exports.

    ``sequences`` is the unit's capacity: the concurrent sequences it runs at full speed,
    ``max_num_seqs`` bounded by how many sequences of :data:`TYPICAL_SEQUENCE_TOKENS`
    (at most ``max_model_len``) its KV cache holds. vLLM batches up to ``max_num_seqs``, but
    a cache too small for them makes it preempt and recompute, so the smaller of the two is
    what the unit sustains. Nodes and parallel degrees are reported, not multiplied in: they
    already show in the KV cache (more nodes, more memory) and in speed, and speed needs no
    weight — ``leastconn`` gives a faster unit more requests by itself, because its streams
    end sooner. A unit serving several models is as big as its first model that reports a
    capacity (``RUFUS_UNIT_MODELS`` order: the unit's own model, rufus_llm, comes first).
    """

    model: str
    max_num_seqs: int
    kv_cache_tokens: int = 0
    max_model_len: int = 0
    nodes: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def sequences(self) -> int:
        if self.kv_cache_tokens <= 0:  # not reported: the batch limit alone
            return max(1, self.max_num_seqs)
        per_seq = min(self.max_model_len or TYPICAL_SEQUENCE_TOKENS, TYPICAL_SEQUENCE_TOKENS)
        return max(1, min(self.max_num_seqs, self.kv_cache_tokens // per_seq))


def parse_load(text: str, models: Sequence[str]) -> Load:
    """Unit load from the leader's Prometheus text, summed over the unit's models.

    KV-cache usage is the maximum across models (each model has its own engine and cache;
    the fullest one is the one that will start queueing)."""
    wanted = set(models)
    sums = {"rufus_requests_outstanding": 0.0, "rufus_requests_waiting": 0.0,
            "rufus_requests_running": 0.0}
    kv = 0.0
    seen = False
    slo: dict[str, float] = {}
    for name, labels, v in prometheus_samples(text):
        if name in SLO_SERIES:  # whichever model serves turns on this unit
            slo[name] = max(slo.get(name, v), v)
            continue
        if name not in sums and name != "rufus_kv_cache_usage_ratio":
            continue
        if labels.get("model") not in wanted:
            continue
        seen = True
        if name == "rufus_kv_cache_usage_ratio":
            kv = max(kv, v)
        else:
            sums[name] += v
    if not seen:
        raise ValueError(f"no rufus_* load series for models {sorted(wanted)} in the metrics")
    return Load(outstanding=sums["rufus_requests_outstanding"],
                waiting=sums["rufus_requests_waiting"],
                running=sums["rufus_requests_running"], kv_cache_usage=kv,
                first_token_estimate_s=slo.get(SLO_SERIES[0]),
                first_token_slo_s=slo.get(SLO_SERIES[1]))


# the assistant's admission gauges: estimate for a new turn now, and its SLO
SLO_SERIES = ("rufus_assistant_first_token_estimate_seconds",
              "rufus_assistant_first_token_slo_seconds")


def slo_factor(load: Load) -> float:
    """1 while a new turn's estimated first answer text is within half the SLO, falling
    linearly to 1 % at the SLO: new conversations (and keyed ones, through the affinity
    backend's bounded load) go to units that can answer them in time, before this one has
    to refuse. 1 when the unit reports no estimate or admission is off."""
    est, slo = load.first_token_estimate_s, load.first_token_slo_s
    if est is None or not slo or slo <= 0:
        return 1.0
    return max(0.01, min(1.0, 2.0 * (slo - est) / slo))


_CAPACITY_FIELDS = {name: key for key, (name, _) in CAPACITY_GAUGES.items()}


def parse_capacity(text: str, models: Sequence[str]) -> Capacity | None:
    """The unit's :class:`Capacity` from the leader's Prometheus text, or None when no model
    of the unit exports one (an older leader, an engine still starting): the weight then
    carries load alone, as before capacities were reported."""
    found: dict[str, dict[str, int]] = {}
    for name, labels, value in prometheus_samples(text):
        key = _CAPACITY_FIELDS.get(name)
        model = labels.get("model")
        if key is None or model is None or model not in models:
            continue
        try:
            found.setdefault(model, {})[key] = int(value)
        except ValueError:  # NaN
            continue
    for model in models:
        got = found.get(model, {})
        if got.get("sequences", 0) > 0:
            return Capacity(model=model, max_num_seqs=got["sequences"],
                            kv_cache_tokens=got.get("kv_cache_tokens", 0),
                            max_model_len=got.get("max_model_len", 0),
                            nodes=got.get("nodes", 1) or 1,
                            tensor_parallel=got.get("tensor_parallel", 1) or 1,
                            pipeline_parallel=got.get("pipeline_parallel", 1) or 1)
    return None


def load_factor(load: Load | None, kv_soft: float = 0.8) -> float:
    """How much of its capacity the unit can still offer, 0.01-1, from its own view of load.

    HAProxy's ``leastconn`` already counts the streams *it* has open to each unit, exactly
    and without lag; this adds what it cannot see: (1) a queue inside the engine
    (``waiting`` > 0 means the batch is full, a new request waits for a slot: scale by
    running / (running + waiting)); (2) KV-cache pressure above ``kv_soft`` (vLLM will
    preempt soon: fall linearly to 10 % at full). Unknown load is 1: load is advice, health
    decides membership.
    """
    if load is None:
        return 1.0
    queue = 1.0
    if load.waiting > 0:
        queue = load.running / (load.running + load.waiting) if load.running > 0 else 0.1
    kv = 1.0
    if load.kv_cache_usage > kv_soft:
        kv = 1.0 - 0.9 * min((load.kv_cache_usage - kv_soft) / (1.0 - kv_soft), 1.0)
    return max(0.01, min(1.0, queue, kv, slo_factor(load)))


def weight_percent(load: Load | None, kv_soft: float = 0.8, *,
                   capacity: Capacity | None = None,
                   reference: int = DEFAULT_CAPACITY_REFERENCE) -> int:
    """HAProxy weight, in % of the configured weight (100): load factor x capacity / reference.

    ``leastconn`` picks the unit with the fewest in-flight streams *per unit of weight*, so a
    weight proportional to capacity gives each unit streams in proportion to the sequences it
    can run (:class:`Capacity`), and the load factor (:func:`load_factor`) takes back what
    it cannot absorb right now. ``reference``: the capacity that weighs 100 %; every agent
    behind one ingress must use the same. Clamped to 1-:data:`MAX_WEIGHT_PERCENT` (a unit
    more than 2.56x the reference weighs as 2.56x: set the reference to the largest unit's
    capacity). Unknown capacity weighs as the reference: load alone, 1-100 %, as before
    capacities were reported.
    """
    factor = load_factor(load, kv_soft)
    if capacity is None:
        return max(1, min(100, round(100 * factor)))
    return max(1, min(MAX_WEIGHT_PERCENT, round(100 * factor * capacity.sequences / reference)))

