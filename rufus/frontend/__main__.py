"""Run the OpenAI-compatible frontend: ``python -m rufus.frontend [--triton-url H:P] [--port N]``.

Options default to the environment (listed by ``--help``); the API key is read from
``RUFUS_OPENAI_API_KEY`` only (never an option, never logged).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from rufus.env import env_int, env_port, exits_on_env_error, help_text
from rufus.telemetry import tracing

DEFAULT_PORT = 9000
ENVIRONMENT = {
    "OPENAI_PORT": f"default of --port ({DEFAULT_PORT})",
    "OPENAI_HOST": "default of --host (0.0.0.0)",
    "TRITON_GRPC_URL": "default of --triton-url (else localhost:$GRPC_PORT)",
    "GRPC_PORT": "Triton gRPC port when TRITON_GRPC_URL is unset (8001)",
    "RUFUS_OPENAI_MODELS": "default of --models (rufus_llm)",
    "RUFUS_OPENAI_RETRIES": "default of --retries (2)",
    "RUFUS_OPENAI_API_KEY": "when set, /v1 requests need 'Authorization: Bearer <key>' (secret)",
    "RUFUS_LOG_LEVEL": "default of --log-level (info)",
    **tracing.ENVIRONMENT,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m rufus.frontend",
                                 description="OpenAI-compatible API in front of Triton (rufus_llm)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=help_text(ENVIRONMENT))
    grpc_port = env_port("GRPC_PORT", 8001)
    ap.add_argument("--triton-url",
                    default=os.environ.get("TRITON_GRPC_URL") or f"localhost:{grpc_port}",
                    help="Triton gRPC address: one server or the ingress (default %(default)s)")
    ap.add_argument("--host", default=os.environ.get("OPENAI_HOST", "0.0.0.0"),
                    help="listen address (default %(default)s)")
    ap.add_argument("--port", type=int, default=env_port("OPENAI_PORT", DEFAULT_PORT),
                    help="listen port (default %(default)s)")
    ap.add_argument("--models", default=os.environ.get("RUFUS_OPENAI_MODELS", "rufus_llm"),
                    help="comma-separated Triton models offered as OpenAI model ids "
                         "(default %(default)s)")
    ap.add_argument("--retries", type=int,
                    default=env_int("RUFUS_OPENAI_RETRIES", 2, minimum=0, maximum=10),
                    help="resend a request that failed with UNAVAILABLE before its first token "
                         "(default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request limit, seconds")
    ap.add_argument("--no-hooks", action="store_true",
                    help="do not offer registered pipelines (rufus-assistant)")
    ap.add_argument("--log-level", default=os.environ.get("RUFUS_LOG_LEVEL", "info"))
    return ap.parse_args(argv)


@exits_on_env_error
def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import uvicorn

    from rufus.frontend.app import Settings, create_app

    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.setup("rufus-frontend")  # off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    app = create_app(Settings(triton_url=a.triton_url,
                              models=[m for m in a.models.split(",") if m],
                              retries=a.retries, timeout=a.timeout, hooks=not a.no_hooks,
                              api_key=os.environ.get("RUFUS_OPENAI_API_KEY") or None))
    print(f"[rufus.frontend] OpenAI API on http://{a.host}:{a.port}/v1 -> Triton {a.triton_url}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, loop="uvloop", http="httptools",
                log_level=a.log_level.lower(), access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
