"""The unit agent's probes: one HTTP GET per node of the unit, and the verdict on each
answer (:class:`NodeCheck`); a poll's verdicts, load and capacity make a :class:`Snapshot`.

The unit is healthy iff every probe passes: the leader's tritonserver readiness and its
models', each model's ``rufus_engine_ready`` gauge, and every follower's ``/health``
(proxy/agent.py says why each one)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from proxy.capacity import Capacity, Load
from proxy.prometheus import prometheus_samples

# A probe returns (HTTP status or None when unreachable, body text or the error).
Fetch = Callable[[str, float], tuple[int | None, str]]


@dataclass
class NodeCheck:
    """One health probe: ``node`` names the process an operator has to look at."""

    node: str
    check: str
    ok: bool
    detail: str


@dataclass
class Snapshot:
    """Everything one poll learned; endpoints answer from the latest one."""

    checks: list[NodeCheck] = field(default_factory=list)
    load: Load | None = None
    capacity: Capacity | None = None
    load_error: str = ""
    at: float = 0.0  # time.time() of the poll
    poll_s: float = 0.0  # how long the poll took

    @property
    def failing(self) -> list[NodeCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and not self.failing


# The reason :func:`http_fetch` gives for a probe that got no answer in time (a slow or hung
# node) rather than a refused connection: the agent gives a slow node ``slow_polls`` polls.
TIMED_OUT = "timed out"


def http_fetch(url: str, timeout: float) -> tuple[int | None, str]:
    """GET ``url``; (status, body) for any HTTP answer, (None, reason) when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace") if exc.fp else ""
        return exc.code, body
    except TimeoutError:
        return None, f"{TIMED_OUT} after {timeout:g} s"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            return None, f"{TIMED_OUT} after {timeout:g} s"
        return None, f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def timed_out(status: int | None, body: str) -> bool:
    return status is None and body.startswith(TIMED_OUT)


def shorten(text: str, n: int = 160) -> str:
    """``text`` on one line (white space folded), at most ``n`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def follower_name(url: str) -> str:
    return f"follower {urlsplit(url).netloc or url}"


def judge_leader(status: int | None, body: str, check: str) -> NodeCheck:
    if status == 200:
        return NodeCheck("leader", check, True, "ready")
    if status is None:
        return NodeCheck("leader", check, False, f"unreachable ({shorten(body)})")
    return NodeCheck("leader", check, False, f"HTTP {status} {shorten(body)}".strip())


def judge_follower(url: str, status: int | None, body: str) -> NodeCheck:
    """A follower is healthy only on 200; its JSON ``state``/``rank`` go into the detail."""
    name = follower_name(url)
    info: dict[str, Any] = {}
    try:
        parsed = json.loads(body) if status is not None else {}
        info = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    if "rank" in info:
        name = f"follower rank {info['rank']} ({urlsplit(url).netloc})"
    if status == 200:
        return NodeCheck(name, "health", True, str(info.get("state", "ok")))
    if status is None:
        return NodeCheck(name, "health", False, f"unreachable ({shorten(body)})")
    state = info.get("state")
    detail = f"state {state}: {info.get('detail', '')}" if state else shorten(body)
    return NodeCheck(name, "health", False, f"HTTP {status} {detail}".strip())


def judge_engines(text: str, models: Sequence[str]) -> list[NodeCheck]:
    """``rufus_engine_ready`` per model: a model whose engine died stays loaded (Triton's
    model readiness stays 200) while it replaces the engine, so this gauge is the check."""
    out = []
    for name, labels, value in prometheus_samples(text):
        model = labels.get("model")
        if name == "rufus_engine_ready" and model in models:
            ok = value != 0
            out.append(NodeCheck("leader", f"engine {model}", ok,
                                 "serving" if ok else "engine down (restarting or given up)"))
    return out
