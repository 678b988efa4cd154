"""Per-instance-type cell configuration (deploy/instance_types.toml): the source's Inf2 TP24 /
Trn1 TP32 cells, validation that names the type and field, and every deploy file that carries
a type's settings agrees with the data (LWS manifests rendered from it; compose, ECS checked)."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from deploy import contract as C
from deploy.instance_types import DEFAULT_PATH, InstanceTypeError, load, main, parse

ROOT = Path(__file__).resolve().parents[2]
RAW = tomllib.loads(DEFAULT_PATH.read_text())


def _render_module():
    spec = importlib.util.spec_from_file_location("lws_render", ROOT / "deploy/kubernetes/manifests.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_sources_neuron_types():
    types = load()
    inf2, trn1 = types["inf2.48xlarge"], types["trn1.32xlarge"]
    assert (inf2.accelerator, inf2.tensor_parallel, inf2.slots_per_node) == ("neuron", 24, 24)
    assert (trn1.accelerator, trn1.tensor_parallel, trn1.slots_per_node) == ("neuron", 32, 32)
    assert inf2.nodes_per_cell == 1 and trn1.nodes_per_cell == 2 and trn1.efa_per_node == 8
    # same image for both (same Neuron SDK): only the parallel degree and size differ
    assert inf2.accel.image == trn1.accel.image
    assert types.capacity_reference == max(t.capacity for t in types.types.values())
    assert types.relative_weight("inf2.48xlarge") == round(100 * inf2.capacity / trn1.capacity)
    assert types.rendered("trn1.32xlarge")["env"]["RUFUS_RUFUS_LLM_ENGINE_ARGS"] == json.dumps(
        {"tensor_parallel_size": 32, "pipeline_parallel_size": 2, **trn1.engine_args})
    assert C.INSTANCE_TYPES == str(DEFAULT_PATH.relative_to(ROOT))


def bad(type_name: str, **changes) -> dict:
    data = copy.deepcopy(RAW)
    entry = data["types"][type_name]
    for k, v in changes.items():
        if v is None:
            entry.pop(k)
        elif k == "engine_args" and isinstance(v, dict) and v.pop("_merge", False):
            entry[k] = {**entry[k], **v}
        else:
            entry[k] = v
    return data


@pytest.mark.parametrize("type_name,changes,where,words", [
    ("inf2.48xlarge", {"tensor_parallel": 48}, "tensor_parallel", "24 NeuronCores"),
    ("inf2.48xlarge", {"tensor_parallel": 16}, "tensor_parallel", "divide"),
    ("trn1.32xlarge", {"nodes_per_cell": 3}, "pipeline_parallel", "spread evenly"),
    ("trn1.32xlarge", {"pipeline_parallel": 3}, "pipeline_parallel", "put 48 on each"),
    ("trn1.32xlarge", {"accelerator": "tpu"}, "accelerator", "unknown accelerator 'tpu'"),
    ("trn1.32xlarge", {"tensor_parallel": None}, "tensor_parallel", "missing"),
    ("cpu", {"nodes_per_cell": None}, "nodes_per_cell", "missing"),
    ("cpu", {"engine_args": {}}, "engine_args.max_num_seqs", "capacity"),
    ("cpu", {"engine_args": {"max_num_seqs": 0}}, "engine_args.max_num_seqs", ">= 1"),
    ("cpu", {"engine_args": {"_merge": True, "tensor_parallel_size": 2}},
     "engine_args.tensor_parallel_size", "tensor_parallel"),
    ("cpu", {"engine_args": {"_merge": True, "node_rank": 1}}, "engine_args.node_rank",
     "topology"),
    ("cpu", {"tensor_parallell": 1}, "tensor_parallell", "unknown field"),
    ("cpu", {"nodes_per_cell": "2"}, "nodes_per_cell", "expected int"),
    ("cpu", {"devices_per_node": 1}, "devices_per_node", "no devices"),
    ("cpu", {"nodes_per_cell": 4}, "nodes_per_cell", "would run nothing"),
    ("cpu", {"memory": "8G"}, "memory", "Gi"),
    ("cpu", {"memory_limit": "4Gi"}, "memory_limit", "below the request"),
    ("cpu", {"manifest": "Neuron_Inf2"}, "manifest", "lowercase"),
    ("cuda", {"manifest": "cpu"}, "manifest", "also 'cpu'"),
    ("trn1.32xlarge", {"efa_per_node": None}, "efa_per_node", "EFA"),
    ("cuda", {"devices_per_node": 0}, "devices_per_node", "at least one device"),
])
def test_validation_names_type_and_field(type_name, changes, where, words):
    with pytest.raises(InstanceTypeError) as e:
        parse(bad(type_name, **changes), "deploy/instance_types.toml")
    msg = str(e.value)
    key = f'"{type_name}"' if "." in type_name else type_name
    assert msg.startswith(f"deploy/instance_types.toml: types.{key}.{where}: "), msg
    assert words in msg, msg
    assert (e.value.type_name, e.value.field) == (type_name, where)


def test_file_level_errors_name_the_file(tmp_path):
    f = tmp_path / "types.toml"
    f.write_text("[types.cpu\n")
    with pytest.raises(InstanceTypeError, match=r"types\.toml: types: not valid TOML"):
        load(f)
    with pytest.raises(InstanceTypeError, match="cannot read"):
        load(tmp_path / "missing.toml")
    with pytest.raises(InstanceTypeError, match="no \\[types"):
        parse({"types": {}})
    with pytest.raises(InstanceTypeError, match="unknown top-level"):
        parse({"types": RAW["types"], "typo": 1})
    with pytest.raises(KeyError, match="known: cpu"):
        load()["m5.large"]


def test_checked_in_manifests_are_the_rendering():
    render = _render_module()
    types = load()
    files = render.outputs(types)
    assert {p.name for p in files} == {p.name for p in (ROOT / "deploy/kubernetes").glob("lws-*.yaml")}
    for path, text in files.items():
        assert path.read_text() == text, f"{path.name} is stale: run deploy/kubernetes/manifests.py"
    for name, t in types.types.items():
        m = yaml.safe_load((ROOT / f"deploy/kubernetes/lws-{t.manifest}.yaml").read_text())
        lwt = m["spec"]["leaderWorkerTemplate"]
        assert lwt["size"] == t.nodes_per_cell, name
        assert m["metadata"]["annotations"]["rufus.dev/capacity-sequences"] == str(t.capacity)
        leader, agent = lwt["leaderTemplate"]["spec"]["containers"][:2]
        env = {e["name"]: e.get("value") for e in leader["env"]}
        assert json.loads(env["RUFUS_RUFUS_LLM_ENGINE_ARGS"]) == t.rendered_engine_args()
        agent_env = {e["name"]: e.get("value") for e in agent["env"]}
        assert agent_env["RUFUS_CAPACITY_REFERENCE"] == str(types.capacity_reference)
        followers = [u for u in (agent_env.get("RUFUS_FOLLOWER_HEALTH_URLS") or "").split(",") if u]
        assert len(followers) == t.nodes_per_cell - 1, name  # the agent probes every follower
        spec = lwt["workerTemplate"]["spec"]
        assert spec["nodeSelector"] == t.node_selector
        res = spec["containers"][0]["resources"]["limits"]
        if t.accel.resource:
            assert res[t.accel.resource] == str(t.devices_per_node), name


def env_of(container: dict, key: str = "environment") -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get(key, []) if "value" in e}


def test_compose_rig_runs_the_cpu_type():
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    t = load()["cpu"]
    for svc in ("leader", "follower"):
        env = compose["services"][svc]["environment"]
        assert json.loads(env["RUFUS_RUFUS_LLM_ENGINE_ARGS"]) == t.rendered_engine_args(), svc
        assert env["LWS_GROUP_SIZE"] == str(t.nodes_per_cell), svc
        for k, v in t.env.items():  # compose's ${VAR:-default}: the default is what runs
            assert re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", str(env[k])) == v, (svc, k)


def test_ecs_task_definitions_run_the_trn1_type():
    t = load()["trn1.32xlarge"]
    for fam in ("leader", "follower"):
        td = json.loads((ROOT / f"deploy/ecs/{fam}-taskdef.json").read_text())
        assert f"ecs.instance-type == {t.name}" in json.dumps(td["placementConstraints"])
        node = next(c for c in td["containerDefinitions"] if c["name"] == fam)
        env = env_of(node)
        assert json.loads(env["RUFUS_RUFUS_LLM_ENGINE_ARGS"]) == t.rendered_engine_args(), fam
        assert env["LWS_GROUP_SIZE"] == str(t.nodes_per_cell), fam
        assert len(node.get("linuxParameters", {}).get("devices", [])) == t.devices_per_node, fam


def test_cli(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "inf2.48xlarge" in out and "trn1.32xlarge" in out and "RUFUS_CAPACITY_REFERENCE" in out
    assert main(["check"]) == 0
    assert main(["render", "inf2.48xlarge", "--format", "env"]) == 0
    assert "RUFUS_RUFUS_LLM_ENGINE_ARGS='{\"tensor_parallel_size\": 24" in capsys.readouterr().out
    broken = tmp_path / "t.toml"
    broken.write_text(DEFAULT_PATH.read_text().replace("tensor_parallel = 24",
                                                       "tensor_parallel = 25"))
    assert main(["--file", str(broken), "check"]) == 1
    assert 'types."inf2.48xlarge".tensor_parallel' in capsys.readouterr().err
    assert main(["render", "nope"]) == 1
