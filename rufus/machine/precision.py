"""Precision chosen by measurement on this machine: ``"dtype": "measured"`` in a model.json.

No single precision is right on a mixed fleet: where bf16 is native (AVX-512 bf16, AMX) it
halves the bytes read per token at no cost; where it is emulated (AVX2) a multi-row pass (a
prefill, the planner's tree verification, vLLM's start-up profile run) is several times
slower than fp32 (docs/benchmarks.md). So setup (``scripts/setup.sh precision``) times the
passes that matter with the model's own weights in each candidate dtype (a 128-token
prefill, a one-token decode step, a 16-token verification pass; one thread, as served) and
picks, per workload, the dtype with the lower cost:

* ``answer`` (rufus_llm): one prefill + 32 decode steps (a prompt and the start of an answer);
* ``planner`` (rufus_qp_medusa): one prefill + 8 verification passes (a plan's tree passes);
  once the planner's Medusa tree is grown for each dtype on this machine's costs, the
  planner's own rule decides instead (modelled time per plan with that dtype's tree).

This module knows the machine, the cache and the record, not the models: the setup program
(``python -m rufus.launch.setup_precision``) passes :func:`run` each model's :class:`Measurement`
(which model, what it adds to the record) and the forward pass that times the passes, so
nothing here imports a model.

The result is cached per CPU (:func:`rufus.machine.cpu.cpu_key`) and model (its build stamp), so a
new CPU class or a rebuilt model is measured again, and written where an operator reads it:
``$RUFUS_CACHE_DIR/precision/<cpu key>/<model>-<fingerprint>-m<MEASUREMENT>.json``. A start with no
measurement (setup not run on this machine) falls back to the rule the measurements give on
the classes seen so far (bf16 where native, else fp32) and says so. A concrete ``dtype`` in
model.json or ``RUFUS_<MODEL>_ENGINE_ARGS`` is used as given.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rufus.env import environ
from rufus.machine import cpu as machine
from rufus.machine.caches import cache_dir, w8a8_dir

log = logging.getLogger("rufus.machine.precision")

MEASURED = "measured"
# "int8": int8 weight-only, served by the planner's own forward pass and kernel
# (rufus/qp/decoder/torch_llama.py, int8_kernel.py). Not a dtype candidate for the answer
# model: there int8 is a quantization method on top of the dtype, chosen by a rule
# (resolve_quantization: the W8A8 copy, or rufus_int8 where the dtype is float32).
CANDIDATES = ("bfloat16", "float32", "int8")
WORKLOAD_CANDIDATES: dict[str, tuple[str, ...]] = {
    "answer": ("bfloat16", "float32"),
    "planner": ("bfloat16", "float32", "int8"),
}
# seconds of a workload = sum(weight * seconds of the pass)
WORKLOADS: dict[str, dict[str, float]] = {
    "answer": {"prefill": 1.0, "decode": 32.0},
    "planner": {"prefill": 1.0, "verify": 8.0},
}
# pass -> (tokens in the pass, cached context before it, timed repetitions)
PASSES: dict[str, tuple[int, int, int]] = {
    "prefill": (128, 0, 2), "decode": (1, 128, 8), "verify": (16, 128, 4)}
STAMPS = ("rufus-build.json", "rufus-qp-build.json", "config.json")
# Bumped when what is measured changes (a new candidate or kernel), so every machine measures
# again instead of serving a choice made without it. 2: int8 through our own kernel
# (rufus/machine/int8_kernel.py). 3: int8 passes of few rows through the fused stack
# (torch_llama._FusedStack). 4: the int8 kernel's arithmetic in integers (int16 activations,
# vpmaddwd). 5: int8 passes with int8 activations where the kernel has them (AVX-512 VNNI;
# the planner's shipped ``int8_activations``).
MEASUREMENT = 5

# INT8 W8A8 for the answer model (rufus/launch/w8a8.py writes ``<model>-w8a8``: int8
# per-channel weights, dynamic per-token int8 activations, vLLM's oneDNN int8 kernel).
# Served where the CPU has int8 dot products, VNNI (vpdpbusd) or AMX: there its prefill is
# faster than bf16's and, now that the answer model only picks under a grammar, it picks what
# bf16 picks (figures: docs/benchmarks-history.md, "Menu lines" and "INT8 W8A8"). Without
# them (AVX2 only) oneDNN runs s8s8 through its ``gemm:jit``
# kernel, whose u8*s8 pair sums saturate at int16 for 8-bit weights (wrong results) and
# which is much slower than fp32 for few rows (measured with ONEDNN_MAX_CPU_ISA=AVX2).
# AVX-VNNI (``avx_vnni``, AVX2 with VNNI) is not listed: not measured.
W8A8_CPU_FLAGS = ("avx512_vnni", "amx_int8")


# Where the answer model would run in float32 (no native bf16, no int8 dot products: AVX2),
# its linear layers run int8 weight-only through the planner's kernel instead
# (rufus/machine/vllm_int8.py registers the method with vLLM): a decode step reads a quarter
# of the bytes, and decode steps are most of the answer engine's work under load (figures:
# docs/benchmarks-history.md, "Int8 weights for the answer model on AVX2").
INT8_WEIGHT_ONLY = "rufus_int8"


def int8_weights_ok(env: Mapping[str, str] | None = None) -> bool:
    """Whether rufus's int8 kernel builds and loads for this CPU (it logs why not)."""
    from rufus.machine import int8_kernel
    return int8_kernel.load(env) is not None


def cpu_runs_w8a8_well(flags: set[str] | frozenset[str]) -> bool:
    """Whether this CPU class serves the W8A8 copy of the answer model."""
    return any(f in flags for f in W8A8_CPU_FLAGS)

Progress = Callable[[str], None]
# (model dir, dtype, threads) -> a timer of one pass with that model loaded in that dtype,
# (tokens, cached context, repetitions) -> mean seconds; None where the dtype is not offered
PassTimer = Callable[[Path, str, int], Callable[[int, int, int], float] | None]


@dataclass(frozen=True)
class Measurement:
    """One model's measurement at setup, passed to :func:`run` by the program: ``workload`` (a
    key of :data:`WORKLOADS`) names its candidates and its choice, ``model_dir`` the model
    setup measures, ``extra`` what the model adds to its record from the pass costs (the
    planner: its trees per dtype and the choice they give)."""

    workload: str
    model_dir: Callable[[], Path]
    extra: Callable[[dict[str, Any], Path, int, Progress], dict[str, Any]] | None = None


def model_fingerprint(model_dir: str | Path) -> str:
    """The model's build stamp (checksums of its files) or, without one, its files' sizes."""
    d = Path(model_dir)
    for name in STAMPS[:2]:
        if (d / name).is_file():
            return hashlib.sha256((d / name).read_bytes()).hexdigest()[:12]
    sizes = sorted((p.name, p.stat().st_size) for p in d.glob("*") if p.is_file())
    return hashlib.sha256(repr(sizes).encode()).hexdigest()[:12]


def choice_path(model_dir: str | Path, env: Mapping[str, str] | None = None) -> Path:
    d = Path(model_dir)
    return (cache_dir(env) / "precision" / machine.cpu_key(machine.this_cpu(env))
            / f"{d.name}-{model_fingerprint(d)}-m{MEASUREMENT}.json")


def choose(costs: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """Per workload, the measured candidate with the lowest weighted cost."""
    out = {}
    for workload, weights in WORKLOADS.items():
        total = {dt: sum(w * costs[dt][p] for p, w in weights.items())
                 for dt in WORKLOAD_CANDIDATES[workload] if dt in costs}
        out[workload] = min(total, key=total.__getitem__)
    return out


def rule(flags: set[str]) -> str:
    """The fallback without a measurement: bf16 where it is native, fp32 where emulated."""
    return "bfloat16" if machine.native_bf16(flags) else "float32"


def measure(model_dir: str | Path, threads: int = 1,
            progress: Progress = lambda _m: None,
            candidates: tuple[str, ...] = CANDIDATES,
            *, timer: PassTimer) -> dict[str, dict[str, float]]:
    """Seconds per pass, per candidate dtype, with the model's own weights, timed by
    ``timer`` (the program passes the forward pass that runs each candidate)."""
    costs: dict[str, dict[str, float]] = {}
    for dtype in candidates:
        time_pass = timer(Path(model_dir), dtype, threads)
        if time_pass is None:  # a candidate this build's forward pass does not offer
            continue
        costs[dtype] = {}
        for name, (n, context, reps) in PASSES.items():
            costs[dtype][name] = time_pass(n, context, reps)
            progress(f"{Path(model_dir).name} {dtype} {name} ({n} tokens): "
                     f"{costs[dtype][name] * 1000:.1f} ms")
        del time_pass  # the model it holds, before the next dtype's is loaded
    return costs


def measure_and_store(model_dir: str | Path, threads: int = 1, force: bool = False,
                      progress: Progress = lambda _m: None,
                      extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                      candidates: tuple[str, ...] = CANDIDATES,
                      *, timer: PassTimer) -> dict[str, Any]:
    """Measure once per CPU and model (kept in :func:`choice_path`), and choose; ``extra``
    adds model-specific results measured on the choice (the planner's tree per dtype)."""
    path = choice_path(model_dir)
    if path.is_file() and not force:
        return json.loads(path.read_text(encoding="utf-8"))
    t0 = time.monotonic()
    costs = measure(model_dir, threads, progress, candidates, timer=timer)
    result: dict[str, Any] = {
        "model": str(model_dir), "cpu": machine.describe(), "threads": threads,
        "seconds_per_pass": costs, "workloads": WORKLOADS, "choice": choose(costs)}
    if extra is not None:
        result.update(extra(result))
    result["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result["took_s"] = round(time.monotonic() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(path)
    return result


def stored(model_dir: str | Path, env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """This CPU's stored measurement of ``model_dir``, or None (setup not run here)."""
    try:
        data = json.loads(choice_path(model_dir, env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def resolve(engine_args: dict[str, Any], workload: str,
            env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``engine_args`` with ``"dtype": "measured"`` replaced by this machine's choice."""
    if str(engine_args.get("dtype", "")) != MEASURED:
        return engine_args
    model_dir = Path(str(engine_args["model"]))
    path = choice_path(model_dir, env)
    try:
        chosen = (stored(model_dir, env) or {})["choice"][workload]
        how = f"measured on this CPU ({path})"
    except (KeyError, TypeError):
        flags = machine.this_cpu(env)
        chosen = rule(flags)
        how = (f"no measurement for this CPU and model ({path} missing: run "
               f"`scripts/setup.sh precision`), rule for {machine.cpu_class(flags)}")
    log.info("%s dtype %s: %s", workload, chosen, how)
    return {**engine_args, "dtype": chosen}


def w8a8_copy(model_dir: str | Path) -> Path | None:
    """The W8A8 copy of ``model_dir`` when it is complete and written from these weights
    (its build stamp, written last, names the source's model.safetensors checksum, which
    the source's own stamp records), else None."""
    src, out = Path(model_dir), w8a8_dir(model_dir)
    try:
        built = json.loads((out / STAMPS[0]).read_text(encoding="utf-8"))
        source = json.loads((src / STAMPS[0]).read_text(encoding="utf-8"))
        want = source["files"]["model.safetensors"]
        if isinstance(want, dict):  # a stamp that records more than the checksum
            want = want.get("sha256")
        return out if built["source_files"]["model.safetensors"] == want else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_quantization(engine_args: dict[str, Any], workload: str = "answer",
                         env: Mapping[str, str] | None = None, lora: bool = False
                         ) -> dict[str, Any]:
    """``"quantization": "measured"`` (rufus_llm's model.json): the model becomes its W8A8
    copy where this CPU runs it well and the copy is built, else the key goes (vLLM then
    reads the model's own config). Any other value, ``null`` included, is vLLM's. With LoRA
    adapters (``lora``: a multi_lora.json) the source weights: vLLM's CPU int8 layers hand
    their weights to oneDNN and its LoRA layers then fail to start (vLLM 0.32)."""
    if str(engine_args.get("quantization", "")) != MEASURED:
        return engine_args
    out = {k: v for k, v in engine_args.items() if k != "quantization"}
    if lora:
        log.info("%s weights: %s (LoRA adapters: vLLM's CPU int8 layers cannot take them)",
                 workload, Path(str(out["model"])).name)
        return out
    flags = machine.this_cpu(env)
    onednn = (environ() if env is None else env).get("ONEDNN_MAX_CPU_ISA", "").upper()
    capped = bool(onednn) and not onednn.startswith(("AVX512", "AVX10", "DEFAULT", "ALL"))
    if workload != "answer" or not cpu_runs_w8a8_well(flags) or capped:
        why = (f"ONEDNN_MAX_CPU_ISA={onednn}" if capped else
               f"no int8 dot products on {machine.cpu_class(flags)} (needs {' or '.join(W8A8_CPU_FLAGS)})")
        if workload == "answer" and str(out.get("dtype")) == "float32" and int8_weights_ok(env):
            log.info("%s weights: %s as int8 weight-only through rufus's kernel (%s; "
                     "float32 activations)", workload, Path(str(out["model"])).name, why)
            return {**out, "quantization": INT8_WEIGHT_ONLY}
        log.info("%s weights: %s (%s)", workload, Path(str(out["model"])).name, why)
        return out
    copy = w8a8_copy(str(out["model"]))
    if copy is None:
        log.warning("%s weights: %s; no W8A8 copy of it built (run `scripts/setup.sh w8a8`): "
                    "serving it as it is", workload, Path(str(out["model"])).name)
        return out
    log.info("%s weights: int8 W8A8 copy %s (this CPU has int8 dot products)", workload, copy)
    return {**out, "model": str(copy)}


def run(model_dirs: Sequence[Path], measurements: Sequence[Measurement], timer: PassTimer,
        threads: int = 1, force: bool = False) -> int:
    """Measure each of ``measurements``' models (or ``model_dirs``) on this machine, timing
    passes with ``timer``: the setup program (rufus/launch/setup_precision.py) passes both, so this
    module knows no model."""
    by_workload = {m.workload: m for m in measurements}
    named = {w: m.model_dir() for w, m in by_workload.items()}

    def say(msg: str) -> None:
        print(f"[precision {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"this CPU: {machine.describe()}")
    for d in model_dirs or list(named.values()):
        path = choice_path(d)
        if path.is_file() and not force:
            say(f"{d.name}: measured before ({path})")
        # a directory no measurement names is timed as an answer model
        workload = next((w for w, md in named.items() if md.resolve() == d.resolve()),
                        "answer")
        add = by_workload[workload].extra if workload in by_workload else None
        extra = None if add is None else (
            lambda r, d=d, add=add: add(r, d, threads, say))
        res = measure_and_store(d, threads, force, say, extra,
                                WORKLOAD_CANDIDATES[workload], timer=timer)
        say(f"{d.name}: choice {res['choice']} (measured in {res.get('took_s', 0)} s; {path})")
    return 0
