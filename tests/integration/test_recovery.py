"""Engine death heals in place, each model in its own server (no dependence on test order).

rufus_llm: vLLM's engine core is SIGKILLed mid-stream. The stream ends with [UNAVAILABLE],
``rufus_engine_ready`` turns 0 within 10 s, new requests fail at once with UNAVAILABLE,
and without any load call the model gets a new engine and serves the same greedy output
again. Triton's ``/v2/models/<m>/ready`` stays 200 throughout: the model is never unloaded
(Triton 2.51 sometimes never finalized an unloaded instance). ``--recovery-cycles N``
repeats the kill/heal cycle in the same server (default 1). Then one more death than the
policy allows leaves the model down: logged, ``rufus_engine_failed`` 1, and unloaded so
that Triton's readiness (liveness probes) turns false.

rufus_qp_medusa (torch Medusa engine): served from a temporary copy of its model directory
whose ``1/model.py`` is tests/integration/faults/qp_faulty_model.py, the shipped model with
a decoder fault injected from test code: the forward pass of its 2nd request fails and kills
the engine; the planner reports it and heals the same way.
"""

from __future__ import annotations

import json
import queue
import shutil
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from rufus.client import RequestFailed, build_inputs, generate
from rufus.launch.server import ROOT, TritonServer, free_port
from rufus.qp.client import plan
from tests.environment import option

from .conftest import metric_value, scrape, serving, wait_for

pytestmark = pytest.mark.integration
MODEL = "rufus_llm"
PROMPT = "The best way to keep running shoes clean is"
GREEDY = {"temperature": 0.0, "max_tokens": 16}
CYCLES = option("--recovery-cycles")


@pytest.fixture(scope="module")
def llm(log_dir):
    log = log_dir / "tritonserver-recovery.log"
    srv = TritonServer(
        models=[MODEL], grpc_port=free_port(), http_port=free_port(),
        metrics_port=free_port(), log_path=log,
        extra_env={
            # the same engine args as tests/integration/conftest.py: same compile cache
            "RUFUS_RUFUS_LLM_ENGINE_ARGS": '{"max_num_seqs": 16, "max_model_len": 1024}',
            "RUFUS_ENGINE_MAX_FAILURES": str(CYCLES),
            "RUFUS_ENGINE_RESTART_BACKOFF_S": "0.5",
            "RUFUS_ENGINE_RESTART_BACKOFF_MAX_S": "2",
        })
    yield from serving(srv)


def _text(url: str) -> str:
    return "".join(c.text for c in generate(url, MODEL, PROMPT, stream=False, sampling=GREEDY,
                                            flags={"exclude_input_in_output": True}))



def _engine_gauge(server: TritonServer, model: str, name: str = "rufus_engine_ready") -> float:
    """The gauge's value; -1 when the metrics endpoint did not answer (a busy machine)."""
    try:
        return metric_value(scrape(server), name, model=model)
    except OSError:
        return -1.0


def _kill_mid_stream(server: TritonServer, url: str) -> str:
    """SIGKILL the engine core while a long stream runs; returns the stream's error."""
    cores = server.engine_cores()
    assert len(cores) == 1, f"expected one EngineCore, found {cores}"
    errors: queue.Queue = queue.Queue()
    tokens: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: errors.put(error) if error
                        else tokens.put(result))
    client.async_stream_infer(MODEL, build_inputs(
        grpcclient, PROMPT, stream=True,
        sampling={"max_tokens": 900, "ignore_eos": True, "temperature": 0}))
    tokens.get(timeout=60)  # the stream is producing
    cores[0].kill()
    try:
        return str(errors.get(timeout=30))
    finally:
        client.stop_stream()
        client.close()


def test_engine_death_heals_in_place(llm):
    url = f"127.0.0.1:{llm.grpc_port}"
    expected = _text(url)
    assert expected
    for cycle in range(1, CYCLES + 1):
        t0 = time.monotonic()
        err = _kill_mid_stream(llm, url)
        assert "UNAVAILABLE" in err, err
        assert wait_for(lambda: _engine_gauge(llm, MODEL) == 0, timeout=10), \
            "rufus_engine_ready did not turn 0 within 10 s"
        not_ready_s = time.monotonic() - t0
        with pytest.raises(RequestFailed, match="UNAVAILABLE"):
            _text(url)
        assert llm.is_ready(MODEL), "the model must stay loaded (never unloaded)"
        assert wait_for(lambda: _engine_gauge(llm, MODEL) == 1, timeout=600, interval=0.5), \
            "no new engine within 600 s"
        ready_s = time.monotonic() - t0
        assert _text(url) == expected, "the new engine serves different greedy output"
        assert len(llm.engine_cores()) == 1, "the dead engine core was not reaped"
        text = scrape(llm)
        assert metric_value(text, "rufus_engine_failures_total", model=MODEL) == cycle
        assert metric_value(text, "rufus_engine_restarts_total", model=MODEL) == cycle
        print(f"cycle {cycle}: not ready after {not_ready_s:.1f} s, "
              f"serving again after {ready_s:.1f} s")


def test_too_many_deaths_leave_the_model_down(llm):
    """One death more than RUFUS_ENGINE_MAX_FAILURES in the window: the engine stays down,
    said in the log and by rufus_engine_failed, and the model unloads so Triton's readiness
    turns false for liveness probes (nothing reloads it in this process)."""
    url = f"127.0.0.1:{llm.grpc_port}"
    assert wait_for(lambda: _engine_gauge(llm, MODEL) == 1, timeout=600, interval=0.5)
    assert "UNAVAILABLE" in _kill_mid_stream(llm, url)
    assert wait_for(lambda: not llm.is_ready(MODEL), timeout=30), "still ready after giving up"
    with pytest.raises(RequestFailed):
        _text(url)
    log = llm.log_path.read_text(errors="replace")
    assert "engine stays down" in log and "unloading (readiness false)" in log


# the shipped planner with a decoder that crashes on its 2nd request (copied in as 1/model.py)
FAULTY_PLANNER = Path(__file__).resolve().parent / "faults" / "qp_faulty_model.py"


@pytest.fixture(scope="module")
def planner(tmp_path_factory, log_dir):
    # the whole model directory (config.pbtxt, 1/model.json, 1/medusa_tree.json): model.json's
    # relative medusa_tree resolves against the copy's 1/, its other paths are absolute
    repo = tmp_path_factory.mktemp("qp-fault-repo")
    shutil.copytree(ROOT / "model_repository" / "rufus_qp_medusa", repo / "rufus_qp_medusa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(FAULTY_PLANNER, repo / "rufus_qp_medusa" / "1" / "model.py")
    log = log_dir / "tritonserver-recovery-qp.log"
    srv = TritonServer(
        models=["rufus_qp_medusa"], model_repository=repo, grpc_port=free_port(),
        http_port=free_port(), metrics_port=free_port(), log_path=log,
        extra_env={"RUFUS_ENGINE_RESTART_BACKOFF_S": "0.5"})
    yield from serving(srv)


def test_planner_engine_death_heals_in_place(planner):
    url = f"127.0.0.1:{planner.grpc_port}"
    question = "wireless earbuds under $50"
    first = plan(url, question, timeout=600)
    assert not first.fallback, first.fallback_reason
    t0 = time.monotonic()
    with pytest.raises(RequestFailed, match="UNAVAILABLE"):
        plan(url, question, timeout=600)  # the injected decoder fault kills the engine
    assert wait_for(lambda: _engine_gauge(planner, "rufus_qp_medusa") == 0, timeout=10)
    assert wait_for(lambda: _engine_gauge(planner, "rufus_qp_medusa") == 1, timeout=300,
                    interval=0.5)
    again = plan(url, question, timeout=600)
    assert json.dumps(again.plan, sort_keys=True) == json.dumps(first.plan, sort_keys=True)
    assert metric_value(scrape(planner), "rufus_engine_restarts_total",
                        model="rufus_qp_medusa") == 1
    print(f"planner serving again {time.monotonic() - t0:.1f} s after its engine died")
