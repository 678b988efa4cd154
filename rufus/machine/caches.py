"""Where what we build lives: :func:`cache_dir` (``$RUFUS_CACHE_DIR``, ``~/.cache/rufus``)
holds the models, the precision record and the compiled artefacts; compiled artefacts go in
one directory, keyed by the CPU class that built them.

vLLM's compile cache (``VLLM_CACHE_ROOT``), inductor's kernels (``TORCHINDUCTOR_CACHE_DIR``)
and Triton-language kernels (``TRITON_CACHE_DIR``) go under ``$RUFUS_COMPILE_CACHE_DIR/<cpu
key>/`` (default ``$RUFUS_CACHE_DIR/compile``, ``~/.cache/rufus/compile``, next to the built
models), so a container volume
or a node's disk keeps them all, and a start on another CPU class never loads a kernel built
for instructions this CPU lacks (an AVX-512 kernel on an AVX2 machine dies with SIGILL, and
vLLM's AOT cache key does not include the CPU). Model versions are keyed by vLLM itself (its
cache hash covers the model and engine configuration). A variable the operator set wins.

Called in every process that starts an engine before vLLM or torch is imported: the Triton
stub (:func:`rufus.serving.triton_backend.prepare_process`) and the follower; vLLM's spawned
engine-core and worker processes inherit the environment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from rufus.env import environ, set_environ
from rufus.machine.cpu import cpu_flags, cpu_key, effective_flags

log = logging.getLogger("rufus.machine.caches")

DEFAULT_CACHE_DIR = "~/.cache/rufus"

CACHE_VARS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor",
              "TRITON_CACHE_DIR": "triton"}


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Root of everything we build or download (models, Medusa heads, compiled caches)."""
    env = environ() if env is None else env
    return Path(env.get("RUFUS_CACHE_DIR", DEFAULT_CACHE_DIR)).expanduser()


DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The answer model's W8A8 copy sits beside its source (rufus/launch/w8a8.py writes it,
# rufus/machine/precision.py chooses it).
W8A8_SUFFIX = "-w8a8"
# The models' paths are here, not in config.py or precision.py, so that the image's model
# layers (docker/Dockerfile), which run the model builds, depend on this module and
# machine.py only, and a change to the serving configuration does not rebuild the models.


def default_model_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where ``scripts/build_model.py`` writes the default Hugging Face model directory."""
    env = environ() if env is None else env
    if env.get("RUFUS_MODEL_DIR"):
        return Path(env["RUFUS_MODEL_DIR"]).expanduser()
    return cache_dir(env) / "models" / DEFAULT_MODEL_NAME


def w8a8_dir(model_dir: str | Path) -> Path:
    """Where the W8A8 copy of ``model_dir`` lives: beside it, ``<name>-w8a8``."""
    src = Path(model_dir)
    return src.parent / f"{src.name}{W8A8_SUFFIX}"


def compile_base(env: Mapping[str, str] | None = None, flags: set[str] | None = None) -> Path:
    """``$RUFUS_COMPILE_CACHE_DIR/<cpu key>``: every compiled artefact of this CPU class
    (vLLM's, inductor's and Triton's caches below, and the planner's int8 kernel)."""
    env = environ() if env is None else env
    flags = effective_flags(cpu_flags() if flags is None else flags, env)
    root = env.get("RUFUS_COMPILE_CACHE_DIR") or str(cache_dir(env) / "compile")
    return Path(root).expanduser() / cpu_key(flags)


def compile_dirs(env: Mapping[str, str] | None = None,
                 flags: set[str] | None = None) -> dict[str, str]:
    """The cache variables this process should have: the operator's where set, else ours."""
    env = environ() if env is None else env
    base = compile_base(env, flags)
    return {var: env.get(var) or str(base / sub) for var, sub in CACHE_VARS.items()}


def configure(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the compile-cache variables (before vLLM or torch is imported) and log them."""
    dirs = compile_dirs(env)
    for var, path in dirs.items():
        if env is None:
            set_environ(var, path)  # this process's: what vLLM and torch read
        else:
            env[var] = path
    log.info("compile caches for this CPU (%s): %s",
             cpu_key(effective_flags(cpu_flags(), environ() if env is None else env)),
             ", ".join(f"{k}={v}" for k, v in dirs.items()))
    return dirs
