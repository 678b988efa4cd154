"""The planner's intra-op thread count, following the cores nobody else is using.

Why: on a small host the planner shares its cores with the answer model's vLLM worker, which
busy-polls a core while it serves. An OpenMP team that counts on that core stalls at every
barrier; a single thread leaves the second core idle whenever the answer model is. Both were
measured (docs/benchmarks-history.md, "Planner threads" and "Round 4").
``torch_threads: "auto"`` therefore runs as many threads as there are cores that other
processes left idle over the last ~0.2 s, decided again before every decoding step.

How: a daemon thread reads ``/proc/stat`` (busy time of this process's cores) and
``/proc/self/stat`` (this process's own CPU time) every ``period`` seconds; the difference is
what other processes used. Linux only; where either file cannot be read, one thread (the
setting that never stalls).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rufus.serving.config import ConfigError

log = logging.getLogger("rufus.qp.cores")

# a core counts as taken once other processes used more than this share of it in the window
TAKEN = 0.25
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_threads(value: Any) -> int | None:
    """``torch_threads`` from model.json: a positive int, or ``"auto"`` (returned as None);
    unset or 0 means every core this process may run on."""
    if value == "auto":
        return None
    n = -1
    if isinstance(value, int | str) and not isinstance(value, bool):
        try:
            n = int(value)
        except ValueError:
            pass
    if n < 0:
        raise ConfigError(f"torch_threads must be a positive integer or \"auto\", "
                          f"not {str(value)[:20]!r}")
    return n or len(os.sched_getaffinity(0))


def read_busy(cpus: set[int], path: str = "/proc/stat") -> int:
    """Busy clock ticks (user, nice, system, irq, softirq) summed over ``cpus``."""
    total = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            if not line.startswith("cpu") or line[3] == " ":
                continue
            name, *ticks = line.split()
            if int(name[3:]) in cpus:
                v = [int(x) for x in ticks]
                total += v[0] + v[1] + v[2] + v[5] + v[6]
    return total


def read_own(path: str = "/proc/self/stat") -> int:
    """This process's user + system clock ticks, every thread included."""
    with open(path, encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)


class CoreWatch:
    """Samples the host's busy time; :meth:`threads` says how many threads to run now."""

    def __init__(self, max_threads: int, cpus: set[int] | None = None, *,
                 period: float = 0.05, window: int = 4,
                 busy: Callable[[], int] | None = None, own: Callable[[], int] = read_own,
                 clock: Callable[[], float] = time.monotonic, hz: float = _HZ,
                 start: bool = True) -> None:
        self.period = period
        self.cpus = set(cpus if cpus is not None else os.sched_getaffinity(0))
        self.max_threads = max(1, min(max_threads, len(self.cpus)))
        self._busy = busy or (lambda: read_busy(self.cpus))
        self._own, self._clock, self._hz = own, clock, hz
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=window + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.broken = False
        self.sample()
        self._thread: threading.Thread | None = None
        if start and not self.broken and self.max_threads > 1:
            self._thread = threading.Thread(target=self._run, name="qp-corewatch", daemon=True)
            self._thread.start()

    def sample(self) -> None:
        """One reading of the host's and this process's busy ticks."""
        try:
            s = (self._clock(), self._busy(), self._own())
        except (OSError, ValueError, IndexError) as exc:
            if not self.broken:
                log.warning("torch_threads auto: cannot read CPU time (%s); running 1 thread",
                            exc)
            self.broken = True
            return
        with self._lock:
            self._samples.append(s)

    def others(self) -> float:
        """Cores other processes used over the window (0 when it cannot be told yet)."""
        with self._lock:
            if len(self._samples) < 2:
                return 0.0
            (t0, b0, o0), (t1, b1, o1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return 0.0
        return max(0.0, ((b1 - b0) - (o1 - o0)) / ((t1 - t0) * self._hz))

    def threads(self) -> int:
        """One thread per core that other processes leave idle, at least 1."""
        if self.broken:
            return 1
        free = len(self.cpus) - self.others()
        return max(1, min(self.max_threads, int(free + TAKEN)))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()
            if self.broken:
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)
