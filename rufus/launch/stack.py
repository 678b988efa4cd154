"""``make serve``: tritonserver and the OpenAI-compatible frontend side by side.

Both run in their own process groups; Ctrl-C / SIGTERM, or either process exiting, ends the
other, each by its pid (tritonserver through :meth:`TritonServer.stop`, which finalizes the
models first). The frontend starts at once and answers 503 until Triton is ready.

    python -m rufus.launch.stack [--models rufus_llm,...] [--openai-port N]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

from rufus.env import env_str, environ_copy, exits_on_env_error
from rufus.launch.children import die_with_parent, stop_group
from rufus.launch.server import (
    EXIT_LOAD_STALLED,
    ROOT,
    LoadWatch,
    ServerSettings,
    TritonServer,
    server_parser,
)
from rufus.serving.settings import env_var, help_epilog, read


def start_frontend(grpc_url: str, port: int, models: str = "rufus_llm",
                   extra_args: list[str] | None = None,
                   log_path: str | None = None) -> subprocess.Popen[bytes]:
    """``python -m rufus.frontend`` in its own process group, ended with its parent."""
    out = open(log_path, "ab") if log_path else None
    inherited = env_str("PYTHONPATH")
    env = environ_copy(PYTHONPATH=str(ROOT) + (os.pathsep + inherited if inherited else ""))
    for secret in ("RUFUS_ADMIN_KEY", "RUFUS_UNIT_SECRET"):  # Triton's, not the frontend's
        env.pop(secret, None)
    return subprocess.Popen(
        [sys.executable, "-m", "rufus.frontend", "--triton-url", grpc_url, "--port", str(port),
         "--models", models, *(extra_args or [])],
        env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if out else None,
        start_new_session=True, preexec_fn=die_with_parent)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the process, then SIGKILL its group if it lingers."""
    stop_group(proc, timeout)


@dataclass(frozen=True)
class StackSettings:
    """What ``make serve``'s stack reads besides the launcher's settings."""

    openai_port: int = env_var("OPENAI_PORT", 9000, "default of --openai-port", minimum=1,
                               maximum=65535)
    openai_models: str = env_var("RUFUS_OPENAI_MODELS", "rufus_llm", "default of --openai-models")


@exits_on_env_error
def main(argv: list[str] | None = None) -> int:
    s = read(StackSettings)
    ap = server_parser("Serve the model repository with tritonserver and the "
                       "OpenAI-compatible frontend",
                       help_epilog(ServerSettings, StackSettings, extra={
                           "...": "what python -m rufus.launch.server and python -m "
                                  "rufus.frontend read"}),
                          "comma-separated models tritonserver loads (default: %(default)s)")
    ap.add_argument("--openai-port", type=int, default=s.openai_port)
    ap.add_argument("--openai-models", default=s.openai_models,
                    help="Triton models offered as OpenAI model ids (default: %(default)s)")
    a = ap.parse_args(argv)
    srv = TritonServer(models=[m for m in a.models.split(",") if m], grpc_port=a.grpc_port,
                       http_port=a.http_port, metrics_port=a.metrics_port)
    print("[rufus.launch.stack] " + " ".join(srv.command()), file=sys.stderr, flush=True)
    srv.start()
    fe = start_frontend(f"127.0.0.1:{a.grpc_port}", a.openai_port, a.openai_models)
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        print(f"[rufus.launch.stack] {signal.Signals(signum).name}: stopping", file=sys.stderr,
              flush=True)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    watch = LoadWatch(srv, who="rufus.launch.stack")
    try:
        ready_said = False
        while not stopping:
            if not watch.poll():
                code = EXIT_LOAD_STALLED
                break
            assert srv.proc is not None
            if srv.proc.poll() is not None:
                print(f"[rufus.launch.stack] tritonserver exited ({srv.proc.returncode})",
                      file=sys.stderr, flush=True)
                code = srv.proc.returncode or 1
                break
            if fe.poll() is not None:
                print(f"[rufus.launch.stack] frontend exited ({fe.returncode})",
                      file=sys.stderr, flush=True)
                code = fe.returncode or 1
                break
            if not ready_said and srv.is_ready():
                ready_said = True
                print(f"[rufus.launch.stack] ready: Triton gRPC :{a.grpc_port}, HTTP "
                      f":{a.http_port}; OpenAI API http://127.0.0.1:{a.openai_port}/v1",
                      file=sys.stderr, flush=True)
            time.sleep(0.5)
    finally:
        # Ctrl-C/SIGTERM must end everything within 10 s (issue 14): SIGKILL the groups
        # of whatever has not exited after its grace (vLLM engine cores are in Triton's group)
        stop_process(fe, 2.0)
        srv.stop(timeout=6.0)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
