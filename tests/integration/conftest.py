"""Real tritonservers shared by the integration tests (one of each per session).

``llm_server``: rufus_llm with the real default model. ``stack``: rufus_qp_medusa,
rufus_llm and rufus_assistant (test_assistant.py and the adversarial assistant/OpenAI tests),
with ``assistant_frontend`` (the OpenAI-compatible frontend) in front of it. The engines are
shrunk (small KV cache, a low admission bound) so the whole suite stays well inside CI's
limits on a 2-core machine; ports are chosen at run time and every server's whole process
group is ended by pid at the end of the session.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.otlp_sink import Receiver
from rufus.launch.server import TritonServer, free_port, stop_servers
from rufus.launch.stack import start_frontend, stop_process

# Small enough to test admission quickly, large enough for the 16-stream test.
ADMISSION_LIMIT = 24
# How long a server gets to exit after SIGTERM before its process group is killed: what
# `make serve` gives it (rufus.launch.server.serve). A model whose stub never finalizes
# would otherwise hold tritonserver for its whole 20-s exit timeout at every stop.
STOP_S = 6.0
ASSISTANT_MODELS = ["rufus_qp_medusa", "rufus_llm", "rufus_assistant"]


@pytest.fixture(scope="session")
def session_servers() -> Iterator[list[TritonServer]]:
    """The servers shared by the whole session, stopped together at its end (their exits
    overlap: :func:`stop_servers`)."""
    servers: list[TritonServer] = []
    yield servers
    stop_servers(servers, timeout=STOP_S)


def _wanted(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test of this session uses ``fixture`` (directly or through another one)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def otlp() -> Iterator[Receiver]:
    """The OTLP/HTTP receiver the ``stack`` server and its frontend export their spans to
    (tracing on, 100% sampling: the assistant tests run traced, test_tracing.py reads them)."""
    rx = Receiver()
    yield rx
    rx.close()


def tracing_env(rx: Receiver) -> dict[str, str]:
    # spans exported every 0.5 s (the SDK's default is 5 s), tritonserver's own spans too
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "500",
            "RUFUS_TRITON_TRACING": "1"}


@pytest.fixture(scope="session")
def stack_server(log_dir, session_servers, otlp) -> TritonServer:
    """The ``stack`` fixture's server, not yet started: :func:`llm_server` starts it beside
    its own when the session needs both, so the two starts overlap (each waits on one core
    part of the time)."""
    srv = TritonServer(
        models=ASSISTANT_MODELS, grpc_port=free_port(), http_port=free_port(),
        metrics_port=free_port(), log_path=log_dir / "tritonserver-assistant.log",
        extra_env={"RUFUS_RUFUS_LLM_ENGINE_ARGS": '{"max_num_seqs": 16, "max_model_len": 1024}',
                   "RUFUS_ANSWER_MAX_TOKENS": "64", "VLLM_CPU_KVCACHE_SPACE": "1",
                   # a shared CI box can make the planner slow: test its path, not the timeout
                   "RUFUS_ASSISTANT_PLAN_TIMEOUT_S": "120",
                   # nor its SLO admission (a slow box would refuse a second conversation;
                   # admission is tested at its unit boundaries, tests/unit/test_admission.py)
                   "RUFUS_ASSISTANT_SLO_S": "0",
                   # nor the planner's, for the tests that call it directly with a good stream
                   # alongside (its admission is tested on test_qp.py's server)
                   "RUFUS_QP_SLO_S": "0", **tracing_env(otlp)},
    )
    yield srv
    if srv.proc is not None and srv not in session_servers:  # started, never waited for
        srv.stop(timeout=STOP_S)


@pytest.fixture(scope="session")
def llm_server(request, log_dir, session_servers):
    if _wanted(request, "stack"):
        early = request.getfixturevalue("stack_server")
        if early.proc is None:
            early.start()
    srv = TritonServer(
        models=["rufus_llm"],
        grpc_port=free_port(),
        http_port=free_port(),
        metrics_port=free_port(),
        log_path=log_dir / "tritonserver-llm.log",
        extra_env={
            "RUFUS_RUFUS_LLM_ENGINE_ARGS": '{"max_num_seqs": 16, "max_model_len": 1024}',
            "RUFUS_MAX_OUTSTANDING_REQUESTS": str(ADMISSION_LIMIT),
        },
    )
    yield from serving(srv, stop_later=session_servers)


def serving(srv: TritonServer, timeout: float = 900,
            stop_later: list[TritonServer] | None = None) -> Iterator[TritonServer]:
    """Fixture body: start (unless started early), wait until ready (on failure print the
    log's tail), yield, stop (or leave it in ``stop_later``, for a fixture that stops several
    at once)."""
    if srv.proc is None:
        srv.start()
    try:
        srv.wait_ready(timeout=timeout)
    except Exception:
        srv.stop()
        if srv.log_path and Path(srv.log_path).exists():
            print(Path(srv.log_path).read_text(errors="replace")[-5000:])
        raise
    try:
        yield srv
    finally:
        if stop_later is None:
            srv.stop(timeout=STOP_S)
        else:
            stop_later.append(srv)



@pytest.fixture(scope="session")
def stack(stack_server, session_servers):
    """One tritonserver with rufus_qp_medusa, rufus_llm and rufus_assistant (which calls the
    other two on the same server over gRPC), shared by every module that needs the assistant."""
    yield from serving(stack_server, stop_later=session_servers)


def _offers(base: str, model_id: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
            return model_id in {m["id"] for m in json.loads(r.read())["data"]}
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False  # not listening yet


@pytest.fixture(scope="session")
def assistant_frontend(stack, log_dir, otlp) -> Iterator[str]:
    """``python -m rufus.frontend`` (as ``make serve`` runs it) in front of ``stack``: model
    ids ``rufus_llm`` and ``rufus-assistant``. Yields its base URL (``http://host:port``)."""
    port = free_port()
    log = log_dir / "frontend-assistant.log"
    # as the stack's: admission is unit-tested; traced like the stack
    env = {"RUFUS_ASSISTANT_SLO_S": "0", **tracing_env(otlp)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = start_frontend(f"127.0.0.1:{stack.grpc_port}", port, "rufus_llm", log_path=str(log))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_for(lambda: _offers(base, "rufus-assistant"), timeout=60):
            raise RuntimeError(log.read_text(errors="replace")[-3000:])
        yield base
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def url(llm_server) -> str:
    return f"127.0.0.1:{llm_server.grpc_port}"


def scrape(server: TritonServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples matching the labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(pred, timeout: float = 30.0, interval: float = 0.2) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(interval)
    return False


# What an error a client sees must never carry: a traceback or a path on the server.
_LEAKS = (
    ("a traceback", re.compile(r"Traceback")),
    ("a traceback frame", re.compile(r'File "')),
    ("a server path", re.compile(r"/work/|/usr/|/root/|site-packages")),
    ("a source location", re.compile(r"\.py[(:]")),
)


def assert_clean_error(text: str, case: str = "", max_chars: int = 2000) -> str:
    """Check one error text a client received (gRPC message, HTTP body): no traceback, no
    server path or source location, and short (client data is never echoed in bulk).
    Returns the text."""
    for what, pattern in _LEAKS:
        m = pattern.search(text)
        assert m is None, f"{case}: the error shows {what} ({m.group()!r}): {text[:600]!r}"
    assert len(text) < max_chars, f"{case}: the error is {len(text)} chars: {text[:300]!r}"
    return text
