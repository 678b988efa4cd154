"""The follower's ``/health`` endpoint, polled by the unit agent / proxy layer."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rufus.multinode.topology import Topology

log = logging.getLogger("follower.health")

# state -> meaning; only "running" answers 200.
STATES = {
    "starting": "reading configuration",
    "waiting_for_leader": "dialling the leader's control port",
    "joining": "accepted by the leader; joining vLLM's process group, loading weights",
    "running": "executing the model in lockstep with the leader",
    "failed": "the unit broke; the process is exiting non-zero",
    "stopping": "asked to stop (SIGTERM)",
}


class HealthState:
    """Thread-safe state plus the facts /health reports."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.state = "starting"
        self.detail = ""
        self.since = time.time()
        self._lock = threading.Lock()

    def set(self, state: str, detail: str = "") -> None:
        assert state in STATES, state
        with self._lock:
            self.state, self.detail, self.since = state, detail, time.time()

    def body(self) -> dict[str, Any]:
        with self._lock:
            return {
                "rank": self.topo.node_rank,
                "nnodes": self.topo.nnodes,
                "leader": f"{self.topo.leader_addr}:{self.topo.leader_port}",
                "state": self.state,
                "detail": self.detail or STATES[self.state],
                "since": round(self.since, 3),
            }


def serve_health(state: HealthState, port: int, bind: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Start the HTTP server on a daemon thread; GET /health -> 200 iff running, else 503."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/health", "/"):
                self.send_error(404, "try /health")
                return
            body = state.body()
            data = json.dumps(body).encode()
            self.send_response(200 if body["state"] == "running" else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:  # probes every second: quiet
            log.debug(fmt, *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # a prober that gave up (its timeout, on a loaded node) before the answer: not
            # this node's fault, and not worth a traceback in the log every few seconds
            if isinstance(sys.exc_info()[1], ConnectionError):
                log.debug("health probe from %s went away", client_address)
                return
            super().handle_error(request, client_address)

    srv = Server((bind, port), Handler)
    threading.Thread(target=srv.serve_forever, name="follower-health", daemon=True).start()
    log.info("health endpoint on http://%s:%d/health", bind, port)
    return srv
