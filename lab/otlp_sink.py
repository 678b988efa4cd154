"""A small OTLP/HTTP trace receiver: the servers' real exporters post protobuf
``ExportTraceServiceRequest`` bodies to ``/v1/traces`` here, and the integration tests read
the spans back (name, service, trace and parent ids, attributes). The tracing-cost benchmark
runs it as the endpoint (``python -m lab.otlp_sink --port 4318``), so what is measured is the
stack's cost, not a trace backend's on the same cores. The backend a user runs
(``make observe``: Arize Phoenix) is exercised by scripts/observe_screenshot.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    error: bool = False


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Receiver:
    """Listens on 127.0.0.1:<port> (0: a free one) until :meth:`close`."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        # bodies answered 400 (why, its first bytes): a test that misses spans prints them
        self.rejected: list[str] = []
        self.posts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: answers ``Expect: 100-continue`` at once (tritonserver's libcurl asks
            # it of every body over 1 KB and, from an HTTP/1.0 server, waits 1 s per export
            # for an answer that never comes) and keeps the exporter's connection open
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                as_json = "json" in (self.headers.get("Content-Type") or "")
                ok = self.path == "/v1/traces" and (receiver.take_json(body) if as_json
                                                    else receiver.take(body))
                with receiver.lock:
                    receiver.posts += 1
                    if not ok:
                        receiver.rejected.append(f"{self.path} {'json' if as_json else 'proto'} "
                                                 f"{len(body)} bytes: {body[:120]!r}")
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes) -> bool:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception:  # noqa: BLE001 - a malformed export is a 400
            return False
        got = []
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(s.name, str(res.get("service.name", "")),
                                    s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                    {a.key: _value(a.value) for a in s.attributes},
                                    s.start_time_unix_nano, s.end_time_unix_nano,
                                    s.status.code == 2))
        with self.lock:
            self.spans.extend(got)
        return True

    def take_json(self, body: bytes) -> bool:
        """OTLP/JSON (tritonserver's exporter sends it): ids are hex strings, values typed
        objects (``{"stringValue": ...}``)."""
        import json

        def val(v: dict[str, Any]) -> Any:
            for k, x in v.items():
                if k == "arrayValue":
                    return [val(i) for i in x.get("values", [])]
                return int(x) if k == "intValue" else x
            return None

        def attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
            return {a["key"]: val(a.get("value", {})) for a in items}

        try:
            req = json.loads(body)
            got = []
            for rs in req.get("resourceSpans", []):
                res = attrs(rs.get("resource", {}).get("attributes", []))
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        got.append(Span(s["name"], str(res.get("service.name", "")),
                                        s["traceId"].lower(), s["spanId"].lower(),
                                        (s.get("parentSpanId") or "").lower(),
                                        attrs(s.get("attributes", [])),
                                        int(s.get("startTimeUnixNano", 0)),
                                        int(s.get("endTimeUnixNano", 0)),
                                        s.get("status", {}).get("code") in (2, "STATUS_CODE_ERROR")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        with self.lock:
            self.spans.extend(got)
        return True

    def summary(self) -> str:
        """What came so far, for a test's failure message: posts, spans per service, the
        bodies refused."""
        with self.lock:
            services: dict[str, int] = {}
            for s in self.spans:
                services[s.service] = services.get(s.service, 0) + 1
            return (f"{self.posts} posts, spans per service {services}, "
                    f"{len(self.rejected)} refused {self.rejected[-3:]}")

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    """Receive until SIGTERM or Ctrl-C, then print how many spans of which services came."""
    import argparse
    import signal
    import time
    from collections import Counter

    ap = argparse.ArgumentParser(prog="python -m lab.otlp_sink", description=__doc__)
    ap.add_argument("--port", type=int, default=4318)
    a = ap.parse_args(argv)
    rx = Receiver(a.port)
    print(f"[otlp_sink] OTLP/HTTP on {rx.endpoint}/v1/traces", flush=True)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, _f: stop.append(s))
    try:
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    rx.close()
    counts = Counter(s.service for s in rx.spans)
    print(f"[otlp_sink] {len(rx.spans)} spans, {len({s.trace_id for s in rx.spans})} traces: "
          f"{dict(counts)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
