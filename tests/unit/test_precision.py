"""Precision by measurement (rufus/machine/precision.py): the choice follows the measured
costs per workload, is kept per CPU and model, and "measured" in a model.json resolves to it
(or to the rule for the CPU class when setup has not measured this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rufus.launch import setup_precision as program
from rufus.machine import cpu as machine
from rufus.machine import precision
from rufus.machine.caches import W8A8_SUFFIX
from rufus.qp import measure
from tests.tiny_models import random_llama

AVX2 = {"avx2", "fma"}
AVX512_BF16 = {"avx2", "fma", "avx512f", "avx512_bf16"}


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    """This module's own tiny model, not conftest.py's: one layer, no heads, a fresh folder
    per test (tests write into it)."""
    random_llama(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                 tie_word_embeddings=True).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_each_workload_takes_its_cheapest_dtype():
    # emulated bf16: multi-row passes slow, one-row decode faster (fewer bytes)
    avx2 = {"bfloat16": {"prefill": 1.8, "decode": 0.034, "verify": 0.6},
            "float32": {"prefill": 0.31, "decode": 0.059, "verify": 0.08}}
    assert precision.choose(avx2) == {"answer": "float32", "planner": "float32"}
    decode_bound = {"bfloat16": {"prefill": 0.30, "decode": 0.02, "verify": 0.1},
                    "float32": {"prefill": 0.25, "decode": 0.04, "verify": 0.05}}
    assert precision.choose(decode_bound) == {"answer": "bfloat16", "planner": "float32"}


def test_rule_without_a_measurement():
    assert precision.rule(AVX2) == "float32"
    assert precision.rule(AVX512_BF16) == "bfloat16"


def test_concrete_dtypes_pass_through_and_measured_resolves(tmp_path, tiny):
    env = {"RUFUS_CACHE_DIR": str(tmp_path / "cache")}
    args = {"model": str(tiny), "dtype": "bfloat16"}
    assert precision.resolve(args, "answer", env) is args
    # nothing measured: the rule for this CPU class
    got = precision.resolve({"model": str(tiny), "dtype": "measured"}, "answer", env)
    assert got["dtype"] == precision.rule(machine.this_cpu(env))
    # measured: the stored choice, per workload
    path = precision.choice_path(tiny, env)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"choice": {"answer": "float32", "planner": "bfloat16"}}))
    assert precision.resolve({"model": str(tiny), "dtype": "measured"}, "answer", env
                             )["dtype"] == "float32"
    assert precision.resolve({"model": str(tiny), "dtype": "measured"}, "planner", env
                             )["dtype"] == "bfloat16"


def test_the_choice_is_keyed_by_cpu_and_model(tmp_path, tiny):
    env = {"RUFUS_CACHE_DIR": str(tmp_path)}
    a = precision.choice_path(tiny, env)
    capped = precision.choice_path(tiny, {**env, "ATEN_CPU_CAPABILITY": "avx2"})
    assert a.parent.parent == tmp_path / "precision"
    if machine.cpu_class(machine.cpu_flags()) not in ("avx2", "baseline", "arm", "arm-sve"):
        assert a.parent != capped.parent  # AVX-512 machine measuring as AVX2: another key
    before = precision.model_fingerprint(tiny)
    (tiny / "rufus-build.json").write_text('{"files": {"model.safetensors": "x"}}')
    assert precision.model_fingerprint(tiny) != before


def test_measure_times_every_pass_in_every_dtype(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path))
    lines: list[str] = []
    res = precision.measure_and_store(tiny, progress=lines.append, timer=measure.time_passes)
    costs = res["seconds_per_pass"]
    assert set(costs) == set(precision.CANDIDATES)
    assert all(set(c) == set(precision.PASSES) and min(c.values()) > 0 for c in costs.values())
    assert set(res["choice"]) == set(precision.WORKLOADS)
    assert len(lines) == len(precision.CANDIDATES) * len(precision.PASSES)
    assert json.loads(precision.choice_path(tiny).read_text())["choice"] == res["choice"]
    # cached: not measured again
    assert precision.measure_and_store(tiny, progress=lines.append, timer=measure.time_passes) == res
    assert len(lines) == len(precision.CANDIDATES) * len(precision.PASSES)


ACC = [[0.88, 0.05, 0.02, 0.01], [0.8, 0.06, 0.03, 0.01], [0.74, 0.07, 0.03, 0.01]]


def test_tree_is_wider_where_passes_are_cheap():
    from rufus.qp.tree import grow_tree, interpolate_cost

    flat = interpolate_cost({1: 1.0, 8: 1.05, 16: 1.1, 32: 1.3})  # width nearly free
    steep = interpolate_cost({1: 1.0, 2: 1.6, 4: 2.4, 8: 4.0, 16: 7.0, 32: 13.0})
    wide, _, wide_speed = grow_tree(ACC, flat, 32)
    narrow, _, narrow_speed = grow_tree(ACC, steep, 32)
    assert len(wide) > len(narrow) >= 1 and wide_speed > narrow_speed


def test_machine_trees_and_the_served_tree(tmp_path, tiny, monkeypatch):
    from rufus.qp.backends import load_tree, measured_tree, served_tree
    from rufus.qp.tree import machine_trees

    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path / "cache"))
    calib = tmp_path / "medusa_tree.json"
    calib.write_text(json.dumps({"num_medusa_heads": 2,
                                 "calibration": {"head_topk_accuracy": ACC}}))
    version = tmp_path / "repo"
    version.mkdir()
    (version / "medusa_tree.json").write_text(json.dumps({"medusa_tree": [[0]]}))
    mj = {"medusa_tree": "measured"}
    # setup not run on this machine: the committed tree
    assert measured_tree({"model": str(tiny), "dtype": "float32"}) == {
        "medusa_tree": "medusa_tree.json"}
    assert served_tree(mj, version, str(tiny), "float32") == [[0]]
    res = precision.measure_and_store(
        tiny, extra=lambda r: machine_trees(tiny, r["seconds_per_pass"], 1,
                                            calibration=calib, max_nodes=4),
        timer=measure.time_passes)
    trees = res["planner_trees"]
    assert set(trees) == set(res["seconds_per_pass"])
    for dtype, rec in trees.items():
        paths = rec["medusa_tree"]
        assert 1 <= len(paths) <= 4 and max(len(p) for p in paths) <= 2
        assert load_tree(paths) == paths
        got = measured_tree({"model": str(tiny), "dtype": dtype})
        assert got == {"medusa_tree": paths, "medusa_speculation_length": len(paths) + 1}
        assert served_tree(mj, version, str(tiny), dtype) == paths


def _tree(nodes: int, tokens: float, costs_ms: dict[int, float]) -> dict:
    return {"medusa_tree": [[0] * (i + 1) for i in range(nodes)],
            "expected_tokens_per_step": tokens, "verify_cost_ms": costs_ms}


def test_planner_choice_weighs_each_dtypes_tree():
    """Fake timings: int8 has the cheapest one-token pass but its cost grows fast with width,
    so its tree is short; bf16's flat cost curve buys a wide tree and wins per plan. The
    pass-cost rule alone (prefill + 8 x verify(16)) would have said the same here; the tree
    model also flips when bf16's wide pass gets dearer."""
    costs = {"bfloat16": {"prefill": 0.09, "decode": 0.036, "verify": 0.041},
             "int8": {"prefill": 0.38, "decode": 0.020, "verify": 0.055}}
    trees = {"bfloat16": _tree(12, 4.7, {1: 36, 16: 40, 32: 60}),
             "int8": _tree(4, 3.5, {1: 20, 2: 22, 4: 25, 8: 34, 16: 55})}
    best, modelled = measure.planner_choice(costs, trees)
    assert best == "bfloat16" and modelled["bfloat16"] < modelled["int8"]
    # per plan: a quarter of the 128-token prefill + 38 tokens / tokens per step x step cost
    assert modelled["int8"] == pytest.approx(
        1e3 * (0.25 * 0.38 + measure.PLAN_TOKENS / 3.5 * (0.025 + (0.034 - 0.025) / 4)), abs=0.1)
    trees["bfloat16"] = _tree(12, 4.7, {1: 36, 16: 90, 32: 150})
    assert measure.planner_choice(costs, trees)[0] == "int8"


def test_the_program_passes_the_models_measurements():
    """The record knows no model: the setup program (``python -m rufus.launch.setup_precision``)
    passes both models' measurements and the forward pass that times them."""
    assert [m.workload for m in program.MEASUREMENTS] == ["answer", "planner"]
    assert program.PLANNER.extra is measure.planner_extra is program.MEASUREMENTS[1].extra
    assert program.ANSWER.extra is None
    assert not hasattr(precision, "MEASUREMENTS") and not hasattr(precision, "register")


def test_setup_measures_each_model_passed_in(tmp_path, monkeypatch):
    """Each registered model's directory with its workload's candidates and its own extra; a
    directory no measurement names is timed as an answer model."""
    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path / "cache"))
    dirs = {name: tmp_path / name for name in ("answer", "planner", "other")}
    for d in dirs.values():
        d.mkdir()
        (d / "config.json").write_text("{}")
    timed: list[tuple[str, str]] = []

    def timer(model_dir: Path, dtype: str, threads: int):
        timed.append((model_dir.name, dtype))
        return lambda n, context, reps: 0.001 * n * (3.0 if dtype == "bfloat16" else 1.0)

    def planner_extra(result, model_dir, threads, progress):
        return {"planner_trees": {}, "choice": {**result["choice"], "planner": "int8"}}

    measured = (precision.Measurement("answer", lambda: dirs["answer"]),
                precision.Measurement("planner", lambda: dirs["planner"], planner_extra))
    assert precision.run([], measured, timer) == 0
    assert timed == [("answer", dt) for dt in precision.WORKLOAD_CANDIDATES["answer"]] + [
        ("planner", dt) for dt in precision.WORKLOAD_CANDIDATES["planner"]]
    planner = precision.stored(dirs["planner"]) or {}
    assert planner["choice"]["planner"] == "int8" and "planner_trees" in planner
    answer = precision.stored(dirs["answer"]) or {}
    assert answer["choice"]["answer"] == "float32" and "planner_trees" not in answer
    timed.clear()
    assert precision.run([dirs["other"]], measured, timer) == 0
    assert timed == [("other", dt) for dt in precision.WORKLOAD_CANDIDATES["answer"]]


def _w8a8_pair(tmp_path: Path, source_sum: str = "abc", built_from: str = "abc") -> Path:
    """A source model dir and its W8A8 copy, as far as their build stamps go."""
    src, copy = tmp_path / "m", tmp_path / f"m{W8A8_SUFFIX}"
    src.mkdir(exist_ok=True)
    copy.mkdir(exist_ok=True)
    (src / "rufus-build.json").write_text(json.dumps({"files": {"model.safetensors": source_sum}}))
    (copy / "rufus-build.json").write_text(json.dumps(
        {"source_files": {"model.safetensors": built_from}}))
    return src


@pytest.mark.parametrize("flags, env, served", [
    ({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}, {}, "copy"),
    ({"avx2", "avx512f", "amx_bf16", "amx_int8"}, {}, "copy"),
    ({"avx2", "fma"}, {}, "source"),                              # no int8 dot products
    ({"avx2", "avx512f", "avx512_vnni"}, {"ATEN_CPU_CAPABILITY": "avx2"}, "source"),
    ({"avx2", "avx512f", "avx512_vnni"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "source"),
])
def test_measured_quantization_serves_the_int8_copy_where_the_cpu_has_int8_dot_products(
        tmp_path, monkeypatch, flags, env, served):
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: set(flags))
    src = _w8a8_pair(tmp_path)
    got = precision.resolve_quantization(
        {"model": str(src), "dtype": "bfloat16", "quantization": "measured"}, "answer", env)
    assert "quantization" not in got and got["dtype"] == "bfloat16"
    want = src.parent / f"m{W8A8_SUFFIX}" if served == "copy" else src
    assert got["model"] == str(want)


def test_a_stale_or_missing_int8_copy_serves_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: {"avx512f", "avx512_vnni"})
    src = _w8a8_pair(tmp_path, source_sum="new", built_from="old")  # source rebuilt since
    args = {"model": str(src), "quantization": "measured"}
    assert precision.resolve_quantization(args, "answer", {})["model"] == str(src)
    (src.parent / f"m{W8A8_SUFFIX}" / "rufus-build.json").unlink()  # half written
    assert precision.resolve_quantization(args, "answer", {})["model"] == str(src)
    # any other value is vLLM's own, passed through as given
    for value in (None, "compressed-tensors"):
        given = {"model": str(src), "quantization": value}
        assert precision.resolve_quantization(given, "answer", {}) is given


def test_lora_adapters_keep_the_source_weights(tmp_path, monkeypatch):
    """vLLM's CPU int8 layers hand their weights to oneDNN and its LoRA layers then fail to
    start: a model with a multi_lora.json (or enable_lora) serves the source weights."""
    from rufus.serving.config import MULTI_LORA_FILE, load_engine_config

    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: {"avx512f", "avx512_vnni"})
    src = _w8a8_pair(tmp_path)
    args = {"model": str(src), "dtype": "bfloat16", "quantization": "measured"}
    assert precision.resolve_quantization(args, "answer", {}, lora=True)["model"] == str(src)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "model.json").write_text(json.dumps(args))
    assert load_engine_config(repo / "model.json", env={}).engine_args["model"] == \
        str(src.parent / f"m{W8A8_SUFFIX}")
    (repo / MULTI_LORA_FILE).write_text('{"a": "a"}')
    assert load_engine_config(repo / "model.json", env={}).engine_args["model"] == str(src)


@pytest.mark.parametrize("flags, env, dtype, kernel, want", [
    ({"avx2", "fma"}, {}, "float32", True, "rufus_int8"),           # AVX2: fp32 otherwise
    ({"avx2", "avx512f", "avx512_vnni"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "float32", True,
     "rufus_int8"),                                                 # emulated AVX2
    ({"avx2", "fma"}, {}, "float32", False, None),                  # the kernel cannot build
    ({"avx2", "fma"}, {}, "bfloat16", True, None),                  # a bf16 model stays bf16
])
def test_a_float32_answer_model_without_int8_dot_products_runs_int8_weight_only(
        tmp_path, monkeypatch, flags, env, dtype, kernel, want):
    """Where the answer model would run in fp32 and the W8A8 copy is not served, its linear
    layers run int8 weight-only through rufus's kernel (vllm_int8.py), if the kernel builds."""
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: set(flags))
    monkeypatch.setattr(precision, "int8_weights_ok", lambda env=None: kernel)
    src = _w8a8_pair(tmp_path)
    got = precision.resolve_quantization(
        {"model": str(src), "dtype": dtype, "quantization": "measured"}, "answer", env)
    assert got.get("quantization") == want and got["model"] == str(src)
    assert got["dtype"] == dtype
    planner = precision.resolve_quantization(
        {"model": str(src), "dtype": dtype, "quantization": "measured"}, "planner", env)
    assert "quantization" not in planner
    lora = precision.resolve_quantization(
        {"model": str(src), "dtype": dtype, "quantization": "measured"}, "answer", env,
        lora=True)
    assert "quantization" not in lora  # vLLM's LoRA layers wrap the float linear layers


def test_loading_settings_that_choose_rufus_int8_registers_it(tmp_path, monkeypatch):
    """vLLM rejects an unknown method's name when it builds its config, in rufus_llm's stub and
    in a follower alike: both load their settings through load_engine_config, which registers
    ``rufus_int8`` when the settings choose it."""
    from rufus.machine import vllm_int8
    from rufus.serving.config import load_engine_config

    calls: list[int] = []
    monkeypatch.setattr(vllm_int8, "register", lambda: calls.append(1) or True)
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: {"avx2", "fma"})
    monkeypatch.setattr(precision, "int8_weights_ok", lambda env=None: True)
    src = _w8a8_pair(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "model.json").write_text(json.dumps(
        {"model": str(src), "dtype": "float32", "quantization": "measured"}))
    assert load_engine_config(repo / "model.json", env={}).engine_args["quantization"] == \
        "rufus_int8"
    assert calls == [1]
    (repo / "model.json").write_text(json.dumps({"model": str(src), "quantization": None}))
    load_engine_config(repo / "model.json", env={})
    assert calls == [1]
