"""Write an INT8 W8A8 (compressed-tensors) copy of a bf16 Llama checkpoint for vLLM on CPU.

vLLM's CPU backend runs int8 linear layers only as W8A8: int8 weights with dynamic
per-token int8 activations (``CompressedTensorsW8A8Int8`` -> ``CPUInt8ScaledMMLinearKernel``,
oneDNN; there is no CPU kernel for int8 weight-only). This module writes the checkpoint
that path loads, in the format llm-compressor's ``W8A8`` preset produces:

* every Linear in the decoder layers (``model.layers.N.self_attn.{q,k,v,o}_proj``,
  ``model.layers.N.mlp.{gate,up,down}_proj``): ``weight`` int8 ``[out, in]`` and
  ``weight_scale`` float32 ``[out, 1]``, per output channel, symmetric (no zero point);
  scales and rounding come from compressed-tensors itself (``calculate_qparams`` /
  ``quantize``: scale = absmax / 127.5, values clamped to [-128, 127]);
* everything else (embeddings, ``lm_head`` if untied) is copied unchanged (bf16), as
  llm-compressor's default ``ignore=["lm_head"]`` leaves it; the RMSNorm weights are
  copied too, divided by the SmoothQuant scales when smoothing is on (below);
* ``config.json`` gets a compressed-tensors ``quantization_config`` (format
  ``int-quantized``, weights int8 channel static, input activations int8 token dynamic,
  targets ``["Linear"]``, ignore ``["lm_head"]``), built with compressed-tensors'
  ``QuantizationConfig`` so the field names match what vLLM parses.

SmoothQuant (on by default, strength ``alpha`` 0.5 as llm-compressor's
``SmoothQuantModifier``): per-token int8 activations lose much of a small model's accuracy to
a few outlier channels, so before quantizing, each Linear group's input channels are scaled
by ``s = max|x|^alpha / max|W|^(1-alpha)`` (activation maxima from a calibration pass in fp32
over the first 64 questions of data/qp/calib.jsonl, chat-formatted), folded exactly into the
preceding op: ``input_layernorm`` for q/k/v, ``post_attention_layernorm`` for gate/up, the
rows of ``up_proj`` for ``down_proj`` (llm-compressor's Llama mappings). The fp32 function is
unchanged; only where the rounding happens moves. ``--no-smooth`` writes plain
round-to-nearest W8A8.

Served by default where the CPU has int8 dot products (rufus_llm's ``"quantization":
"measured"``, :func:`rufus.machine.precision.resolve_quantization`); ``scripts/setup.sh``
writes it (about 15 s) on every machine, since an image built on one class runs on others.

Default output: ``$RUFUS_CACHE_DIR/models/<source name>-w8a8``. Idempotent: the build stamp
(``rufus-build.json``, as for the default model) records the SHA-256 of every written file
and of the source files; a directory whose stamp still verifies against the same source is
left alone.

CLI::

    python -m rufus.launch.w8a8 [--src DIR] [--out DIR] [--force] [--smooth ALPHA | --no-smooth]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path

from rufus.launch.default_model import STAMP, verify
from rufus.machine.caches import W8A8_SUFFIX, default_model_dir, w8a8_dir
from rufus.machine.fingerprint import file_sha256, sha256

# Bump when the written format changes: a stamp with another version is rebuilt.
FORMAT_VERSION = 2
DEFAULT_ALPHA = 0.5
CALIB_FILE = Path(__file__).resolve().parents[2] / "data" / "qp" / "calib.jsonl"
CALIB_SAMPLES = 64
SUFFIX = W8A8_SUFFIX
# Decoder-layer Linear weights that get quantized (Llama names).
QUANT_WEIGHT = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
IGNORE = ["lm_head"]
# Copied as they are (tokenizer, chat template, generation defaults).
AUX_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt",
             "tokenizer.model", "added_tokens.json")


def say(msg: str) -> None:
    print(f"[w8a8 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def default_out(src: Path) -> Path:
    return w8a8_dir(src)


def quantization_config() -> dict:
    """The ``quantization_config`` block of config.json (llm-compressor's W8A8 preset)."""
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    qc = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme("W8A8", ["Linear"])},
        format=CompressionFormat.int_quantized.value,
        ignore=list(IGNORE),
        quantization_status="compressed",
    )
    out = json.loads(qc.model_dump_json())
    try:
        from compressed_tensors import __version__ as ct_version
        out["version"] = ct_version
    except ImportError:  # pragma: no cover - every release has it
        pass
    return out


def quantize_weight(w):
    """Per-output-channel symmetric int8: returns (int8 [out, in], float32 scale [out, 1])."""
    import torch
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = preset_name_to_scheme("W8A8", ["Linear"]).weights
    x = w.to(torch.float32)
    mins = x.amin(dim=1, keepdim=True)
    maxs = x.amax(dim=1, keepdim=True)
    scale, zp = calculate_qparams(mins, maxs, args)
    # An all-zero row would give scale 0 (then 0/0); any positive scale quantizes it to 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = quantize(x=x, scale=scale, zero_point=zp, args=args, dtype=torch.int8)
    return q.contiguous(), scale.to(torch.float32).contiguous()


def _weight_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [src / n for n in names]
    single = src / "model.safetensors"
    if not single.exists():
        raise SystemExit(f"{src}: no model.safetensors (or index) found")
    return [single]


def source_digests(src: Path) -> dict[str, str]:
    files = [*_weight_files(src), src / "config.json"]
    return {p.name: sha256(p) for p in files}


def _recipe(alpha: float | None, calib: list[list[int]] | None) -> dict:
    """What the stamp records about smoothing: a change in any of it means a rebuild."""
    if alpha is None:
        return {"smoothquant": None}
    if calib is None and not CALIB_FILE.is_file():
        raise SystemExit(f"SmoothQuant calibration file {CALIB_FILE} is missing "
                         "(run from a full checkout, or pass --no-smooth)")
    src = "token ids given by the caller" if calib is not None else \
        f"{CALIB_FILE.name} (first {CALIB_SAMPLES}) sha256 {sha256(CALIB_FILE)}"
    return {"smoothquant": {"alpha": alpha, "calibration": src}}


def up_to_date(src: Path, out: Path, recipe: dict | None = None) -> bool:
    if not verify(out):
        return False
    try:
        stamp = json.loads((out / STAMP).read_text())
    except ValueError:
        return False
    if stamp.get("format_version") != FORMAT_VERSION:
        return False
    if stamp.get("source_files") != source_digests(src):
        say(f"{src} changed since {out} was written; rebuilding")
        return False
    if recipe is not None and stamp.get("recipe") != recipe:
        say(f"{out} was written with {stamp.get('recipe')}; rebuilding with {recipe}")
        return False
    return True


# --- SmoothQuant --------------------------------------------------------------------------

def smoothing_groups(names: set[str]) -> list[tuple[str, str, list[str]]]:
    """(activation key, preceding tensor, Linear modules) per Llama decoder layer:
    q/k/v after input_layernorm, gate/up after post_attention_layernorm, down after up."""
    groups = []
    i = 0
    while f"model.layers.{i}.self_attn.q_proj.weight" in names:
        p = f"model.layers.{i}."
        cand = [
            (p + "self_attn.q_proj", p + "input_layernorm.weight",
             [p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"]),
            (p + "mlp.gate_proj", p + "post_attention_layernorm.weight",
             [p + "mlp.gate_proj", p + "mlp.up_proj"]),
            (p + "mlp.down_proj", p + "mlp.up_proj.weight", [p + "mlp.down_proj"]),
        ]
        for act, prev, lins in cand:
            if prev in names and all(f"{m}.weight" in names for m in lins):
                groups.append((act, prev, lins))
        i += 1
    return groups


def calibration_ids(src: Path) -> list[list[int]]:
    """Token ids of the calibration prompts: the planner's calibration questions (with their
    conversation history), formatted with the model's chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    out = []
    for line in CALIB_FILE.read_text().splitlines()[:CALIB_SAMPLES]:
        d = json.loads(line)
        msgs = [*d.get("history", []), {"role": "user", "content": d["question"]}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def activation_absmax(src: Path, calib: list[list[int]], keys: set[str]) -> dict:
    """Per-input-channel max |x| at the inputs of the named Linear modules (fp32 forward)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_mod, args):
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
            amax[name] = torch.maximum(amax[name], x) if name in amax else x
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if n in keys]
    try:
        with torch.no_grad():
            for ids in calib:
                model.model(torch.tensor([ids]))  # the decoder only: no vocabulary logits
    finally:
        for h in handles:
            h.remove()
    missing = keys - set(amax)
    if missing:
        raise SystemExit(f"calibration saw no input for {sorted(missing)[:3]}...")
    return amax


def smooth(tensors: dict, amax: dict, alpha: float) -> None:
    """Fold SmoothQuant scales into ``tensors`` (fp32 for the Linear weights, the preceding
    norm weights keep their dtype). In place."""
    import torch

    for act, prev, lins in smoothing_groups(set(tensors)):
        ws = [tensors[f"{m}.weight"].to(torch.float32) for m in lins]
        wmax = torch.stack([w.abs().amax(0) for w in ws]).amax(0).clamp(min=1e-5)
        s = amax[act].clamp(min=1e-5).pow(alpha) / wmax.pow(1 - alpha)
        s = torch.where(torch.isfinite(s) & (s > 0), s, torch.ones_like(s))
        for m, w in zip(lins, ws, strict=True):
            tensors[f"{m}.weight"] = w * s[None, :]
        p = tensors[prev]
        pf = p.to(torch.float32)
        pf = pf / s if pf.ndim == 1 else pf / s[:, None]
        tensors[prev] = pf if prev.endswith("_proj.weight") else pf.to(p.dtype)


# --- writing ------------------------------------------------------------------------------

def convert(src: Path, out: Path, alpha: float | None = DEFAULT_ALPHA,
            calib: list[list[int]] | None = None) -> dict[str, int]:
    """Write the W8A8 checkpoint of ``src`` into ``out`` (replaced atomically).

    ``alpha``: SmoothQuant strength (None: no smoothing). ``calib``: calibration token ids
    (default: :func:`calibration_ids`)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise SystemExit(f"{src}/config.json already has a quantization_config; "
                         "the source must be a dense (bf16/fp32) checkpoint")
    recipe = _recipe(alpha, calib)
    files = _weight_files(src)
    tensors, origin, metadata = {}, {}, {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            metadata[path.name] = f.metadata() or {}
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
                origin[name] = path.name
    if alpha is not None:
        groups = smoothing_groups(set(tensors))
        if not groups:
            raise SystemExit(f"{src}: no Llama decoder layers found to smooth")
        if calib is None:
            calib = calibration_ids(src)
        say(f"SmoothQuant alpha={alpha}: calibrating on {len(calib)} prompts "
            f"({sum(map(len, calib))} tokens, fp32)")
        smooth(tensors, activation_absmax(src, calib, {g[0] for g in groups}), alpha)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    counts = {"quantized": 0, "kept": 0}
    weight_map: dict[str, str] = {}
    for path in files:
        shard = {}
        for name in (n for n in tensors if origin[n] == path.name):
            t = tensors[name]
            if QUANT_WEIGHT.match(name) and t.ndim == 2:
                q, s = quantize_weight(t)
                shard[name] = q
                shard[name[: -len("weight")] + "weight_scale"] = s
                counts["quantized"] += 1
            else:
                shard[name] = t.contiguous()
                counts["kept"] += 1
        save_file(shard, str(tmp / path.name), metadata={**metadata[path.name], "format": "pt"})
        weight_map.update(dict.fromkeys(shard, path.name))
        say(f"{path.name}: {counts['quantized']} Linear weights quantized, "
            f"{counts['kept']} tensors kept")
    if counts["quantized"] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"{src}: no decoder-layer Linear weights matched; not a Llama checkpoint?")
    if len(files) > 1:
        total = sum((tmp / p.name).stat().st_size for p in files)
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
            indent=2))
    config["quantization_config"] = quantization_config()
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in AUX_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    written = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / STAMP).write_text(json.dumps({
        "source": str(src), "format_version": FORMAT_VERSION,
        "scheme": "compressed-tensors W8A8 int8 (weights per-channel symmetric, "
                  "activations dynamic per-token symmetric)",
        "recipe": recipe, "source_files": source_digests(src), "files": written}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return counts


def build(src: Path | None = None, out: Path | None = None, force: bool = False,
          alpha: float | None = DEFAULT_ALPHA, calib: list[list[int]] | None = None) -> Path:
    """Write (or verify) the W8A8 checkpoint of ``src`` at ``out``; returns ``out``.

    ``alpha``: SmoothQuant strength, None for plain round-to-nearest W8A8."""
    src = (src or default_model_dir()).expanduser()
    out = (out or default_out(src)).expanduser()
    if not (src / "config.json").is_file():
        raise SystemExit(f"{src}: no config.json (build the default model first: make model)")
    recipe = _recipe(alpha, calib)
    if not force and up_to_date(src, out, recipe):
        say(f"W8A8 model ready at {out} (checksums verified)")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    say(f"quantizing {src} -> {out} (int8 weights per channel, int8 dynamic activations)")
    convert(src, out, alpha, calib)
    if not up_to_date(src, out, recipe):
        raise SystemExit(f"{out}: verification failed right after writing")
    say(f"wrote {out} in {time.monotonic() - t0:.0f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m rufus.launch.w8a8", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=None,
                    help=f"dense source model directory (default {default_model_dir()})")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output directory (default <src>{SUFFIX} next to the source)")
    ap.add_argument("--force", action="store_true", help="rewrite even if the stamp verifies")
    sm = ap.add_mutually_exclusive_group()
    sm.add_argument("--smooth", type=float, default=DEFAULT_ALPHA, metavar="ALPHA",
                    help="SmoothQuant strength (default %(default)s)")
    sm.add_argument("--no-smooth", dest="smooth", action="store_const", const=None,
                    help="plain round-to-nearest W8A8, no calibration")
    args = ap.parse_args(argv)
    build(args.src, args.out, args.force, args.smooth)


if __name__ == "__main__":
    main()
