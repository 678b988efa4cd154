"""The rolling update of the compose rig under load, measured (``make roll``).

    python -m lab.roll_bench [--tag cpu-new] [--concurrency 4] [--cells a b]

Retags the current image (or uses ``--image``), streams a closed-loop load through the
ingress, runs scripts/rolling_update.sh under it for the given cells (default: every cell)
and reports requests served and failed and the first-token times before, during and after
the roll (docs/benchmarks.md). The rig seen
from outside (HAProxy's view, the images, the clients) is rufus/launch/containers.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.loadgen import SHOPPING_PROMPTS, pct
from rufus.launch.containers import CELLS, GRPC, ROOT, in_rotation, inspect, say, wait_until


@dataclass
class Request:
    start: float
    end: float = 0.0
    ttft: float = float("nan")
    error: str = ""


@dataclass
class Load:
    """Closed-loop gRPC streams through the ingress from a background thread, each request
    timed (first token) and its outcome kept, until :meth:`stop`."""

    concurrency: int = 4
    max_tokens: int = 24
    requests: list[Request] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Request]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)
        return self.requests

    async def _run(self) -> None:
        from rufus.client import agenerate

        async def worker(w: int) -> None:
            i = w
            while not self._stop.is_set():
                r = Request(start=time.monotonic())
                self.requests.append(r)
                try:
                    async for ch in agenerate(
                            GRPC, "rufus_llm",
                            messages=[{"role": "user",
                                       "content": SHOPPING_PROMPTS[i % len(SHOPPING_PROMPTS)]}],
                            sampling={"max_tokens": self.max_tokens, "temperature": 0.0,
                                      "ignore_eos": True}, timeout=300):
                        if ch.text and r.ttft != r.ttft:
                            r.ttft = ch.t - r.start
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    r.error = f"{type(exc).__name__}: {str(exc)[:200]}"
                r.end = time.monotonic()
                i += self.concurrency

        await asyncio.gather(*(worker(w) for w in range(self.concurrency)))


def window(reqs: list[Request], t0: float, t1: float) -> dict[str, Any]:
    """Requests that started in [t0, t1): served, failed, first-token p50/p99."""
    sel = [r for r in reqs if t0 <= r.start < t1 and r.end]
    ok = [r for r in sel if not r.error]
    ttfts = [r.ttft for r in ok if r.ttft == r.ttft]

    def ms(q: float) -> int | None:
        return round(pct(ttfts, q) * 1000) if ttfts else None

    return {"served": len(ok), "failed": len(sel) - len(ok),
            "ttft_p50_ms": ms(0.5), "ttft_p99_ms": ms(0.99),
            "errors": sorted({r.error for r in sel if r.error})[:3]}


def cmd_roll(a: argparse.Namespace) -> int:
    image = a.image or f"rufus-inference:{a.tag}"
    cells = list(a.cells or CELLS)
    if set(cells) - set(CELLS):
        say(f"unknown cell(s) {sorted(set(cells) - set(CELLS))}: the rig has {sorted(CELLS)}")
        return 1
    if not a.image:  # the same software under a new tag: what a release changes is the tag
        subprocess.run(["docker", "tag", "rufus-inference:cpu", image], check=True)
    if wait_until(lambda: in_rotation() == set(CELLS), a.ready_timeout, 2) is None:
        say(f"not every cell is in rotation ({sorted(in_rotation())}): run `make compose-up` first")
        return 1
    nodes = [svc for cell in CELLS.values() for svc in cell[:3]]
    images_before = {svc: inspect(svc, "{{.Config.Image}}") for svc in nodes}
    load = Load(concurrency=a.concurrency, max_tokens=a.max_tokens).start()
    say(f"load: {a.concurrency} closed-loop streams through {GRPC}; baseline {a.baseline_s} s")
    time.sleep(a.baseline_s)
    t_roll = time.monotonic()
    rotation: list[tuple[float, list[str]]] = []
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/rolling_update.sh"), "--image", image,
                             *cells])
    while proc.poll() is None:
        try:
            now = sorted(in_rotation(strict=True))
        except (OSError, ValueError, IndexError):
            time.sleep(0.5)
            continue
        if not rotation or rotation[-1][1] != now:
            rotation.append((time.monotonic() - t_roll, now))
        time.sleep(0.5)
    t_done = time.monotonic()
    time.sleep(a.after_s)
    reqs = load.stop()
    before, during = window(reqs, 0, t_roll), window(reqs, t_roll, t_done)
    after = window(reqs, t_done, float("inf"))
    fewest = min((len(up) for _, up in rotation), default=len(CELLS))
    images = {svc: inspect(svc, "{{.Config.Image}}") for svc in nodes}
    rolled = {svc for cell in cells for svc in CELLS[cell][:3]}
    report = {"image": image, "cells": cells, "roll_s": round(t_done - t_roll),
              "exit": proc.returncode,
              "before": before, "during": during, "after": after,
              "fewest_cells_in_rotation": fewest,
              "rotation": [(round(t), c) for t, c in rotation], "images": images}
    text = json.dumps(report, indent=1)
    print(text)
    if a.report:
        Path(a.report).write_text(text)
    # Pass: the script finished (it never drains a cell while another is out of rotation),
    # no request failed, every node of a rolled cell runs the new image and every other node
    # the image it ran before. The rotation timeline is reported,
    # not judged: HAProxy's own health checks can flap a cell for a second on an
    # oversubscribed host (docs/benchmarks-history.md, "Containers").
    ok = (proc.returncode == 0 and before["failed"] == during["failed"] == after["failed"] == 0
          and all(images[svc] == image for svc in rolled)
          and all(images[svc] == images_before[svc] for svc in nodes if svc not in rolled))
    if fewest < len(CELLS) - 1:
        say(f"note: at one sample HAProxy had {fewest} cell(s) UP (a health-check flap, or "
            "the drained cell's recreated containers shown UP before their first check)")
    say("rolling update " + ("passed: zero failed requests" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="environment: RUFUS_UNIT_SECRET (scripts/compose.sh)")
    ap.add_argument("--tag", default="cpu-roll", help="tag the current image gets (default %(default)s)")
    ap.add_argument("--image", help="roll to this image instead of retagging the current one")
    ap.add_argument("--cells", nargs="+", choices=sorted(CELLS),
                    help="roll these cells, one at a time (default: every cell)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--baseline-s", type=float, default=60.0, help="load before the roll")
    ap.add_argument("--after-s", type=float, default=10.0, help="load after the roll")
    ap.add_argument("--report", type=Path, help="also write the report (JSON) to this file")
    ap.add_argument("--ready-timeout", type=float, default=900.0,
                    help="wait this long for every cell to be in rotation first")
    return cmd_roll(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
