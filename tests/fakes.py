"""Fakes at the unit boundary, shared by tests that run the real agent and the real HAProxy
without an engine: a leader's HTTP side (readiness + Prometheus text) and a unit's gRPC side
(Triton's ModelStreamInfer, held open until released, counted)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve_http(route: Callable[[str], tuple[int, bytes]]) -> tuple[ThreadingHTTPServer, str]:
    """A quiet threaded HTTP server on a free loopback port answering every GET with
    ``route(path)`` -> (status, body); returns it and its base URL. End it with
    ``shutdown()`` + ``server_close()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server naming
            code, body = route(self.path)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


class FakeLeader:
    """Triton HTTP as the unit agent probes it: ``/v2/health/ready``, ``/v2/models/<m>/ready``
    (200 while ``ready``) and ``/metrics`` (``metrics`` text, settable)."""

    def __init__(self, metrics: str = 'rufus_requests_outstanding{model="rufus_llm"} 0\n') -> None:
        self.ready = True
        self.metrics = metrics
        self.srv, self.url = serve_http(self._route)
        self.port = self.srv.server_address[1]

    def _route(self, path: str) -> tuple[int, bytes]:
        if path == "/metrics":
            return 200, self.metrics.encode()
        return (200 if self.ready else 503), b""

    def stop(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


class HeldStreams:
    """A unit's gRPC port: every ``ModelStreamInfer`` call is counted on arrival and held
    open until :meth:`release`, so a test sees how many streams a balancer has in flight on
    each unit at once."""

    def __init__(self, max_workers: int = 64) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        unit = self
        self.arrived = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            def ModelStreamInfer(self, requests: Any, context: Any) -> Any:  # gRPC naming
                for req in requests:
                    with unit.lock:
                        unit.arrived += 1
                    unit.gate.wait(30)
                    yield service_pb2.ModelStreamInferResponse(
                        infer_response=service_pb2.ModelInferResponse(model_name=req.model_name,
                                                                      id=req.id))
                    return

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def release(self) -> None:
        self.gate.set()

    def reset(self) -> None:
        with self.lock:
            self.arrived = 0
        self.gate.clear()

    def stop(self) -> None:
        self.gate.set()
        self.server.stop(0)
