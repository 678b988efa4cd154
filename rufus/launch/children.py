"""The launcher's child processes, never left behind: each dies with the process that started
it (:func:`die_with_parent`, :func:`start_reaper` for its whole process group), optionally
confined to some cores, and is stopped with its group (:func:`stop_group`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies, so a
    killed test run or benchmark never leaves a tritonserver (and its engines) behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_setup(cpus: tuple[int, ...] | None) -> Callable[[], None]:
    """preexec_fn: :func:`die_with_parent`, and with ``cpus`` the server and every process it
    starts (model stubs, vLLM engine cores) confined to those cores: one host's share of
    this machine when several "hosts" (a local fleet's units) share it."""
    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


# Watches the process that started a tritonserver; when that process is gone (a test run
# or benchmark killed with SIGKILL runs no cleanup), it ends the server's whole process
# group: PR_SET_PDEATHSIG reaches tritonserver only, and vLLM engine cores and workers
# (children of the model stubs, same process group) were left behind as orphans.
_REAPER = """
import os, signal, sys, time
parent, pgid = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while True:
    time.sleep(1.0)
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        sys.exit(0)
    if os.getppid() != parent and not alive(parent):
        break
for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        sys.exit(0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait:
        time.sleep(0.2)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            sys.exit(0)
"""


def start_reaper(pgid: int) -> subprocess.Popen[bytes]:
    """A tiny watchdog that ends process group ``pgid`` once this process is gone."""
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), str(pgid)],
                            start_new_session=True, stdin=subprocess.DEVNULL)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM a child started with ``start_new_session=True``, then SIGKILL its group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
