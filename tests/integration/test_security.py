"""Closed by default (issue 12), against real processes: tritonserver started by our launcher
(restricted APIs keyed by the admin key), and the deployment HAProxy config (render_compose)
in front of it with a real unit agent.

Servers: the session's rufus_llm server (conftest, shared with the other modules) for the
ingress, streams and the restricted APIs; a module-scoped server with two tiny Python
models in a temporary repository (starts in seconds) for load/unload, uploads and a model
unloading itself, so the shared server's model is never unloaded. The control
channel's authentication is covered by tests/unit/test_control_auth.py (real sockets).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from proxy.compose_ingress import UnitAddress, render_compose
from proxy.haproxy import REFUSAL, HAProxy, Limits, find_haproxy
from rufus.client import generate
from rufus.launch.server import ADMIN_HEADER, TritonServer, free_port

from .conftest import wait_for

pytestmark = pytest.mark.integration
LLM = "rufus_llm"
QP = "rufus_qp_medusa"
TINY = "tiny"
# Short enough to see a slow client cut within the test, much shorter than the streams below.
INGRESS_LIMITS = Limits(http_request="2s", keep_alive="5s")
# long enough to outlast `timeout http-request` with margin, also on an idle machine
LONG_STREAM = {"max_tokens": 400, "ignore_eos": True, "temperature": 0.0}


# ----------------------------------------------------------------------------- helpers
def http(url: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


def evil_upload(marker: Path) -> tuple[str, dict[str, bytes]]:
    """A model whose model.py would leave a marker file if it ever ran."""
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "x", "data_type": "TYPE_STRING", "dims": [1]}],
                         "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": [1]}]})
    code = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
            "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    return config, {"file:1/model.py": code.encode(),
                    "file:1/model.json": b'{"model": "${HOME}"}'}


# ----------------------------------------------------------------------------- fixtures
# Two tiny Python models ("tiny" echoes, "selfunload" unloads itself when called): model
# control is tested on them, not on the real models: unloading and reloading rufus_qp_medusa
# under tritonserver 2.51 was seen (1 run of 2) to segfault the old stub at exit (custom
# metrics destructor, Metric::SaveToSharedMemory) and then abort the server.
TINY_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
TINY_MODEL = """import os, site, sys, threading
for p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, p)
    site.addsitedir(p)
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        if self.name == "selfunload":  # what rufus/serving/triton_backend.py does when an
            # engine is gone for good
            threading.Thread(target=pb_utils.unload_model, args=(self.name,)).start()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([b"bye"],
                dtype=np.object_))]) for _ in requests]
"""


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, log_dir):
    repo = tmp_path_factory.mktemp("tiny-repo")
    for name in ("tiny", "selfunload"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(TINY_CONFIG)
        (repo / name / "1" / "model.py").write_text(TINY_MODEL)
    srv = TritonServer(models=["tiny", "selfunload"], grpc_port=free_port(),
                       http_port=free_port(), metrics_port=free_port(), model_repository=repo,
                       log_path=log_dir / "tritonserver-security-tiny.log")
    srv.start()
    try:
        srv.wait_ready(timeout=120)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def ingress(llm_server, tmp_path_factory, log_dir):
    """The deployment HAProxy config (one unit) in front of the session's server."""
    if find_haproxy() is None:
        pytest.skip("haproxy not installed; `bash scripts/setup.sh proxy` (as root) installs it")
    from proxy.agent import AgentConfig, UnitAgent

    agent = UnitAgent(AgentConfig(
        leader_http=f"http://127.0.0.1:{llm_server.http_port}",
        leader_metrics=f"http://127.0.0.1:{llm_server.metrics_port}/metrics",
        port=free_port(), check_port=free_port(), bind="127.0.0.1", unit="security")).start()
    grpc_port, http_port = free_port(), free_port()
    text = render_compose(1, grpc_port=grpc_port, http_port=http_port, stats_port=free_port(),
                          agent_check_port=agent.cfg.check_port, limits=INGRESS_LIMITS,
                          units=[UnitAddress(f"127.0.0.1:{llm_server.grpc_port}",
                                             f"127.0.0.1:{llm_server.http_port}",
                                             f"127.0.0.1:{agent.cfg.port}")])
    work = tmp_path_factory.mktemp("ingress")
    text = (text.replace("bind :", "bind 127.0.0.1:")
            .replace("global\n", f"global\n    stats socket {work / 'haproxy.sock'}\n", 1))
    hp = HAProxy(text, work, log_dir / "haproxy-security.log").start()
    try:
        assert wait_for(lambda: hp.servers("units_lor")["unit0"]["status"] == "UP", timeout=30)
        yield {"grpc": f"127.0.0.1:{grpc_port}", "http": f"http://127.0.0.1:{http_port}",
               "grpc_port": grpc_port, "http_port": http_port}
    finally:
        hp.stop()
        agent.stop()


# ----------------------------------------------------------------------------- direct
def test_model_control_needs_the_key_direct(tiny_server):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    for call in (lambda: c.unload_model(TINY), lambda: c.load_model(TINY),
                 lambda: c.get_model_repository_index()):
        err = grpc_error(call)
        assert "restricted" in err.message() and "rufus-admin-key" in err.message()
    assert tiny_server.is_ready(TINY)
    status, body = http(tiny_server.url(f"/v2/repository/models/{TINY}/unload"), "POST", b"{}")
    assert status == 403 and "restricted" in body
    assert tiny_server.is_ready(TINY)
    # the wrong key is no key
    err = grpc_error(lambda: c.unload_model(TINY, headers={
        "triton-grpc-protocol-" + ADMIN_HEADER: "x" * 64}))
    assert "restricted" in err.message()
    # with the key: accepted (unload, then load back)
    key = tiny_server.admin_headers()
    c.unload_model(TINY, headers=key)
    assert wait_for(lambda: not tiny_server.is_ready(TINY), timeout=60)
    c.load_model(TINY, headers=key)
    assert wait_for(lambda: tiny_server.is_ready(TINY), timeout=60)
    status, body = http(tiny_server.url("/v2/repository/index"), "POST", b"{}",
                        tiny_server.admin_headers("http"))
    assert status == 200 and TINY in body


def test_uploaded_code_and_config_are_refused_without_the_key(tiny_server, tmp_path):
    marker = tmp_path / "uploaded-code-ran"
    config, files = evil_upload(marker)
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    err = grpc_error(lambda: c.load_model("evil", config=config, files=files))
    assert "restricted" in err.message()
    body = json.dumps({"parameters": {"config": config, **{
        k: base64.b64encode(v).decode() for k, v in files.items()}}}).encode()
    status, text = http(tiny_server.url("/v2/repository/models/evil/load"), "POST", body)
    assert status == 403 and "/root" not in text
    time.sleep(1)
    assert not marker.exists(), "uploaded model.py ran"
    assert "evil" not in http(tiny_server.url("/v2/repository/index"), "POST", b"{}",
                              tiny_server.admin_headers("http"))[1]


def test_with_the_key_an_uploaded_model_json_cannot_read_the_environment(tiny_server):
    """What the key allows: Triton accepts uploads (the key is admin, SECURITY.md). Even
    then our model.json expansion reads no non-RUFUS_ variable and echoes nothing back. The
    uploaded model.py here is our own adapter, so nothing foreign runs."""
    root = Path(__file__).resolve().parents[2] / "model_repository" / QP / "1"
    config = json.dumps({"name": "echo", "backend": "python", "max_batch_size": 0,
                         "model_transaction_policy": {"decoupled": True},
                         "input": [{"name": "question", "data_type": "TYPE_STRING",
                                    "dims": [1]}],
                         "output": [{"name": "plan", "data_type": "TYPE_STRING",
                                     "dims": [-1]}]})
    files = {"file:1/model.py": (root / "model.py").read_bytes(),
             "file:1/model.json": b'{"model": "${HOME}/${PATH}"}'}
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    err = grpc_error(lambda: c.load_model("echo", config=config, files=files,
                                          headers=tiny_server.admin_headers()))
    assert "${HOME}" in err.message() and "only RUFUS_" in err.message(), err.message()
    for value in (os.environ.get("HOME", "/root"), os.environ.get("PATH", "/usr/bin")):
        assert value not in err.message()
    assert tiny_server.is_ready(TINY)


def test_other_admin_apis_are_restricted_public_ones_open(llm_server):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{llm_server.grpc_port}")
    for call in (lambda: c.get_inference_statistics(),
                 lambda: c.get_system_shared_memory_status(),
                 lambda: c.register_system_shared_memory("r", "/rufus-shm", 64),
                 lambda: c.get_log_settings(), lambda: c.update_log_settings({"log_info": False}),
                 lambda: c.get_trace_settings()):
        assert "restricted" in grpc_error(call).message()
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(LLM)
    assert c.get_server_metadata().name and c.get_model_metadata(LLM).name == LLM
    # read-only model config is public, as in the official backend (perf_analyzer reads it)
    assert c.get_model_config(LLM).config.model_transaction_policy.decoupled
    assert http(llm_server.url(f"/v2/models/{LLM}/config"), "GET")[0] == 200
    for method, path in (("GET", "/v2/models/stats"),
                         ("GET", "/v2/systemsharedmemory/status"), ("GET", "/v2/logging"),
                         ("GET", "/v2/trace/setting")):
        assert http(llm_server.url(path), method)[0] == 403, path
    # the key opens them (statistics as the example)
    assert c.get_inference_statistics(headers=llm_server.admin_headers())


def test_a_model_still_unloads_itself_from_inside_the_server(tiny_server):
    """The restricted APIs gate Triton's endpoints only: ``pb_utils.unload_model`` (the
    engine-given-up path of rufus/serving/triton_backend.py) goes through the in-process
    API and still works with no key."""
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    x = grpcclient.InferInput("x", [1], "BYTES")
    x.set_data_from_numpy(np.array([b"hi"], dtype=object))
    assert c.infer("selfunload", [x]).as_numpy("y")[0] == b"bye"

    def state() -> list:
        index = c.get_model_repository_index(headers=tiny_server.admin_headers(), as_json=True)
        return [(m.get("state"), m.get("reason")) for m in index["models"]
                if m["name"] == "selfunload"]

    assert wait_for(lambda: state() == [("UNAVAILABLE", "unloaded")], timeout=30), state()
    assert not tiny_server.is_ready("selfunload")
    assert "restricted" in grpc_error(lambda: c.load_model("selfunload")).message()


def test_admin_key_is_not_logged(tiny_server, llm_server):
    for srv in (tiny_server, llm_server):
        assert srv.admin_key not in srv.log_path.read_text(errors="replace")
        assert srv.admin_key not in " ".join(srv.command())


# ----------------------------------------------------------------------------- ingress
def test_ingress_refuses_admin_rpcs_even_with_the_key(ingress, llm_server, tmp_path):
    c = grpcclient.InferenceServerClient(ingress["grpc"])
    key = llm_server.admin_headers()
    marker = tmp_path / "uploaded-code-ran"
    config, files = evil_upload(marker)
    for call in (lambda: c.unload_model(LLM, headers=key), lambda: c.load_model(LLM),
                 lambda: c.load_model("evil", config=config, files=files, headers=key),
                 lambda: c.get_model_repository_index(headers=key),
                 lambda: c.get_inference_statistics(),
                 lambda: c.register_system_shared_memory("r", "/rufus-shm", 64),
                 lambda: c.get_log_settings(), lambda: c.get_trace_settings()):
        err = grpc_error(call)
        assert err.status() == "StatusCode.PERMISSION_DENIED", err
        assert REFUSAL in err.message()
    assert not marker.exists()
    assert c.is_server_ready() and c.is_model_ready(LLM)
    assert c.get_model_metadata(LLM).name == LLM
    assert c.get_model_config(LLM).config.name == LLM
    assert llm_server.is_ready(LLM)


@pytest.mark.parametrize("method,path", [
    ("POST", "/v2/repository/index"), ("POST", f"/v2/repository/models/{LLM}/unload"),
    ("POST", "/v2/repository/models/evil/load"),
    ("GET", "/v2/models/stats"), ("GET", f"/v2/models/{LLM}/stats"),
    ("POST", "/v2/systemsharedmemory/region/r/register"), ("POST", "/v2/logging"),
    ("GET", "/v2/trace/setting"), ("GET", "/metrics"), ("GET", f"/v2/models/{LLM}%2Fconfig"),
])
def test_ingress_refuses_admin_paths_with_403(ingress, llm_server, method, path):
    status, body = http(ingress["http"] + path, method, b"{}" if method == "POST" else None,
                        llm_server.admin_headers("http"))
    assert status == 403 and body.strip() == REFUSAL, (path, status, body[:200])


def test_ingress_serves_read_only_model_config(ingress):
    status, body = http(ingress["http"] + f"/v2/models/{LLM}/config", "GET")
    assert status == 200 and json.loads(body)["name"] == LLM, (status, body[:200])


def test_ingress_serves_health_metadata_and_inference_over_http(ingress):
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", f"/v2/models/{LLM}",
                 f"/v2/models/{LLM}/ready"):
        assert http(ingress["http"] + path)[0] == 200, path
    body = json.dumps({"text_input": "Say hi", "parameters": {"stream": False, "max_tokens": 4,
                                                               "temperature": 0}}).encode()
    status, text = http(f"{ingress['http']}/v2/models/{LLM}/generate", "POST", body)
    assert status == 200 and json.loads(text)["text_output"], text


def test_long_streams_pass_the_ingress_slow_clients_do_not(ingress):
    """A token stream lasting longer than ``timeout http-request`` is not cut (gRPC and
    HTTP SSE); a client that never finishes its request headers is."""
    def grpc_stream() -> tuple[list, float]:
        t0 = time.monotonic()
        chunks = list(generate(ingress["grpc"], LLM, "Count from one to one hundred.",
                               stream=True, sampling=LONG_STREAM))
        return chunks, time.monotonic() - t0

    def sse_stream() -> tuple[int, str, float]:
        body = json.dumps({"text_input": "Count from one to one hundred.",
                           "parameters": {"stream": True, **LONG_STREAM}}).encode()
        t0 = time.monotonic()
        status, text = http(f"{ingress['http']}/v2/models/{LLM}/generate_stream", "POST", body)
        return status, text, time.monotonic() - t0

    # both streams at once (the engine batches them): each still lasts well beyond the limit
    with ThreadPoolExecutor(2) as ex:
        grpc_f, sse_f = ex.submit(grpc_stream), ex.submit(sse_stream)
        (chunks, grpc_s), (status, text, sse_s) = grpc_f.result(), sse_f.result()
    assert len(chunks) >= 20 and grpc_s > 2.5, (len(chunks), grpc_s)
    events = [ln for ln in text.splitlines() if ln.startswith("data:")]
    assert status == 200 and len(events) >= 20 and sse_s > 2.5, (status, len(events), sse_s)
    print(f"\nthrough the ingress: gRPC stream {grpc_s:.1f} s, {len(chunks)} chunks; "
          f"SSE {sse_s:.1f} s, {len(events)} events (timeout http-request "
          f"{INGRESS_LIMITS.http_request})")

    def cut_after(port: int, first: bytes) -> float:
        with socket.create_connection(("127.0.0.1", port)) as s:
            t = time.monotonic()
            s.sendall(first)
            s.settimeout(30)
            while s.recv(4096):
                pass
            return time.monotonic() - t

    # HTTP/1: headers never finished; h2c: a connection that never sends a byte
    assert cut_after(ingress["http_port"], b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n") < 15
    assert cut_after(ingress["grpc_port"], b"") < 15
