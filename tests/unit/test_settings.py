"""Typed settings (rufus/serving/settings.py and each model's declarations): the defaults are
the ones the models always had, a bad value fails naming its key, the environment wins over
config.pbtxt, unknown keys are left alone, and docs/configuration.md is what the
declarations render."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from rufus.assistant.settings import AssistantSettings, PipelineSettings
from rufus.qp.settings import MAX_DRAFT_NODES, QP_KEYS, DecoderKnobs, PlannerSettings
from rufus.serving.admission import AdmissionSettings
from rufus.serving.config import ConfigError
from rufus.serving.engine import RestartPolicy, restart_policy_from_env
from rufus.serving.model_settings import EngineModelSettings, LLMSettings
from rufus.serving.settings import SettingError, config_parameters
from rufus.serving.validation import Limits

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"


def config(name: str, **params: str) -> dict:
    """Triton's model_config JSON with these config.pbtxt parameters."""
    return {"name": name, "parameters": {k: {"string_value": v} for k, v in params.items()}}


def committed_config(model: str) -> dict:
    text = (REPO / model / "config.pbtxt").read_text()
    return config(model, **dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}',
                                           text)))


def committed_model_json(model: str) -> dict:
    return json.loads((REPO / model / "1" / "model.json").read_text())


# ---------------------------------------------------------------------- defaults

def test_engine_model_defaults_are_the_old_code_defaults():
    s = LLMSettings.from_config(config("rufus_llm"), env={})
    assert (s.default_max_tokens, s.max_outstanding_requests, s.warmup,
            s.report_custom_metrics) == (256, 0, True, True)
    assert s.restart == RestartPolicy(enabled=True, max_failures=3, window_s=600.0,
                                      backoff_s=1.0, backoff_max_s=30.0)
    assert (s.limits.max_input_bytes, s.limits.max_parameters_bytes,
            s.limits.max_json_depth) == (1 << 20, 256 << 10, 32)
    assert s.limits == Limits() and RestartPolicy() == s.restart


def test_planner_knob_defaults_are_the_old_code_defaults():
    from rufus.qp.decoder import medusa_decode

    k = DecoderKnobs.from_model_json({"model": "m"})
    assert (k.qp_backend, k.structured_output, k.ground_filters, k.num_medusa_heads,
            k.medusa_model, k.medusa_tree) == ("torch_medusa", True, True, 4, "", ())
    assert (k.medusa_speculation_length, k.vllm_num_speculative_tokens) == (None, None)
    assert (k.torch_threads, k.torch_max_batch, k.copy_fields) == (0, 1, ())
    assert (k.grammar_drafts, k.lookup_drafts, k.history_drafts) == (0, 0, 0)
    assert k.max_draft_nodes == k.batch_draft_nodes == MAX_DRAFT_NODES == 24
    assert medusa_decode.MAX_DRAFT_NODES is MAX_DRAFT_NODES  # one source
    assert (k.nxdi_compiled_path, k.nxdi_max_new_tokens) == ("", 96)
    # 0 and null meant "the default" for the trie caps, as before
    assert DecoderKnobs.from_model_json({"max_draft_nodes": 0,
                                         "batch_draft_nodes": None}).max_draft_nodes == 24


def test_assistant_defaults_are_the_old_code_defaults():
    from rufus.assistant.pipeline import Assistant

    s = AssistantSettings.from_config(config("rufus_assistant"), env={})
    assert (s.planner_model, s.answer_model, s.num_products, s.answer_products,
            s.answer_max_tokens, s.triton_grpc_url) == (
        "rufus_qp_medusa", "rufus_llm", 5, 4, 160, "127.0.0.1:8001")
    assert (s.pipeline.plan_timeout_s, s.pipeline.prewarm) == (10.0, True)
    assert s.pipeline.admission == AdmissionSettings()
    # the pipeline's own defaults are these (one source), for the frontend's hook too
    sig = inspect.signature(Assistant)
    assert [sig.parameters[n].default for n in ("planner_model", "answer_model", "k",
                                                "answer_products", "max_tokens")] == [
        s.planner_model, s.answer_model, s.num_products, s.answer_products,
        s.answer_max_tokens]


@pytest.mark.parametrize("model,cls", [("rufus_llm", LLMSettings),
                                       ("rufus_qp_medusa", EngineModelSettings),
                                       ("rufus_assistant", AssistantSettings)])
def test_committed_config_parses_and_repeats_no_other_default(model, cls):
    """Every committed parameter reads; a parameter that repeats a code default agrees with it
    (rufus_llm and the planner set their own admission and max_tokens on purpose)."""
    cfg = committed_config(model)
    cls.from_config(cfg, env={})
    own = {"max_outstanding_requests", "default_max_tokens"}
    repeated = {k: v for k, v in config_parameters(cfg).items() if k not in own}
    assert cls.from_config(config(model, **repeated), env={}) == \
        cls.from_config(config(model), env={})


def test_committed_planner_model_json_splits_into_knobs_and_engine_args():
    mj = committed_model_json("rufus_qp_medusa")
    p = PlannerSettings.load(EngineModelSettings(), mj, "rufus_qp_medusa")
    for key in set(mj) & set(QP_KEYS):
        got = getattr(p.knobs, key)
        want = mj[key]
        assert (list(got) if key == "copy_fields" else got) == want, key
    assert set(p.engine_args) == set(mj) - set(QP_KEYS)
    assert "max_model_len" in p.engine_args and "grammar_drafts" not in p.engine_args


# ---------------------------------------------------------------------- errors name the key

def test_bad_config_parameter_names_its_key():
    with pytest.raises(SettingError, match=re.escape(
            "rufus_llm: config.pbtxt parameter 'max_input_bytes': expected a whole number >= 1")):
        LLMSettings.from_config(config("rufus_llm", max_input_bytes="lots"), env={})
    with pytest.raises(SettingError, match="'warmup': expected true or false, got 'maybe'"):
        LLMSettings.from_config(config("rufus_llm", warmup="maybe"), env={})
    with pytest.raises(SettingError, match="'num_products': expected a whole number >= 1, "
                                           "got '0'"):
        AssistantSettings.from_config(config("a", num_products="0"), env={})


def test_bad_environment_value_names_the_variable_and_the_key():
    env = {"RUFUS_MAX_OUTSTANDING_REQUESTS": "-1"}
    with pytest.raises(SettingError) as info:
        EngineModelSettings.from_config(config("m", max_outstanding_requests="8"), env=env)
    assert "RUFUS_MAX_OUTSTANDING_REQUESTS (overrides config.pbtxt parameter " \
           "'max_outstanding_requests')" in str(info.value)
    with pytest.raises(SettingError, match="RUFUS_ASSISTANT_PLAN_TIMEOUT_S: expected a number"):
        PipelineSettings.from_env({"RUFUS_ASSISTANT_PLAN_TIMEOUT_S": "soon"})
    with pytest.raises(SettingError, match="RUFUS_ENGINE_MAX_FAILURES"):
        restart_policy_from_env({"RUFUS_ENGINE_MAX_FAILURES": "three"})
    with pytest.raises(ValueError, match="RUFUS_ASSISTANT_SLO_S"):  # admission's limits
        PipelineSettings.from_env({"RUFUS_ASSISTANT_SLO_S": "fast"})


@pytest.mark.parametrize("key,bad,expected", [
    ("torch_max_batch", "4", "a whole number in 1..64"),
    ("torch_max_batch", 65, "a whole number in 1..64"),
    ("grammar_drafts", -1, "a whole number >= 0"),
    ("qp_backend", "tpu", "one of torch_medusa"),
    ("structured_output", "false", "true or false"),
    ("torch_threads", "many", 'int or "auto"'),
    ("copy_fields", "brand", "list of strings"),
    ("medusa_tree", [["0"]], "list of paths or string"),
])
def test_bad_model_json_knob_names_its_key(key, bad, expected):
    with pytest.raises(ConfigError, match=re.escape(f"model.json key '{key}': expected "
                                                    f"{expected}")):
        DecoderKnobs.from_model_json({"model": "m", key: bad}, "rufus_qp_medusa")


def test_errors_quote_only_a_short_prefix_of_the_value():
    huge = "9" * 5 + "x" * 100_000
    with pytest.raises(SettingError) as info:
        LLMSettings.from_config(config("rufus_llm", default_max_tokens=huge), env={})
    assert len(str(info.value)) < 200 and "(100005 chars)" in str(info.value)
    with pytest.raises(SettingError) as info:
        DecoderKnobs.from_model_json({"copy_fields": list(range(10_000))})
    assert len(str(info.value)) < 200


# ---------------------------------------------------------------------- sources

def test_environment_wins_over_config_pbtxt():
    cfg = config("rufus_qp_medusa", default_max_tokens="96", warmup="true")
    s = EngineModelSettings.from_config(cfg, env={"RUFUS_MAX_OUTSTANDING_REQUESTS": "64",
                                                  "RUFUS_WARMUP": "false",
                                                  "RUFUS_ENGINE_RESTART": "0",
                                                  "RUFUS_MAX_JSON_DEPTH": "8"})
    # parameters declared env=True only: the others are the model repository's (issue 61
    # retired their variables), so RUFUS_MAX_JSON_DEPTH is no override
    assert (s.max_outstanding_requests, s.warmup, s.restart.enabled,
            s.limits.max_json_depth) == (64, False, False, 32)
    # an empty variable is unset: the file's value applies
    assert EngineModelSettings.from_config(cfg, env={"RUFUS_WARMUP": ""}).warmup is True
    assert EngineModelSettings.from_config(cfg, env={"RUFUS_DEFAULT_MAX_TOKENS": "64"}
                                           ).default_max_tokens == 96
    a = AssistantSettings.from_config(
        config("rufus_assistant", answer_max_tokens="160"),
        env={"RUFUS_ANSWER_MAX_TOKENS": "32", "RUFUS_TRITON_GRPC_URL": "10.0.0.1:8001",
             "RUFUS_LAB_OFF": "prewarm", "RUFUS_ASSISTANT_PLAN_TIMEOUT_S": "2.5",
             "RUFUS_ASSISTANT_SLO_S": "0.8"})
    assert (a.answer_max_tokens, a.triton_grpc_url, a.pipeline.prewarm,
            a.pipeline.plan_timeout_s, a.pipeline.admission.slo_s) == (
        32, "10.0.0.1:8001", False, 2.5, 0.8)


def test_documented_boolean_spellings_keep_their_meaning():
    for raw, want in (("true", True), ("false", False), ("True", True), ("1", True),
                      ("0", False), ("yes", True), ("no", False)):
        assert EngineModelSettings.from_config(config("m", engine_restart=raw),
                                               env={}).restart.enabled is want
    assert PipelineSettings.from_env({"RUFUS_LAB_OFF": ""}).prewarm is True


def test_unknown_keys_are_left_alone():
    """As before: config.pbtxt parameters nobody reads are ignored (Triton has its own), and
    model.json keys that are not the planner's go to the engine as they are."""
    s = LLMSettings.from_config(config("rufus_llm", FORCE_CPU_ONLY_INPUT_TENSORS="no",
                                       some_future_knob="x"), env={"RUFUS_NOT_A_SETTING": "1"})
    assert s == LLMSettings.from_config(config("rufus_llm"), env={})
    mj = {"model": "m", "grammar_drafts": 4, "max_num_seqs": 8, "not_a_vllm_arg": True}
    p = PlannerSettings.load(EngineModelSettings(), mj)
    assert p.knobs.grammar_drafts == 4
    assert dict(p.engine_args) == {"model": "m", "max_num_seqs": 8, "not_a_vllm_arg": True}


def test_backends_use_the_typed_knobs(tmp_path):
    from rufus.qp.backends import VllmMedusaBackend, create_backend

    heads = tmp_path / "heads"
    heads.mkdir()
    (heads / "config.json").write_text("{}")
    args = {"model": "m", "qp_backend": "vllm_medusa", "medusa_model": str(heads),
            "num_medusa_heads": 3, "medusa_tree": [[0], [0, 0]], "extra_vllm_arg": 1}
    knobs = DecoderKnobs.from_model_json(args)
    b = create_backend(args, knobs)
    assert isinstance(b, VllmMedusaBackend) and b.knobs is knobs
    # derived defaults: nodes + 1 verified per step, every head drafted by vLLM
    assert (b.medusa.medusa_speculation_length, b.medusa.vllm_num_speculative_tokens) == (3, 3)
    assert b.engine_args(args)["extra_vllm_arg"] == 1  # unknown keys reach vLLM, as before
    fallback = create_backend({**args, "medusa_model": str(tmp_path / "none")})
    assert fallback.name == "autoregressive" and fallback.knobs.qp_backend == "autoregressive"


def test_a_model_reads_its_settings_once_when_triton_loads_it(monkeypatch):
    """TritonModel.initialize parses the model's SETTINGS before start(): a bad value fails
    the load naming its key; the model then uses the typed object."""
    from rufus.serving import triton_backend as tb

    class FakePb:
        @staticmethod
        def using_decoupled_model_transaction_policy(cfg):
            return True

    for name in ("prepare_process", "freeze_heap", "mark_initialized"):
        monkeypatch.setattr(tb, name, lambda *a: None)
    monkeypatch.setattr(tb, "pb_utils", FakePb)
    monkeypatch.delenv("RUFUS_WARMUP", raising=False)
    started = []

    class Model(tb.TritonModel):
        SETTINGS = AssistantSettings

        def start(self) -> None:
            started.append((self.settings.num_products, self.warmup_enabled()))

    def args(**params: str) -> dict:
        return {"model_config": json.dumps(config("rufus_assistant", **params)),
                "model_name": "rufus_assistant", "model_version": "1",
                "model_repository": "/nonexistent"}

    Model().initialize(args(num_products="7", warmup="false"))
    assert started == [(7, False)]
    with pytest.raises(SettingError, match=re.escape(
            "rufus_assistant: config.pbtxt parameter 'num_products'")):
        Model().initialize(args(num_products="seven"))
    assert len(started) == 1  # never started


# ---------------------------------------------------------------------- documentation

def test_configuration_doc_is_generated_from_the_declarations():
    from deploy import configuration

    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == configuration.render(), \
        "docs/configuration.md is stale: run python -m deploy.configuration"


SCANNED = ("rufus", "follower", "proxy", "lab", "scripts", "docker", "deploy", "model_repository",
           "tests/integration", "tests/containers", "Makefile")
# a RUFUS_ name, not a template such as RUFUS_UNIT<i>_GRPC or f"RUFUS_ASSISTANT_{name}"
VARIABLE = re.compile(r"\bRUFUS_[A-Z0-9_]*[A-Z0-9]\b(?![<{])")


def test_every_rufus_variable_in_the_code_is_documented():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    listed = set(VARIABLE.findall(doc))
    missing: dict[str, str] = {}
    for top in SCANNED:
        path = ROOT / top
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        for f in files:
            if "__pycache__" in f.parts or f.suffix in (".pyc", ".md", ".safetensors"):
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for name in set(VARIABLE.findall(text)) - listed:
                missing.setdefault(name, str(f.relative_to(ROOT)))
    assert not missing, f"RUFUS_* variables read but not in docs/configuration.md: {missing}"


# ---------------------------------------------------------------------- one reader
ENV_MODULES = {"rufus/env.py", "rufus/serving/settings.py"}  # the reader and its helpers


def test_only_the_settings_modules_read_the_environment():
    """Product code reads the environment through rufus/env.py and rufus/serving/settings.py
    only (the regex lab.code_counts counts), and never touches ``os.environ`` elsewhere."""
    from lab.code_counts import ENV_READ, PRODUCT

    found: dict[str, int] = {}
    for top in PRODUCT:
        for f in sorted((ROOT / top).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            text = f.read_text(encoding="utf-8")
            if rel not in ENV_MODULES and (ENV_READ.search(text) or "os.environ" in text):
                found[rel] = len(ENV_READ.findall(text)) + text.count("os.environ")
    assert not found, f"read the environment through rufus.env / rufus.serving.settings: {found}"
    assert ENV_READ.search('os.environ.get("X")') and ENV_READ.search('os.getenv("X")')


def test_rig_flags_are_the_scripts_own():
    """docs/configuration.md's table of the rig's and the build's flags names only flags
    their scripts parse (the variables they replaced are gone from the scripts)."""
    from deploy.configuration import RIG_FLAGS
    root = Path(__file__).resolve().parents[2]
    for (script, flag), _ in RIG_FLAGS.items():
        text = (root / script).read_text(encoding="utf-8")
        word = next(w for w in flag.split() if w.startswith("--") or w == "image")
        assert word in text, f"{script} does not parse {word}"
    for retired in ("RUFUS_PREBUILD", "RUFUS_WHEELHOUSE", "RUFUS_VENV", "RUFUS_IMAGE",
                    "RUFUS_OBSERVE_IMAGE", "RUFUS_RIG_KVCACHE_GB", "RUFUS_CELL_A_CPUS",
                    "RUFUS_DOCKER_STATE", "RUFUS_INGRESS_IMAGE", "RUFUS_ROLE"):
        for f in ("scripts/compose.sh", "scripts/image.sh", "scripts/setup.sh",
                  "scripts/rolling_update.sh", "docker/Dockerfile", "docker/compose.yaml",
                  "docker/engine.sh", "docker/healthcheck.py"):
            assert not re.search(rf"\b{retired}\b", (root / f).read_text(encoding="utf-8")), \
                f"{f} still reads {retired}"
