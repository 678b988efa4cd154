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
  once the planner's Medusa tree is grown for each dtype on this machine's costs,
  :func:`planner_choice` decides instead (modelled time per plan with that dtype's tree).

The result is cached per CPU (:func:`rufus.serving.machine.cpu_key`) and model (its build stamp), so a
new CPU class or a rebuilt model is measured again, and written where an operator reads it:
``$RUFUS_CACHE_DIR/precision/<cpu key>/<model>-<fingerprint>-m<MEASUREMENT>.json``. A start with no
measurement (setup not run on this machine) falls back to the rule the measurements give on
the classes seen so far (bf16 where native, else fp32) and says so. A concrete ``dtype`` in
model.json or ``RUFUS_<MODEL>_ENGINE_ARGS`` is used as given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rufus.serving import machine
from rufus.serving.config import cache_dir, default_model_dir

log = logging.getLogger("rufus.serving.precision")

MEASURED = "measured"
# "int8": int8 weight-only, served by the planner's own forward pass and kernel
# (rufus/qp/decoder/torch_llama.py, int8_kernel.py); vLLM on CPU has no int8 weight-only
# kernel, so it is not a candidate for the answer model.
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
# (rufus/qp/decoder/int8_kernel.py). 3: int8 passes of few rows through the fused stack
# (torch_llama._FusedStack). 4: the int8 kernel's arithmetic in integers (int16 activations,
# vpmaddwd).
MEASUREMENT = 4


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


# The planner's choice, once its trees are grown on this machine's pass costs: the dtype with
# the lowest modelled time per plan (a question's prefill after the reused prompt prefix, about
# a quarter of the 128-token pass, plus a mean plan's tree steps): a dtype whose passes are
# cheap but whose tree stays short can lose to one with a wider tree, and the other way round.
PLAN_TOKENS = 38  # the mean plan on the 263-question eval set
PLAN_PREFILL_SHARE = 0.25


def planner_choice(costs: Mapping[str, Mapping[str, float]],
                   trees: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, float]]:
    """(dtype, modelled ms per plan for each dtype) from pass costs and grown trees."""
    from rufus.qp.tooling.tree import interpolate_cost

    modelled = {}
    for dt, t in trees.items():
        step = interpolate_cost({int(n): ms / 1e3 for n, ms in t["verify_cost_ms"].items()})
        per_step = step(len(t["medusa_tree"]) + 1)
        modelled[dt] = round(1e3 * (PLAN_PREFILL_SHARE * costs[dt]["prefill"] + PLAN_TOKENS
                                    / float(t["expected_tokens_per_step"]) * per_step), 1)
    return min(modelled, key=modelled.__getitem__), modelled


def rule(flags: set[str]) -> str:
    """The fallback without a measurement: bf16 where it is native, fp32 where emulated."""
    return "bfloat16" if machine.native_bf16(flags) else "float32"


def measure(model_dir: str | Path, threads: int = 1,
            progress: Callable[[str], None] = lambda _m: None,
            candidates: tuple[str, ...] = CANDIDATES) -> dict[str, dict[str, float]]:
    """Seconds per pass, per candidate dtype, with the model's own weights."""
    import torch

    from rufus.qp.decoder.torch_llama import DTYPES, TorchLlama
    from rufus.qp.tooling.tree import time_forward

    torch.set_num_threads(threads)
    costs: dict[str, dict[str, float]] = {}
    for dtype in candidates:
        if dtype not in DTYPES:  # a candidate this build's forward pass does not offer
            continue
        model = TorchLlama(model_dir, dtype, max_len=256)
        costs[dtype] = {}
        for name, (n, context, reps) in PASSES.items():
            # one untimed pass first (allocation): a multi-row pass in emulated bf16 takes
            # seconds, so the tree search's three would slow setup for nothing
            costs[dtype][name] = time_forward(model, n, context, reps, warmup=1)
            progress(f"{Path(model_dir).name} {dtype} {name} ({n} tokens): "
                     f"{costs[dtype][name] * 1000:.1f} ms")
        del model
    return costs


def measure_and_store(model_dir: str | Path, threads: int = 1, force: bool = False,
                      progress: Callable[[str], None] = lambda _m: None,
                      extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                      candidates: tuple[str, ...] = CANDIDATES) -> dict[str, Any]:
    """Measure once per CPU and model (kept in :func:`choice_path`), and choose; ``extra``
    adds model-specific results measured on the choice (the planner's tree per dtype)."""
    path = choice_path(model_dir)
    if path.is_file() and not force:
        return json.loads(path.read_text(encoding="utf-8"))
    t0 = time.monotonic()
    costs = measure(model_dir, threads, progress, candidates)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="*", type=Path,
                    help="default: the default model and the planner's model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--force", action="store_true", help="measure again even if cached")
    a = ap.parse_args(argv)
    from rufus.qp.tooling.build import qp_model_dir
    from rufus.qp.tooling.tree import machine_trees

    planner_dir = qp_model_dir()
    if not a.model_dirs:
        a.model_dirs = [default_model_dir(), planner_dir]

    def say(msg: str) -> None:
        print(f"[precision {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"this CPU: {machine.describe()}")
    def planner_extra(r: dict[str, Any], d: Path) -> dict[str, Any]:
        trees = machine_trees(d, r["seconds_per_pass"], a.threads, say)
        best, modelled = planner_choice(r["seconds_per_pass"], trees["planner_trees"])
        say(f"{d.name}: modelled ms per plan {modelled}")
        return {**trees, "planner_modelled_ms_per_plan": modelled,
                "choice": {**r["choice"], "planner": best}}

    for d in a.model_dirs:
        path = choice_path(d)
        if path.is_file() and not a.force:
            say(f"{d.name}: measured before ({path})")
        planner = d.resolve() == planner_dir.resolve()
        # the answer model serves through vLLM: only the dtypes vLLM can run are timed
        res = measure_and_store(d, a.threads, a.force, say, (
            lambda r, d=d: planner_extra(r, d)) if planner else None,
            WORKLOAD_CANDIDATES["planner" if planner else "answer"])
        say(f"{d.name}: choice {res['choice']} (measured in {res.get('took_s', 0)} s; {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
