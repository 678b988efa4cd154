"""What every part of ``make observe`` shares (rufus/launch/observe.py and the modules it
joins): where its files are, how it speaks to the operator, the error that says what to fix,
and how it asks a server over HTTP. Standard library only, as the rest: it runs before
``make setup`` too."""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "observe"
PHOENIX_SERVE = ROOT / "observe" / "phoenix" / "serve.py"

# (name, pid file, log, what its command line holds: a pid reused by another program is not
# taken for ours)
PROMETHEUS = ("Prometheus", BUILD / "prometheus.pid", BUILD / "prometheus.log", "prometheus")
PHOENIX = ("Phoenix", BUILD / "phoenix.pid", BUILD / "phoenix.log", str(PHOENIX_SERVE))


class StartError(RuntimeError):
    """Something the operator has to fix; the message says what."""


def say(msg: str) -> None:
    print(f"[observe] {msg}", file=sys.stderr, flush=True)


def rel(path: Path) -> str:
    """``path`` relative to the repository where it is inside it (shorter log lines)."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return 0, b""


def http_json(url: str, body: object | None = None, timeout: float = 5.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
