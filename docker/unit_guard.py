"""Run one node of a multi-node unit and stop it when the unit is broken (docker compose, ECS).

Kubernetes restarts a whole LeaderWorkerSet group when one pod restarts
(``RecreateGroupOnPodRestart``). docker compose and ECS restart single containers only, and a
leader whose follower died keeps running with its model unloaded. This wrapper gives them
the same behaviour: it runs the node's command and polls ``--watch`` URLs (its own health and
its peer's). Once all of them have answered 200 (the unit formed: "armed"), ``--failures``
failed rounds in a row stop the command and exit 75; ``restart: always`` (compose) or the ECS
service then starts the node again, and the restarted node re-forms the unit with its peer,
which the same wrapper has restarted too. Before the unit first forms, a URL that has
answered 200 and then fails ``--failures`` rounds in a row stops the node too: a leader whose
engine was ready and whose unit then broke before the guard saw the whole unit up (its
follower lost between two rounds) unloads its model and rejects every new follower, and
would otherwise wait out ``--startup-timeout``. A URL that never answered 200 enforces
nothing but ``--startup-timeout``, so a starting unit never restarts itself in a loop.

    python docker/unit_guard.py --watch URL [--watch URL ...] -- python -m rufus.launch.server
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

EXIT_UNIT_BROKEN = 75


def healthy(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def log(msg: str) -> None:
    print(f"[unit_guard {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: unit_guard.py --watch URL ... -- COMMAND ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--watch", action="append", default=[], help="URL that must answer 200")
    ap.add_argument("--period", type=float, default=10.0, help="seconds between rounds")
    ap.add_argument("--failures", type=int, default=3, help="failed rounds before stopping")
    ap.add_argument("--startup-timeout", type=float, default=1800.0,
                    help="stop if the unit has not formed after this many seconds")
    ap.add_argument("--grace", type=float, default=30.0, help="SIGTERM grace before SIGKILL")
    a = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        ap.error("no command after --")

    proc = subprocess.Popen(command, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        stop(proc, a.grace)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    t0, armed, failed = time.monotonic(), False, 0
    seen_up: set[str] = set()  # URLs that have answered 200 since this start
    while True:
        try:
            rc = proc.wait(a.period)
            log(f"{command[0]} exited with {rc}")
            return rc
        except subprocess.TimeoutExpired:
            pass
        bad = [u for u in a.watch if not healthy(u, timeout=min(5.0, a.period))]
        seen_up.update(u for u in a.watch if u not in bad)
        if not armed:
            if not bad:
                armed, failed = True, 0
                log(f"unit formed; watching {', '.join(a.watch)}")
            elif time.monotonic() - t0 > a.startup_timeout:
                log(f"unit not formed after {a.startup_timeout:.0f} s ({', '.join(bad)})")
                stop(proc, a.grace)
                return EXIT_UNIT_BROKEN
            else:
                lost = [u for u in bad if u in seen_up]  # was up, now failing: broken
                failed = failed + 1 if lost else 0
                if failed >= a.failures:
                    log(f"unit broken before it formed ({', '.join(lost)} up, then failing "
                        f"{failed} rounds): stopping this node")
                    stop(proc, a.grace)
                    return EXIT_UNIT_BROKEN
            continue
        failed = failed + 1 if bad else 0
        if failed >= a.failures:
            log(f"unit broken ({', '.join(bad)} failing {failed} rounds): stopping this node")
            stop(proc, a.grace)
            return EXIT_UNIT_BROKEN


if __name__ == "__main__":
    sys.exit(main())
