"""Engine configuration: ``model.json`` loading, environment overrides, path resolution.

``model.json`` follows the official Triton vLLM backend's convention (a flat dict of vLLM
engine arguments). We add two things an operator needs when the same repository is shipped
to many machines:

* string values may use ``${VAR}`` / ``${VAR:-default}`` and ``~`` so the model path can
  point at a per-machine cache without editing the file (``RUFUS_*`` variables only, plus
  any the operator lists in ``RUFUS_CONFIG_VARS``; never a secret-looking name);
* ``RUFUS_<MODEL>_ENGINE_ARGS`` / ``RUFUS_ENGINE_ARGS`` (a JSON object) override keys at
  deploy time (tests use it to shrink the engine).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rufus.env import environ
from rufus.machine import precision
from rufus.machine.caches import cache_dir, default_model_dir
from rufus.serving.settings import ConfigError as ConfigError  # its home: the reader

# The official backend's LoRA file next to model.json: adapter name -> local path
# (rufus/serving/llm.py reads it).
MULTI_LORA_FILE = "multi_lora.json"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# ``${VAR}`` may read only these (a model.json must not read, or echo back in a load error,
# the server's environment): ``RUFUS_*`` and names the operator lists in RUFUS_CONFIG_VARS,
# never one that looks like a secret.
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL", re.IGNORECASE)


def _may_expand(name: str, env: Mapping[str, str]) -> bool:
    allowed = {v.strip() for v in env.get("RUFUS_CONFIG_VARS", "").split(",") if v.strip()}
    return (name.startswith("RUFUS_") or name in allowed) and not _SECRET_NAME.search(name)


def expand(value: str, env: Mapping[str, str] | None = None) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` and a leading ``~``; unknown vars are errors."""
    env = dict(environ() if env is None else env)
    env.setdefault("RUFUS_CACHE_DIR", str(cache_dir(env)))
    env.setdefault("RUFUS_MODEL_DIR", str(default_model_dir(env)))

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if not _may_expand(name, env):
            raise ConfigError(f"${{{name}}} in model.json: only RUFUS_* variables (or names "
                              "listed in RUFUS_CONFIG_VARS, none that look like secrets) "
                              "may be expanded")
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"environment variable {name} is not set (used in model.json)")

    out = _VAR.sub(sub, value)
    return os.path.expanduser(out) if out.startswith("~") else out


def _expand_tree(obj: Any, env: Mapping[str, str] | None) -> Any:
    if isinstance(obj, str):
        return expand(obj, env)
    if isinstance(obj, list):
        return [_expand_tree(v, env) for v in obj]
    if isinstance(obj, dict):
        return {k: _expand_tree(v, env) for k, v in obj.items()}
    return obj


def env_override_name(model_name: str) -> str:
    return "RUFUS_" + re.sub(r"[^A-Za-z0-9]", "_", model_name).upper() + "_ENGINE_ARGS"


def _json_env(name: str, env: Mapping[str, str]) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


@dataclass
class EngineConfig:
    """Resolved engine arguments plus where they came from (for logs)."""

    engine_args: dict[str, Any]
    source: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return str(self.engine_args["model"])

    @property
    def world_size(self) -> int:
        tp = int(self.engine_args.get("tensor_parallel_size", 1))
        pp = int(self.engine_args.get("pipeline_parallel_size", 1))
        return tp * pp

    @property
    def nnodes(self) -> int:
        return int(self.engine_args.get("nnodes", 1))


def lora_enabled(model_dir: Path, engine_args: Mapping[str, Any]) -> bool:
    """Whether the model in ``model_dir`` (its version directory) serves LoRA adapters: its
    ``multi_lora.json`` exists or model.json sets ``enable_lora`` (the official backend's
    rule; rufus/serving/llm.py ``load_loras`` reads the adapters)."""
    return (model_dir / MULTI_LORA_FILE).exists() or \
        str(engine_args.get("enable_lora", "")).lower() == "true"


def load_engine_config(
    path: str | Path,
    model_name: str = "",
    env: Mapping[str, str] | None = None,
    workload: str = "answer",
) -> EngineConfig:
    """Read ``model.json``, apply env overrides (global, then per-model), expand strings;
    ``"dtype": "measured"`` becomes this machine's choice for ``workload`` and
    ``"quantization": "measured"`` its int8 copy where the CPU runs it well
    (:mod:`rufus.machine.precision`)."""
    env = environ() if env is None else env
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path} not found: each model needs a model.json") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or "model" not in raw:
        raise ConfigError(f"{path} must be a JSON object with a 'model' key")

    overrides: dict[str, Any] = {}
    overrides.update(_json_env("RUFUS_ENGINE_ARGS", env))
    if model_name:
        overrides.update(_json_env(env_override_name(model_name), env))
    merged = {**raw, **overrides}
    args = _expand_tree(merged, env)
    model = args["model"]
    # A path that looks local but is missing is the most common deploy mistake: say so.
    if model.startswith(("/", ".", "~")) and not Path(model).exists():
        raise ConfigError(
            f"model path {model!r} from {path} does not exist; build the default model "
            "with `make model` or set RUFUS_MODEL_DIR / the 'model' key"
        )
    args = precision.resolve(args, workload, env)  # the dtype, measured on the source weights
    args = precision.resolve_quantization(args, workload, env,
                                          lora=lora_enabled(path.parent, args))
    if args.get("quantization") == precision.INT8_WEIGHT_ONLY:
        from rufus.machine import vllm_int8
        # vLLM checks the method's name when it builds its config: in rufus_llm's stub and
        # in a follower (follower/node.py), both of which load their settings here
        vllm_int8.register()
    return EngineConfig(engine_args=args, source=str(path), overrides=overrides)
