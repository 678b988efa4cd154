"""``phoenix serve`` with its OTLP gRPC receiver on one address, not on every interface.

Phoenix binds the web UI to ``PHOENIX_HOST`` but its gRPC receiver to ``[::]`` always (no
setting in 20.x): an unauthenticated trace sink reachable from the network. This wraps
``grpc.aio.server`` so ``add_insecure_port("[::]:N")`` binds ``OBSERVE_PHOENIX_GRPC_HOST:N``
instead (default 127.0.0.1). rufus/launch/observe.py runs it with the observe venv's python.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import grpc.aio


def _bind_one_address(host: str) -> None:
    make_server = grpc.aio.server

    def server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
        srv = make_server(*args, **kwargs)
        add = srv.add_insecure_port

        def add_insecure_port(address: str) -> int:
            if address.startswith("[::]:"):
                address = f"{host}:{address[len('[::]:'):]}"
            print(f"[observe] Phoenix OTLP gRPC receiver on {address}", file=sys.stderr,
                  flush=True)
            return add(address)

        srv.add_insecure_port = add_insecure_port  # type: ignore[method-assign]
        return srv

    grpc.aio.server = server


if __name__ == "__main__":
    _bind_one_address(os.environ.get("OBSERVE_PHOENIX_GRPC_HOST", "127.0.0.1"))
    from phoenix.server.main import main

    sys.argv = ["phoenix", "serve", *sys.argv[1:]]
    sys.exit(main())
