"""One real tritonserver with the real default model, shared by the integration tests.

The engine is shrunk (small KV cache, a low admission bound) so the whole suite stays well
inside CI's limits on a 2-core machine; ports are chosen at run time and the server's whole
process group is ended by pid at the end of the session.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rufus.harness.server import TritonServer, free_port

# Small enough to test admission quickly, large enough for the 16-stream test.
ADMISSION_LIMIT = 24


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    d = Path(os.environ.get("RUFUS_TEST_LOGS", tmp_path_factory.mktemp("logs")))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def llm_server(log_dir):
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
    yield from serving(srv)


def serving(srv: TritonServer, timeout: float = 900) -> Iterator[TritonServer]:
    """Fixture body: start, wait until ready (on failure print the log's tail), yield, stop."""
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
        srv.stop()


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
