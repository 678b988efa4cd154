"""What ``make observe`` installs where it is missing: Debian's prometheus and chromium
packages (as root), and Phoenix's own venv, build/observe-venv, from its pinned file and
rebuilt only when that file changes: in the project's venv Phoenix's numpy, pandas and grpcio
would fight requirements.lock."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rufus.env import environ_copy
from rufus.launch.observe_common import BUILD, ROOT, StartError, rel, say
from rufus.launch.observe_procs import run_logged

VENV = ROOT / "build" / "observe-venv"
REQUIREMENTS = ROOT / "observe" / "phoenix" / "requirements.txt"
STAMP = ".rufus-requirements"  # in the venv: what it was built from


def ensure_prometheus(log: Path) -> str:
    """The prometheus binary; Debian's package is installed where it is missing (as root)."""
    exe = shutil.which("prometheus")
    if exe:
        return exe
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        raise StartError("prometheus is not installed: `sudo apt-get install -y "
                         "--no-install-recommends prometheus` (Debian 12: 2.42), or put a "
                         "prometheus binary on PATH")
    # --no-install-recommends: the recommended node exporter would take :9100, the port of
    # make fleet's HAProxy stats
    say("installing Debian's prometheus package (apt-get install -y prometheus; ~30 s)")
    apt = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    env = environ_copy(DEBIAN_FRONTEND="noninteractive")
    try:
        run_logged(apt, log, "apt-get install prometheus", env)
    except StartError:
        say("  apt-get install failed: apt-get update, then once more")
        run_logged(["apt-get", "update", "-q"], log, "apt-get update", env)
        run_logged(apt, log, "apt-get install prometheus", env)
    exe = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(exe).exists():
        raise StartError(f"prometheus still missing after apt-get install (log {rel(log)})")
    return exe


def pinned(requirements: Path, package: str) -> str:
    m = re.search(rf"^{re.escape(package)}==(\S+)", requirements.read_text(), re.M | re.I)
    return m.group(1) if m else "?"


def requirements_stamp(requirements: Path, python: str = sys.executable) -> str:
    """What a venv built from ``requirements`` by ``python`` records: the file's hash and
    the interpreter's version and machine (a venv does not survive a new interpreter)."""
    h = hashlib.sha256(requirements.read_bytes()).hexdigest()
    out = subprocess.run([python, "-c", "import platform, sys; print(sys.version.split()[0], "
                          "platform.machine())"], capture_output=True, text=True, check=True)
    return f"{h} {out.stdout.strip()}\n"


def venv_current(venv: Path, stamp: str) -> bool:
    try:
        return (venv / "bin" / "python").exists() and (venv / STAMP).read_text() == stamp
    except OSError:
        return False


def ensure_venv(venv: Path = VENV, requirements: Path = REQUIREMENTS,
                log: Path = BUILD / "pip.log") -> bool:
    """build/observe-venv from the pinned file; False (nothing done) when it already matches
    the file. Built with --no-deps: the file is a complete freeze."""
    stamp = requirements_stamp(requirements)
    version = pinned(requirements, "arize-phoenix")
    if venv_current(venv, stamp):
        say(f"{rel(venv)}: arize-phoenix {version}, matches {rel(requirements)}")
        return False
    n = sum(1 for x in requirements.read_text().splitlines() if "==" in x and x[:1] != "#")
    say(f"creating {rel(venv)}: arize-phoenix {version} and {n - 1} pinned packages from "
        f"{rel(requirements)} (once; ~1-2 min, ~850 MB; log {rel(log)})")
    (venv / STAMP).unlink(missing_ok=True)
    run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], log, "python -m venv")
    py = str(venv / "bin" / "python")
    run_logged([py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                "--no-input", "-r", str(requirements)], log, "pip install")
    run_logged([py, "-c", "import phoenix.server.main"], log, "import phoenix")
    (venv / STAMP).write_text(stamp)
    say(f"{rel(venv)} ready")
    return True


def ensure_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if exe := shutil.which(name):
            return exe
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        raise StartError("chromium is not installed: `sudo apt-get install -y chromium`")
    say("installing Debian's chromium package (apt-get install -y chromium; ~1 min)")
    BUILD.mkdir(parents=True, exist_ok=True)
    run_logged(["apt-get", "install", "-y", "-q", "chromium"], BUILD / "apt.log",
               "apt-get install chromium", environ_copy(DEBIAN_FRONTEND="noninteractive"))
    return shutil.which("chromium") or "/usr/bin/chromium"
