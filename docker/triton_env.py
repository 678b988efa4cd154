"""Write build/triton/env.json (what ``python -m rufus.launch.server`` reads) in the CUDA and Neuron
images, whose Python and tritonserver are not the CPU venv's that scripts/setup.sh prepares.

    python3 docker/triton_env.py system    # tritonserver in /opt/tritonserver (NVIDIA image)
    python3 docker/triton_env.py pytriton  # tritonserver from the nvidia-pytriton wheel
"""

from __future__ import annotations

import json
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "triton"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "system"
    site = sysconfig.get_paths()["purelib"]
    if mode == "system":
        env = {"tritonserver": "/opt/tritonserver/bin/tritonserver",
               "backend_directory": "/opt/tritonserver/backends",
               "ld_library_path": "/opt/tritonserver/lib",
               "pythonpath": f"{ROOT}:{site}"}
    elif mode == "pytriton":  # the same steps as scripts/setup.sh setup_triton
        stubs = Path(site) / "pytriton" / "tritonserver"
        dest = OUT / "backends" / "python"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(stubs / "backends" / "python" / name, dest / name)
        ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
        stub = dest / "triton_python_backend_stub"
        shutil.copy2(stubs / "python_backend_stubs" / ver / "triton_python_backend_stub", stub)
        stub.chmod(0o755)
        libdir = sysconfig.get_config_var("LIBDIR")
        env = {"tritonserver": str(stubs / "bin" / "tritonserver"),
               "backend_directory": str(OUT / "backends"),
               "ld_library_path": f"{libdir}:{site}/nvidia_pytriton.libs",
               "pythonpath": f"{ROOT}:{site}"}
    else:
        raise SystemExit(f"unknown mode {mode!r}: system or pytriton")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env, indent=1))


if __name__ == "__main__":
    main()
