"""Start and stop a real ``tritonserver`` on our model repository.

One launcher for ``make serve``, the tests, the benchmarks and the multi-node rig, so they
all run the server the same way (paths and library settings written by scripts/setup.sh to
``build/triton/env.json``).

    python -m rufus.harness.server [--models rufus_llm,...] [--grpc-port N ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = ROOT / "build" / "triton" / "env.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies, so a
    killed test run or benchmark never leaves a tritonserver (and its engines) behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def triton_env() -> dict[str, str]:
    if not ENV_FILE.exists():
        raise SystemExit(f"{ENV_FILE} missing: run `make setup` (scripts/setup.sh) first")
    return json.loads(ENV_FILE.read_text())


@dataclass
class TritonServer:
    """A tritonserver process in its own process group (so we can end all of it by pid)."""

    models: list[str] = field(default_factory=lambda: ["rufus_llm"])
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    model_repository: Path = ROOT / "model_repository"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    host: str = "0.0.0.0"
    proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        t = triton_env()
        cmd = [
            t["tritonserver"],
            f"--model-repository={self.model_repository}",
            f"--backend-directory={t['backend_directory']}",
            # explicit mode lets a model whose engine died unload itself (-> not ready).
            "--model-control-mode=explicit",
            f"--grpc-port={self.grpc_port}",
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            f"--grpc-address={self.host}",
            f"--http-address={self.host}",
            "--allow-metrics=true",
            "--log-info=true",
            "--exit-timeout-secs=20",
        ]
        cmd += [f"--load-model={m}" for m in self.models]
        return cmd

    def environment(self) -> dict[str, str]:
        t = triton_env()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = t["ld_library_path"] + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env["PYTHONPATH"] = t["pythonpath"]
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update(self.extra_env)
        return env

    def start(self) -> TritonServer:
        out = open(self.log_path, "ab") if self.log_path else None
        self.proc = subprocess.Popen(
            self.command(), env=self.environment(), stdout=out or None,
            stderr=subprocess.STDOUT if out else None, start_new_session=True,
            preexec_fn=die_with_parent,
        )
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def is_ready(self, model: str | None = None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            with urllib.request.urlopen(self.url(path), timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def load_failures(self) -> dict[str, str]:
        """Models Triton gave up on (state UNAVAILABLE with a reason), from the index."""
        req = urllib.request.Request(self.url("/v2/repository/index"), data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                index = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        return {m["name"]: m.get("reason", "") for m in index
                if m.get("name") in self.models and m.get("state") == "UNAVAILABLE"
                and m.get("reason")}

    def wait_ready(self, timeout: float = 900.0, progress: bool = True) -> float:
        """Block until every model is ready; fail early if the process exits or a model
        fails to load (explicit mode keeps the server up with the model unavailable)."""
        t0 = time.monotonic()
        last = 0.0
        while time.monotonic() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode} "
                                   f"before ready (log: {self.log_path})")
            if all(self.is_ready(m) for m in self.models) and self.is_ready():
                return time.monotonic() - t0
            failed = self.load_failures()
            if failed:
                raise RuntimeError(f"model(s) failed to load: {failed} (log: {self.log_path})")
            if progress and time.monotonic() - last > 15:
                last = time.monotonic()
                print(f"[rufus.harness.server] waiting for {self.models} "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s (log: {self.log_path})")

    def stop(self, timeout: float = 40.0) -> None:
        """SIGTERM tritonserver (it finalizes the models, which stop their engines), then
        SIGKILL whatever is left of its process group (stubs, vLLM engine cores)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve the model repository with tritonserver")
    ap.add_argument("--models", default=os.environ.get("RUFUS_MODELS", "rufus_llm"),
                    help="comma-separated models to load (default: %(default)s)")
    ap.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    a = ap.parse_args()
    srv = TritonServer(models=[m for m in a.models.split(",") if m], grpc_port=a.grpc_port,
                       http_port=a.http_port, metrics_port=a.metrics_port)
    print("[rufus.harness.server] " + " ".join(srv.command()), file=sys.stderr, flush=True)
    # exec: tritonserver becomes this process, so signals and exit codes are its own.
    os.execve(srv.command()[0], srv.command(), srv.environment())


if __name__ == "__main__":
    main()
