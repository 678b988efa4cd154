"""What the unit agent answers, and the servers that answer it: ``GET /health``, ``/load``
and ``/metrics`` on its HTTP port, one line of HAProxy's agent-check protocol per TCP
connection on its check port (proxy/agent.py describes both). Every answer is rendered from
the latest :class:`Snapshot`, so a hung unit never blocks the load balancer's checks."""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from proxy.capacity import DEFAULT_CAPACITY_REFERENCE, weight_percent
from proxy.probes import Snapshot, shorten

log = logging.getLogger("proxy.agent")


def snapshot_weight(snap: Snapshot, reference: int = DEFAULT_CAPACITY_REFERENCE) -> int:
    """The weight the agent reports for a snapshot (agent-check, /load, /metrics)."""
    return weight_percent(snap.load, capacity=snap.capacity, reference=reference)


def agent_reply(snap: Snapshot, stale: bool,
                reference: int = DEFAULT_CAPACITY_REFERENCE) -> str:
    """One line of HAProxy's agent-check protocol for the current snapshot."""
    if stale:
        return "down #agent poll stale\n"
    if not snap.healthy:
        reason = "; ".join(f"{c.node}: {c.detail}" for c in snap.failing) or "no probe yet"
        # " #" starts HAProxy's description (shown in its stats and logs); without the
        # space HAProxy 2.6 reads the whole line as an error and ignores it
        return f"down #{shorten(reason, 200).replace(chr(10), ' ')}\n"
    return f"up ready {snapshot_weight(snap, reference)}%\n"


def health_body(unit: str, snap: Snapshot, stale: bool, healthy_since: float
                ) -> tuple[int, dict[str, Any]]:
    """``GET /health``: 200 or 503, naming each failing node and why."""
    healthy = snap.healthy and not stale
    failing = [asdict(c) for c in snap.failing]
    if stale:
        failing.append({"node": "agent", "check": "poll", "ok": False,
                        "detail": f"last poll {time.time() - snap.at:.1f} s ago"})
    body = {
        "unit": unit,
        "healthy": healthy,
        "failing": failing,
        "nodes": [asdict(c) for c in snap.checks],
        "checked_at": round(snap.at, 3),
        "healthy_since": round(healthy_since, 3) if healthy else None,
    }
    return (200 if healthy else 503), body


def load_body(unit: str, snap: Snapshot, stale: bool, reference: int) -> dict[str, Any]:
    """``GET /load``: the unit's load, capacity and weight."""
    body: dict[str, Any] = {"unit": unit, "healthy": snap.healthy and not stale,
                            "age_s": round(time.time() - snap.at, 3),
                            "weight_percent": snapshot_weight(snap, reference)}
    if snap.load is not None:
        body.update(asdict(snap.load))
    else:
        body.update({"outstanding": None, "waiting": None, "running": None,
                     "kv_cache_usage": None, "error": snap.load_error})
    cap = snap.capacity
    body["capacity"] = cap.sequences if cap is not None else None
    body["capacity_reference"] = reference
    body["engine"] = asdict(cap) if cap is not None else None
    return body


def metrics_text(unit: str, snap: Snapshot, stale: bool, transitions: dict[str, int],
                 reference: int) -> str:
    """``GET /metrics``: the ``rufus_unit_*`` series in Prometheus text."""
    healthy = snap.healthy and not stale
    lab = f'unit="{_esc(unit)}"'
    lines = [
        "# HELP rufus_unit_healthy 1 if every node of the unit passes its health probe.",
        "# TYPE rufus_unit_healthy gauge",
        f"rufus_unit_healthy{{{lab}}} {int(healthy)}",
        "# HELP rufus_unit_node_up 1 per passing probe, by node and check.",
        "# TYPE rufus_unit_node_up gauge",
    ]
    for c in snap.checks:
        lines.append(f'rufus_unit_node_up{{{lab},node="{_esc(c.node)}",check="{_esc(c.check)}"}} '
                     f"{int(c.ok)}")
    lines += [
        "# HELP rufus_unit_health_transitions_total Changes of the unit's health, by new state.",
        "# TYPE rufus_unit_health_transitions_total counter",
    ]
    for to, n in transitions.items():
        lines.append(f'rufus_unit_health_transitions_total{{{lab},to="{to}"}} {n}')
    lines += [
        "# HELP rufus_unit_poll_age_seconds Seconds since the agent's last completed poll.",
        "# TYPE rufus_unit_poll_age_seconds gauge",
        f"rufus_unit_poll_age_seconds{{{lab}}} {time.time() - snap.at:.3f}",
        "# HELP rufus_unit_poll_duration_seconds Duration of the last poll of all nodes.",
        "# TYPE rufus_unit_poll_duration_seconds gauge",
        f"rufus_unit_poll_duration_seconds{{{lab}}} {snap.poll_s:.4f}",
        "# HELP rufus_unit_weight_percent Weight reported to HAProxy's agent-check.",
        "# TYPE rufus_unit_weight_percent gauge",
        f"rufus_unit_weight_percent{{{lab}}} {snapshot_weight(snap, reference)}",
        "# HELP rufus_unit_capacity_reference_sequences Capacity that weighs 100 %.",
        "# TYPE rufus_unit_capacity_reference_sequences gauge",
        f"rufus_unit_capacity_reference_sequences{{{lab}}} {reference}",
    ]
    if snap.capacity is not None:
        cap = snap.capacity
        for name, help_, v in (
            ("capacity_sequences", "Concurrent sequences the unit runs at full speed.",
             cap.sequences),
            ("max_num_seqs", "The engine's batch limit.", cap.max_num_seqs),
            ("kv_cache_tokens", "Tokens the engine's KV cache holds.", cap.kv_cache_tokens),
            ("nodes", "Nodes the unit's engine spans.", cap.nodes),
        ):
            lines += [f"# HELP rufus_unit_{name} {help_}", f"# TYPE rufus_unit_{name} gauge",
                      f"rufus_unit_{name}{{{lab}}} {v}"]
    if snap.load is not None:
        for name, help_, value in (
            ("outstanding", "Requests admitted and not finished on the leader.",
             snap.load.outstanding),
            ("waiting", "Requests queued in the engine(s).", snap.load.waiting),
            ("running", "Requests running in the engine(s).", snap.load.running),
            ("kv_cache_usage_ratio", "Highest KV-cache usage among the unit's engines.",
             snap.load.kv_cache_usage),
            ("first_token_estimate_seconds", "First answer text a new turn would get now "
             "(the assistant's admission estimate; NaN: not reported).",
             _or_nan(snap.load.first_token_estimate_s)),
            ("first_token_slo_seconds", "The SLO new turns are admitted against.",
             _or_nan(snap.load.first_token_slo_s)),
        ):
            lines += [f"# HELP rufus_unit_{name} {help_}", f"# TYPE rufus_unit_{name} gauge",
                      f"rufus_unit_{name}{{{lab}}} {value}"]
    return "\n".join(lines) + "\n"


def _or_nan(v: float | None) -> float:
    return float("nan") if v is None else v


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


class AgentViews(Protocol):
    """What the servers ask the agent for (proxy.agent.UnitAgent)."""

    def health(self) -> tuple[int, dict[str, Any]]: ...

    def load(self) -> dict[str, Any]: ...

    def metrics(self) -> str: ...

    def check_line(self) -> str: ...


def serve(agent: AgentViews, bind: str, port: int, check_port: int
          ) -> list[socketserver.BaseServer]:
    """Start the HTTP server (``port``) and the agent-check server (``check_port``), each on
    its own daemon thread; returns both, to be shut down by the caller."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server naming
            path = self.path.split("?", 1)[0]
            if path == "/health":
                code, body = agent.health()
                self._send(code, json.dumps(body).encode(), "application/json")
            elif path == "/load":
                self._send(200, json.dumps(agent.load()).encode(), "application/json")
            elif path == "/metrics":
                self._send(200, agent.metrics().encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b'{"error": "try /health, /load or /metrics"}',
                           "application/json")

        def _send(self, code: int, data: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:  # probed every second: quiet
            log.debug(fmt, *args)

    class AgentCheck(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            line = agent.check_line()
            try:
                self.request.sendall(line.encode())
            except OSError:
                pass

    class TCP(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    class HTTP(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # a checker that hangs up early is normal; anything else is worth a line
            log.debug("agent HTTP: error serving %s", client_address, exc_info=True)

    http = HTTP((bind, port), Handler)
    check = TCP((bind, check_port), AgentCheck)
    for srv, name in ((http, "agent-http"), (check, "agent-check")):
        threading.Thread(target=srv.serve_forever, name=name, daemon=True).start()
    return [http, check]
