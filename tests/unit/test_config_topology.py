"""model.json resolution and topology from the environment (no server)."""

import json

import pytest

from rufus.multinode.topology import TopologyError, topology_from_env
from rufus.serving.config import ConfigError, env_override_name, expand, load_engine_config


def write(tmp_path, obj):
    p = tmp_path / "model.json"
    p.write_text(json.dumps(obj))
    return p


def test_expand_defaults_and_env():
    env = {"RUFUS_A": "x"}
    assert expand("${RUFUS_A}/m", env) == "x/m"
    assert expand("${RUFUS_B:-fallback}", env) == "fallback"
    with pytest.raises(ConfigError, match="RUFUS_B"):
        expand("${RUFUS_B}", env)


def test_expand_never_reads_other_env_or_secrets():
    """An uploaded model.json must not echo the server's environment (issue 12)."""
    env = {"HOME": "/root", "RUFUS_ADMIN_KEY": "k" * 32, "RUFUS_UNIT_SECRET": "s" * 32,
           "MY_DIR": "/m", "RUFUS_CONFIG_VARS": "MY_DIR"}
    for name in ("HOME", "RUFUS_ADMIN_KEY", "RUFUS_UNIT_SECRET"):
        with pytest.raises(ConfigError) as err:
            expand(f"${{{name}}}", env)
        assert env[name] not in str(err.value)
    assert expand("${MY_DIR}/x", env) == "/m/x"


def test_model_dir_default_follows_cache_dir(tmp_path):
    (tmp_path / "models" / "SmolLM2-135M-Instruct").mkdir(parents=True)
    cfg = load_engine_config(write(tmp_path, {"model": "${RUFUS_MODEL_DIR}"}), "m",
                             {"RUFUS_CACHE_DIR": str(tmp_path)})
    assert cfg.model == str(tmp_path / "models" / "SmolLM2-135M-Instruct")


def test_env_overrides_global_then_per_model(tmp_path):
    env = {"RUFUS_ENGINE_ARGS": '{"max_num_seqs": 8, "dtype": "float32"}',
           env_override_name("rufus_llm"): '{"max_num_seqs": 4}'}
    cfg = load_engine_config(write(tmp_path, {"model": "org/hub-id", "max_num_seqs": 64}),
                             "rufus_llm", env)
    assert cfg.engine_args["max_num_seqs"] == 4 and cfg.engine_args["dtype"] == "float32"
    assert cfg.model == "org/hub-id"


def test_missing_local_model_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_engine_config(write(tmp_path, {"model": str(tmp_path / "nope")}), "m", {})


def test_bad_override_json(tmp_path):
    with pytest.raises(ConfigError, match="RUFUS_ENGINE_ARGS"):
        load_engine_config(write(tmp_path, {"model": "x/y"}), "m", {"RUFUS_ENGINE_ARGS": "{"})


def test_topology_reads_lws_names():
    """Membership is LeaderWorkerSet's three names (the retired RUFUS_NNODES, RUFUS_NODE_RANK
    and RUFUS_LEADER_ADDR are not read any more)."""
    topo = topology_from_env({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1",
                              "LWS_LEADER_ADDRESS": "leader.svc", "RUFUS_NNODES": "4"})
    assert (topo.nnodes, topo.node_rank, topo.leader_addr) == (2, 1, "leader.svc")
    assert not topo.is_leader and topo.multi_node


def test_topology_defaults_single_node():
    topo = topology_from_env({})
    assert topo.nnodes == 1 and topo.is_leader and not topo.multi_node


@pytest.mark.parametrize("env", [{"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "2"},
                                 {"LWS_GROUP_SIZE": "x"}, {"RUFUS_LEADER_PORT": "70000"}])
def test_topology_errors(env):
    with pytest.raises(TopologyError):
        topology_from_env(env)
