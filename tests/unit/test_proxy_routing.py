"""HAProxy configuration rendering and the client's retry-before-first-token rule."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

import rufus.client as client
from proxy.haproxy import Backend, check_config, documented_units, render, render_compose
from rufus.client import Chunk, RequestFailed


def test_render_has_the_contract():
    cfg = render(documented_units(3), port=9000, rr_port=9001, stats_port=9100,
                 stats_socket="/tmp/x.sock")
    assert "bind 0.0.0.0:9000 proto h2" in cfg
    assert "balance leastconn" in cfg and "balance roundrobin" in cfg
    assert "http-check send meth GET uri /health" in cfg
    assert "retry-on conn-failure" in cfg and "option redispatch" in cfg
    for i in range(3):
        assert (f"server unit{i} 127.0.0.1:{8101 + 10 * i} proto h2 check port {8190 + i} "
                f"agent-check agent-port {8290 + i}") in cfg
        assert f"track units_lor/unit{i}" in cfg
    with pytest.raises(ValueError):
        render([])


HAVE_HAPROXY = shutil.which("haproxy") is not None or Path("/usr/sbin/haproxy").exists()


@pytest.mark.skipif(not HAVE_HAPROXY, reason="haproxy not installed (scripts/setup.sh proxy)")
def test_haproxy_accepts_rendered_config(tmp_path):
    p = tmp_path / "h.cfg"
    p.write_text(render([Backend("a", "127.0.0.1", 1, 2, 3)], port=5, rr_port=6,
                        stats_socket=str(tmp_path / "s.sock")))
    check_config(p)


def test_checked_in_config_is_the_compose_flavor(monkeypatch, tmp_path):
    """proxy/haproxy/haproxy.cfg is what docker/compose.yaml mounts: generated, env-driven."""
    repo_cfg = Path(__file__).resolve().parents[2] / "proxy" / "haproxy" / "haproxy.cfg"
    text = repo_cfg.read_text()
    assert text == render_compose(2)
    assert "bind :8001 proto h2" in text and "balance leastconn" in text
    for i in (0, 1):
        assert f'"${{RUFUS_UNIT{i}_GRPC}}" proto h2 track unit_health/unit{i}' in text
        assert f'"${{RUFUS_UNIT{i}_AGENT}}" check agent-check agent-port 8091' in text
    if HAVE_HAPROXY:
        for i in (0, 1):
            for kind, port in (("GRPC", 8001), ("HTTP", 8000), ("AGENT", 8090)):
                monkeypatch.setenv(f"RUFUS_UNIT{i}_{kind}", f"127.0.0.1:{port + 10 * i}")
        check_config(repo_cfg)


class Script:
    """Replaces one attempt: each call pops a plan: list of chunks, then an optional error."""

    def __init__(self, plans: list[tuple[int, RequestFailed | None]]) -> None:
        self.plans = plans
        self.calls = 0

    def _plan(self) -> tuple[int, RequestFailed | None]:
        self.calls += 1
        return self.plans.pop(0)

    def sync(self, *a, **kw):
        n, err = self._plan()
        for i in range(n):
            yield Chunk(f"t{i}", {}, 0.0)
        if err:
            raise err

    async def aio(self, *a, **kw):
        n, err = self._plan()
        for i in range(n):
            yield Chunk(f"t{i}", {}, 0.0)
        if err:
            raise err


UNAVAIL = RequestFailed("[UNAVAILABLE] model not ready", "UNAVAILABLE")
GRPC_UNAVAIL = RequestFailed("unavailable", "StatusCode.UNAVAILABLE")
INVALID = RequestFailed("[INVALID_ARG] sampling_parameters.top_p: must be in (0, 1]", "INVALID_ARG")


def _sync(script, retries):
    return [c.text for c in client.generate("u", "m", "p", retries=retries)]


def _aio(script, retries):
    async def go():
        return [c.text async for c in client.agenerate("u", "m", "p", retries=retries)]

    return asyncio.run(go())


@pytest.fixture(params=["sync", "aio"])
def mode(request, monkeypatch):
    script = Script([])
    monkeypatch.setattr(client, "_generate_once", script.sync)
    monkeypatch.setattr(client, "_agenerate_once", script.aio)
    monkeypatch.setattr(client, "retry_delay", lambda attempt: 0.0)
    run = _sync if request.param == "sync" else _aio
    return script, lambda retries: run(script, retries)


def test_unavailable_before_first_token_is_retried(mode):
    script, run = mode
    script.plans = [(0, UNAVAIL), (0, GRPC_UNAVAIL), (2, None)]
    assert run(2) == ["t0", "t1"] and script.calls == 3


def test_retries_exhausted_raises_the_last_error(mode):
    script, run = mode
    script.plans = [(0, UNAVAIL), (0, UNAVAIL)]
    with pytest.raises(RequestFailed, match="UNAVAILABLE"):
        run(1)
    assert script.calls == 2


def test_failure_after_a_token_is_never_retried(mode):
    script, run = mode
    script.plans = [(1, UNAVAIL), (3, None)]
    with pytest.raises(RequestFailed, match="UNAVAILABLE"):
        run(3)
    assert script.calls == 1


def test_invalid_input_is_not_retried(mode):
    script, run = mode
    script.plans = [(0, INVALID), (1, None)]
    with pytest.raises(RequestFailed) as e:
        run(3)
    assert e.value.status == "INVALID_ARG" and script.calls == 1


def test_default_is_no_retry(mode):
    script, run = mode
    script.plans = [(0, UNAVAIL), (1, None)]
    with pytest.raises(RequestFailed):
        run(0)
    assert script.calls == 1


def test_status_from_streamed_errors():
    class Err:
        def __init__(self, msg: str) -> None:
            self._msg = msg

        def status(self):
            return None

        def message(self):
            return self._msg

    assert client._status(Err("[UNAVAILABLE] engine died")) == "UNAVAILABLE"
    assert client._status(Err("Request for unknown model: 'rufus_llm' is not found")) == "NOT_FOUND"
    assert client._status(Err("something else")) == ""
