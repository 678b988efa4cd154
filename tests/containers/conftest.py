"""The two-cell docker compose rig, once for tests/containers: engine, image, rig up; down at the end.

Real parts only: Debian's Docker engine (installed and started by docker/engine.sh where it
is missing: root + apt), the image built by scripts/image.sh from the wheelhouse, the rig of
docker/compose.yaml, and the real clients through the ingress. Skipped (with the reason)
where no engine can be had. At the end the rig's containers and network are removed, and
a dockerd the session started is stopped by its pid. The images (with their build cache)
and the nodes' compile-cache volumes are kept: the next run builds the image from cached
layers (only what changed since) and its cells start from the kernels compiled here
instead of compiling them again. ``--remove-images`` removes them too (and the image a
build replaced is removed either way, so kept images do not pile up). Before `down`, the
containers' logs (with timestamps) and the roll's report are kept in `log_dir`
(tests/conftest.py), so a slow start or roll can be read
afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rufus.launch import containers as rig
from tests.environment import option

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("rufus-inference:cpu", "rufus-ingress:2.6")


def _engine_up() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, check=False).returncode == 0


def _engine_possible() -> str | None:
    """None if an engine runs or can be installed here, else why not."""
    if _engine_up():
        return None
    if os.geteuid() != 0:
        return "no Docker engine running and not root (docker/engine.sh installs one as root)"
    if subprocess.run(["which", "apt-get"], capture_output=True, check=False).returncode != 0:
        return "no Docker engine and no apt-get to install Debian's"
    return None


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _image_id(ref: str) -> str:
    """The image's id, '' if there is none by that name."""
    r = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref],
                       capture_output=True, text=True, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def _clear_leftovers() -> None:
    """Containers and networks of an interrupted run (a killed session leaves them, and
    two compose runs started at once leave two networks of one name, which every later
    `up` refuses as ambiguous). Only called when no rig is in rotation."""
    subprocess.run(["bash", str(ROOT / "scripts/compose.sh"), "down", "--remove-orphans"],
                   capture_output=True, check=False, timeout=300)
    ids = subprocess.run(["docker", "network", "ls", "-q", "--filter", "name=^rufus_default$"],
                         capture_output=True, text=True, check=False).stdout.split()
    for net in ids:
        subprocess.run(["docker", "network", "rm", net], capture_output=True, check=False)


# KV cache per node, GiB, when this suite runs beside the integration suite on a second
# pytest-xdist worker (SUITES_XDIST, docs/operations.md): 1 leaves the integration servers room
# on a 23 GiB machine. In one process the rig keeps the compose default (2).
SIDE_BY_SIDE_KVCACHE_GB = "1"


def _save_logs(d: Path) -> None:
    """Every container's log, timestamped (the ones the roll recreated: since their start)."""
    with open(d / "compose-rig.log", "wb") as f:
        subprocess.run(["bash", str(ROOT / "scripts/compose.sh"), "logs", "--timestamps",
                        "--no-color"], stdout=f, stderr=subprocess.STDOUT, check=False,
                       timeout=300)


@pytest.fixture(scope="module")
def compose_rig(log_dir: Path) -> Iterator[None]:
    """Module scope: the rig (four engines, about 17 GiB of memory; about 13 GiB side by
    side) is down again at the end of this module."""
    why = _engine_possible()
    if why:
        pytest.skip(why)
    engine_was_up = _engine_up()
    subprocess.run(["bash", str(ROOT / "docker/engine.sh"), "start"], check=True)
    # stop at the end only a daemon this session started (engine.sh wrote its pid)
    started_engine = not engine_was_up and (ROOT / "build/docker/dockerd.pid").exists()
    reuse = bool(rig.in_rotation())  # a rig already up (make compose-up): use it, leave it
    if not reuse:
        busy = [p for p in (8000, 8001, 8002, 8090, 8404, 9000) if _port_taken(p)]
        if busy:
            pytest.fail(f"ports {busy} are in use: the rig publishes them (stop what holds them)")
    before = {ref: _image_id(ref) for ref in IMAGES}
    # kept in the rig's build/docker/rig.yaml, so every later compose command of the module
    # (the rolling update recreates the cells) runs the nodes with it
    kv = ["--kvcache-gb", SIDE_BY_SIDE_KVCACHE_GB] if os.environ.get("PYTEST_XDIST_WORKER") else []
    try:
        if not reuse:
            _clear_leftovers()
            subprocess.run(["bash", str(ROOT / "scripts/compose.sh"), "up", *kv,
                            "--prebuild", str(option("--prebuild"))], check=True, timeout=3000)
        yield
    finally:
        if not reuse:
            _save_logs(log_dir)
            keep = not option("--remove-images")
            subprocess.run(["bash", str(ROOT / "scripts/compose.sh"), "down",
                            *([] if keep else ["--volumes"])], check=False, timeout=300)
            subprocess.run(["docker", "rmi", "-f", "rufus-inference:cpu-roll"],
                           capture_output=True, check=False)
            for ref, old in before.items():
                if old and old != _image_id(ref):
                    # the image this build replaced: untagged now, and nothing builds on it
                    # (the build cache is in the new image's layers and cpu-build's)
                    subprocess.run(["docker", "rmi", old], capture_output=True, check=False)
                if not keep and not old:  # built by this session
                    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, check=False)
        if started_engine:
            subprocess.run(["bash", str(ROOT / "docker/engine.sh"), "stop"], check=False)
