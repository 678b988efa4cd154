"""``make observe``'s background processes: pid files that never lead to another program
(:func:`live_pid`), a stop that escalates to SIGKILL, a start in a session of its own (both
servers outlive ``make``), and an installer's run logged to a file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from rufus.launch.observe_common import ROOT, StartError, rel, say


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def live_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and ours (``marker`` in its command
    line); a stale file (the process gone, or its pid taken by another program) is removed."""
    pid = read_pid(pid_file)
    if pid is not None and alive(pid) and (marker in cmdline(pid)
                                          or not Path("/proc").is_dir()):
        return pid
    pid_file.unlink(missing_ok=True)
    return None


def signal_process(pid: int, sig: signal.Signals) -> None:
    """To the process's group where it leads one (``up`` starts each in its own session, so
    helpers it spawned go too), else to the process alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop(pid_file: Path, marker: str, name: str, grace: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; False when it was not running."""
    pid = live_pid(pid_file, marker)
    if pid is None:
        say(f"{name}: not running")
        return False
    signal_process(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    how = "stopped"
    if alive(pid):
        signal_process(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        how = f"killed (no exit {grace:.0f} s after SIGTERM)"
    pid_file.unlink(missing_ok=True)
    say(f"{name}: {how} (pid {pid})")
    return True


def spawn(argv: list[str], env: Mapping[str, str], log: Path, pid_file: Path
          ) -> subprocess.Popen[bytes]:
    """A background process in a session of its own, output appended to ``log``."""
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env), cwd=ROOT,
                                start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    return proc


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_logged(argv: list[str], log: Path, what: str, env: Mapping[str, str] | None = None
               ) -> None:
    """Run ``argv`` with its output in ``log``, a progress line every 15 s; a failure raises
    with the log's last lines."""
    t0 = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n=== {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=None if env is None else dict(env))
        next_say = 15.0
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() - t0 >= next_say:
                say(f"  {what}: {next_say:.0f} s (log {rel(log)})")
                next_say += 15
    if proc.returncode != 0:
        raise StartError(f"{what} failed (exit {proc.returncode}); last lines of {rel(log)}:\n"
                         f"{tail(log)}")
