"""Render docs/configuration.md: every model setting, from the typed declarations
(rufus/serving/model_settings.py, rufus/qp/settings.py, rufus/assistant/settings.py), and
every environment variable, from deploy/contract.py's table, and the rig's script flags.

    python -m deploy.configuration          # rewrite docs/configuration.md
    python -m deploy.configuration --check  # exit 1 if the committed file is stale

tests/unit/test_settings.py fails when the committed file differs from this output, and when
code names a ``RUFUS_*`` variable the file does not list.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deploy.contract import ENV  # noqa: E402
from rufus.assistant.settings import AssistantSettings  # noqa: E402
from rufus.qp.settings import QP_KEYS, DecoderKnobs, PlannerModelSettings  # noqa: E402
from rufus.serving.model_settings import LLMSettings  # noqa: E402
from rufus.serving.settings import ENVIRONMENT, MODEL_JSON, PBTXT, Row, rows  # noqa: E402
from tests.environment import HARNESS_OPTIONS  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
REPOSITORY = ROOT / "model_repository"

# The rig's and the build's knobs are their scripts' flags, not variables (each script's
# header says more; tests/unit/test_settings.py checks that each flag is in its script).
RIG_FLAGS: dict[tuple[str, str], str] = {
    ("scripts/compose.sh", "up --kvcache-gb N"): "vLLM's KV cache per node, GiB (2; the "
                                                 "container tests give 1 beside the integration tests)",
    ("scripts/compose.sh", "up --cell-a-cpus LIST"): "cores of cell a (default: the first half)",
    ("scripts/compose.sh", "up --cell-b-cpus LIST"): "cores of cell b (default: the second half)",
    ("scripts/compose.sh", "up --no-image"): "the images as they are (no scripts/image.sh)",
    ("scripts/compose.sh", "up --prebuild MODE"): "scripts/image.sh's --prebuild",
    ("scripts/compose.sh", "image CELL IMAGE"): "run a cell on IMAGE from its next recreation "
                                                "(kept in build/docker/rig.yaml)",
    ("scripts/rolling_update.sh", "--image IMAGE"): "the image the cells are rolled to "
                                                    "(rufus-inference:cpu)",
    ("scripts/image.sh", "--prebuild MODE"): "build-time warm-up: 1 (default) starts the models "
                                             "once so the image ships warm compile caches; "
                                             "precision: measure only; 0: skip; auto: precision "
                                             "where the rig's compile-cache volumes exist",
    ("scripts/image.sh", "--no-wheelhouse-cache"): "pip download into build/wheels every build "
                                                   "(default: the lock's wheelhouse kept once "
                                                   "per lock under RUFUS_CACHE_DIR/wheelhouse)",
    ("scripts/image.sh", "--observe"): "also build the compose rig's Prometheus "
                                       "(rufus-prometheus:2.42, profile observe)",
    ("scripts/image.sh", "--local-bases"): "local base images even where the public ones pull",
    ("scripts/setup.sh", "--wheelhouse DIR"): "install from this directory of wheels, no "
                                              "package index (the image build's)",
    ("scripts/setup.sh", "--no-venv-cache"): "pip install the venv every time, keep no copy "
                                             "under RUFUS_CACHE_DIR/venvs (the image build)",
}

# model.json keys that mean more than vLLM's engine argument of that name
ENGINE_NOTES: dict[str, str] = {
    "model": "the model directory; `${VAR}` / `${VAR:-default}` expand `RUFUS_*` variables "
             "(and names in `RUFUS_CONFIG_VARS`)",
    "dtype": '`"measured"`: the precision measured on this machine at setup '
             "(docs/precision.md), bf16 where native without a measurement",
    "quantization": '`"measured"`: the int8 W8A8 copy of the model (`scripts/setup.sh` '
                    "writes it) where the CPU has int8 dot products (VNNI, AMX); where the "
                    "model runs in fp32 without them (AVX2), `rufus_int8` (int8 weight-only "
                    "through rufus's kernel); else the model as it is, and with LoRA adapters "
                    "(docs/precision.md); `null` or a vLLM method: as given",
    "worker_extension_cls": "rufus's vLLM worker extension (rufus/vllm_worker/extension.py)",
    "distributed_executor_backend": '`"uni"`: the model runs inside the EngineCore process',
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: Iterable[str], body: Iterable[Iterable[str]]) -> list[str]:
    head = list(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return [*out, ""]


def _code(text: str | None) -> str:
    return f"`{text}`" if text else "—"


def committed_parameters(model: str) -> dict[str, str]:
    """A model's config.pbtxt ``parameters`` as committed."""
    text = (REPOSITORY / model / "config.pbtxt").read_text(encoding="utf-8")
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))


def committed_model_json(model: str) -> dict[str, object]:
    return json.loads((REPOSITORY / model / "1" / "model.json").read_text(encoding="utf-8"))


def _shipped(value: object) -> str:
    if value is None:
        return "—"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _settings_table(found: list[Row], shipped: Mapping[str, object], source: str) -> list[str]:
    where = {PBTXT: "config.pbtxt", MODEL_JSON: "model.json"}[source]
    return _table(
        ("key", "environment", "type", "bounds", "default", where, "meaning"),
        ((f"`{r.key}`", _code(r.env), r.kind, r.bounds or "—", f"`{r.default}`",
          _shipped(shipped.get(r.key)), r.help) for r in found if r.source == source))


def _env_table(found: list[Row]) -> list[str]:
    return _table(("variable", "type", "bounds", "default", "meaning"),
                  ((f"`{r.key}`", r.kind, r.bounds or "—", f"`{r.default}`", r.help)
                   for r in found if r.source == ENVIRONMENT))


def _engine_table(model_json: Mapping[str, object]) -> list[str]:
    return _table(("key", "model.json", "meaning"),
                  ((f"`{k}`", _shipped(v), ENGINE_NOTES.get(k, "vLLM engine argument"))
                   for k, v in model_json.items() if k not in QP_KEYS))


def model_variables() -> set[str]:
    """Every variable a model setting reads."""
    return {r.env for cls in (LLMSettings, PlannerModelSettings, AssistantSettings)
            for r in rows(cls) if r.env}


INTRO = """\
# Configuration

Generated by `python -m deploy.configuration` from the settings' declarations; do not edit
by hand (`tests/unit/test_settings.py` fails when this file is stale, or when code reads a
`RUFUS_*` variable that is not listed here).

Each model's settings are one typed, frozen object, read once when the model loads:
`LLMSettings` (`rufus/serving/model_settings.py`), `PlannerSettings` with its
`DecoderKnobs` (`rufus/qp/settings.py`) and `AssistantSettings` (`rufus/assistant/settings.py`).
A value of the wrong type or out of bounds fails the load with an error that names the key
and its variable and quotes a short prefix of the value. Where a value comes from, first
match wins:

1. a config.pbtxt parameter's environment variable, `RUFUS_<KEY>`, for the few parameters a
   deployment sets (the environment column; for every model that reads the key); the
   others are set in the model repository, as the official backend's are;
2. the model's `config.pbtxt` `parameters`;
3. the code default below (the tables' config.pbtxt and model.json columns show the committed
   files' values; — where a file leaves the key out).

model.json keys are overridden as a whole JSON object by `RUFUS_ENGINE_ARGS` (every model)
and then `RUFUS_<MODEL>_ENGINE_ARGS` (`RUFUS_RUFUS_LLM_ENGINE_ARGS`,
`RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS`); their values are JSON, so `"4"` is not 4. An empty value
(variable or parameter) means the default. Keys that no setting declares are left alone:
config.pbtxt parameters nobody reads are ignored, and model.json's other keys are vLLM's
engine arguments, which vLLM checks. Booleans are `true`/`false` (also `1`/`0`, `yes`/`no`,
`on`/`off`).
"""


def render() -> str:
    llm, planner, assistant = "rufus_llm", "rufus_qp_medusa", "rufus_assistant"
    llm_rows, qp_rows = rows(LLMSettings), rows(PlannerModelSettings)
    out = [INTRO]
    out += ["## rufus_llm", "", "config.pbtxt parameters (`LLMSettings`):", ""]
    out += _settings_table(llm_rows, committed_parameters(llm), PBTXT)
    out += ["model.json: vLLM's engine arguments, passed through "
            "(`rufus/serving/config.py` expands and overrides them):", ""]
    out += _engine_table(committed_model_json(llm))
    out += ["## rufus_qp_medusa", "", "config.pbtxt parameters (`PlannerSettings.parameters`, "
            "the same keys as rufus_llm's):", ""]
    out += _settings_table(qp_rows, committed_parameters(planner), PBTXT)
    out += ["Environment (admission: `PlannerModelSettings.admission`, `rufus/qp/settings.py`):",
            ""]
    out += _env_table(qp_rows)
    out += ["model.json: the planner's own keys (`DecoderKnobs`; `rufus/qp/backends.py` says "
            "which backend uses which):", ""]
    out += _settings_table(rows(DecoderKnobs), committed_model_json(planner), MODEL_JSON)
    out += ["model.json: vLLM's engine arguments (the file's other keys; the torch backends "
            "read `model`, `dtype` and `max_model_len` of them):", ""]
    out += _engine_table(committed_model_json(planner))
    found = rows(AssistantSettings)
    out += ["## rufus_assistant", "", "config.pbtxt parameters (`AssistantSettings`):", ""]
    out += _settings_table(found, committed_parameters(assistant), PBTXT)
    out += ["Environment (`PipelineSettings`, admission: `AdmissionSettings` in "
            "`rufus/serving/admission.py`); the frontend's `rufus-assistant` model reads "
            "them too:", ""]
    out += _env_table(found)
    listed = model_variables() | {r.key for r in found + qp_rows if r.source == ENVIRONMENT}
    out += ["## Other environment variables", "",
            "Read by the processes (`deploy/contract.py`, which the deployment files are "
            "checked against):", ""]
    out += _table(("variable", "read by", "meaning"),
                  ((f"`{name}`", ", ".join(f"`{r}`" for r in var.readers), var.meaning)
                   for name, var in sorted(ENV.items()) if name not in listed))
    out += ["The rig's and the build's knobs are their scripts' flags, not variables:", ""]
    out += _table(("script", "flag", "meaning"),
                  ((f"`{script}`", f"`{flag}`", meaning)
                   for (script, flag), meaning in RIG_FLAGS.items()))
    out += ["The tests' own knobs are pytest options, not variables (`tests/environment.py`):",
            ""]
    out += _table(("option", "default", "read by", "meaning"),
                  ((f"`{name}`", f"`{default}`", ", ".join(f"`{r}`" for r in readers.split(", ")),
                    meaning) for name, (default, _, readers, meaning) in HARNESS_OPTIONS.items()))
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        stale = DOC.read_text(encoding="utf-8") != text if DOC.exists() else True
        if stale:
            print(f"{DOC.relative_to(ROOT)} is stale: run python -m deploy.configuration",
                  file=sys.stderr)
        return int(stale)
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
