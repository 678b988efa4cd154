"""Run the OpenAI-compatible frontend: ``python -m rufus.frontend [--triton-url H:P] [--port N]``.

Options default to the environment (listed by ``--help``); the API key is read from
``RUFUS_OPENAI_API_KEY`` only (never an option, never logged).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from rufus.env import exits_on_env_error
from rufus.serving.settings import env_var, group, help_epilog, read
from rufus.telemetry import tracing
from rufus.telemetry.tracing import TracingSettings

DEFAULT_PORT = 9000


@dataclass(frozen=True)
class FrontendSettings:
    """What ``python -m rufus.frontend`` reads from the environment (its --help lists it)."""

    port: int = env_var("OPENAI_PORT", DEFAULT_PORT, "default of --port", minimum=1,
                        maximum=65535)
    host: str = env_var("OPENAI_HOST", "0.0.0.0", "default of --host")
    triton_url: str = env_var("TRITON_GRPC_URL", "", "default of --triton-url",
                              default_text="localhost:$GRPC_PORT")
    grpc_port: int = env_var("GRPC_PORT", 8001, "Triton gRPC port when TRITON_GRPC_URL is unset",
                             minimum=1, maximum=65535)
    models: str = env_var("RUFUS_OPENAI_MODELS", "rufus_llm", "default of --models")
    retries: int = env_var("RUFUS_OPENAI_RETRIES", 2, "default of --retries", minimum=0,
                           maximum=10)
    api_key: str = env_var("RUFUS_OPENAI_API_KEY", "",
                           "when set, /v1 requests need 'Authorization: Bearer <key>' (secret)",
                           default_text="unset")
    log_level: str = env_var("RUFUS_LOG_LEVEL", "info", "default of --log-level")
    traces: TracingSettings = group(TracingSettings)  # noqa: RUF009 - a default_factory field


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    s = read(FrontendSettings)
    ap = argparse.ArgumentParser(prog="python -m rufus.frontend",
                                 description="OpenAI-compatible API in front of Triton (rufus_llm)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=help_epilog(FrontendSettings))
    ap.add_argument("--triton-url", default=s.triton_url or f"localhost:{s.grpc_port}",
                    help="Triton gRPC address: one server or the ingress (default %(default)s)")
    ap.add_argument("--host", default=s.host, help="listen address (default %(default)s)")
    ap.add_argument("--port", type=int, default=s.port, help="listen port (default %(default)s)")
    ap.add_argument("--models", default=s.models,
                    help="comma-separated Triton models offered as OpenAI model ids "
                         "(default %(default)s)")
    ap.add_argument("--retries", type=int, default=s.retries,
                    help="resend a request that failed with UNAVAILABLE before its first token "
                         "(default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request limit, seconds")
    ap.add_argument("--no-hooks", action="store_true",
                    help="do not offer registered pipelines (rufus-assistant)")
    ap.add_argument("--log-level", default=s.log_level)
    ap.set_defaults(api_key=s.api_key or None)  # never an option, never logged
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
                              api_key=a.api_key))
    print(f"[rufus.frontend] OpenAI API on http://{a.host}:{a.port}/v1 -> Triton {a.triton_url}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, loop="uvloop", http="httptools",
                log_level=a.log_level.lower(), access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
