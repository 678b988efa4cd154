"""HAProxy configuration rendering and the client's retry-before-first-token rule."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

import rufus.client as client
from proxy.compose_ingress import UnitAddress, render_compose
from proxy.haproxy import (
    HTTP_POST_RE,
    HTTP_READ_RE,
    PUBLIC_RPCS,
    Backend,
    Limits,
    check_config,
    documented_units,
    render,
)
from rufus.client import Chunk, RequestFailed


def test_render_has_the_contract():
    cfg = render(documented_units(3), port=9000, rr_port=9001, stats_port=9100,
                 stats_socket="/tmp/x.sock")
    assert "bind 0.0.0.0:9000\n" in cfg  # h2c by preface detection (slowloris: see Limits)
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
    p.write_text(render([Backend("a", "127.0.0.1", 1, 2, 3)], port=5, rr_port=6, equal_port=7,
                        stats_socket=str(tmp_path / "s.sock")))
    check_config(p)
    assert "backend units_equal" in p.read_text()


def test_checked_in_config_is_the_compose_flavor(tmp_path):
    """proxy/haproxy/haproxy.cfg is what docker/compose.yaml mounts: generated, units by the
    compose rig's service names."""
    repo_cfg = Path(__file__).resolve().parents[2] / "proxy" / "haproxy" / "haproxy.cfg"
    text = repo_cfg.read_text()
    assert text == render_compose(2)
    assert "bind :8001\n" in text and "balance leastconn" in text
    for i, suffix in ((0, ""), (1, "-b")):
        assert f"leader{suffix}:8001 proto h2 track unit_health/unit{i}" in text
        assert f"agent{suffix}:8090 check agent-check agent-port 8091" in text
    assert "${" not in text  # no addresses from the environment
    if HAVE_HAPROXY:
        check_config(repo_cfg)


def test_compose_config_routes_in_panic_only_with_several_units():
    """Every unit DOWN at once (a flap on a loaded host) sends traffic to all of them as
    backups instead of 503s; a lone unit keeps plain 503s (nothing else to fall back on)."""
    two = render_compose(2)
    for backend in ("units_lor", "units_http", "units_affinity", "units_http_affinity"):
        section = two.split(f"\nbackend {backend}\n", 1)[1].split("\nbackend ", 1)[0]
        assert "option allbackups" in section, backend
        assert section.count(" backup ") == 2 and "unit0_panic" in section, backend
        assert "track" not in next(ln for ln in section.splitlines() if " backup " in ln)
    one = render_compose(1)
    assert "backup" not in one and "allbackups" not in one


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


# ----------------------------------------------------------------- closed by default (issue 12)
@pytest.mark.parametrize("cfg", [render(documented_units(2), rr_port=9001), render_compose(2)],
                         ids=["fleet", "compose"])
def test_one_defaults_block_and_one_balance_policy(cfg):
    assert cfg.count("\ndefaults\n") == 1
    balances = {line.strip() for line in cfg.splitlines() if line.strip().startswith("balance")}
    # rr: benchmark baseline only; hdr(...): conversation affinity (bounded consistent hash)
    assert balances <= {"balance leastconn", "balance roundrobin",
                        f"balance hdr({client.CONVERSATION_HEADER})"}
    assert "timeout http-request 10s" in cfg and "timeout client 10m" in cfg
    assert "sc0_conn_cur gt 256" in cfg and "proto h2\n" not in cfg.split("backend")[0]


def test_grpc_frontend_forwards_only_public_rpcs():
    cfg = render_compose(1)
    acl = next(line for line in cfg.splitlines() if "acl public_rpc path" in line)
    allowed = {p.rsplit("/", 1)[1] for p in acl.split()[3:]}
    assert allowed == set(PUBLIC_RPCS) and "ModelConfig" in allowed  # read-only, public
    for admin in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
                  "ModelStatistics", "SystemSharedMemoryRegister",
                  "CudaSharedMemoryRegister", "TraceSetting", "LogSettings"):
        assert admin not in allowed
    assert "grpc-status 7" in cfg and "if !public_rpc" in cfg


@pytest.mark.parametrize("method,path,ok", [
    ("GET", "/v2", True), ("GET", "/v2/health/live", True), ("GET", "/v2/health/ready", True),
    ("GET", "/v2/models/rufus_llm", True), ("GET", "/v2/models/rufus_llm/versions/1", True),
    ("GET", "/v2/models/rufus_llm/ready", True),
    ("POST", "/v2/models/rufus_llm/infer", True),
    ("POST", "/v2/models/rufus_llm/versions/1/generate", True),
    ("POST", "/v2/models/rufus_llm/generate_stream", True),
    ("POST", "/v2/repository/index", False), ("POST", "/v2/repository/models/x/load", False),
    ("POST", "/v2/repository/models/x/unload", False), ("GET", "/v2/models/x/config", True),
    ("GET", "/v2/models/x/stats", False), ("GET", "/v2/models/stats", False),
    ("GET", "/v2/systemsharedmemory/status", False), ("POST", "/v2/logging", False),
    ("GET", "/v2/trace/setting", False), ("GET", "/metrics", False),
    ("GET", "/v2/models/x%2Fconfig", False), ("GET", "/v2/models/rufus_llm/infer", False),
    ("POST", "/v2/models/rufus_llm", False),
])
def test_http_allowlist(method, path, ok):
    """The regexes HAProxy applies (same PCRE subset as Python's re for these)."""
    import re

    read = method in ("GET", "HEAD") and bool(re.search(HTTP_READ_RE, path)) \
        and path != "/v2/models/stats"
    post = method == "POST" and bool(re.search(HTTP_POST_RE, path))
    assert (read or post) is ok


@pytest.mark.skipif(not HAVE_HAPROXY, reason="haproxy not installed (scripts/setup.sh proxy)")
def test_haproxy_accepts_custom_limits(tmp_path):
    p = tmp_path / "h.cfg"
    p.write_text(render_compose(1, limits=Limits(http_request="2s", per_source=8),
                                units=[UnitAddress("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1")]))
    check_config(p)
    assert "timeout http-request 2s" in p.read_text()


# ----------------------------------------------------------------- conversation affinity (issue 27)
@pytest.mark.parametrize("cfg,frontends", [
    (render(documented_units(2), rr_port=9001, equal_port=9002), {"grpc_lor": "units_affinity"}),
    (render_compose(2), {"grpc_lor": "units_affinity", "triton_http": "units_http_affinity"})],
    ids=["fleet", "compose"])
def test_keyed_requests_hash_with_bounded_load_and_others_keep_leastconn(cfg, frontends):
    """Only the main frontends route by the key; each affinity backend is bounded-load
    consistent hashing over servers tracking the same health as least-outstanding."""
    sections = {blk.split("\n", 1)[0].strip(): blk for blk in ("\n" + cfg).split("\n\n")}
    rule = f"use_backend {{}} if {{{{ req.hdr({client.CONVERSATION_HEADER}) -m found }}}}"
    for name, text in sections.items():
        fe = name.removeprefix("frontend ")
        if fe in frontends:
            assert rule.format(frontends[fe]) in text
        elif name.startswith("frontend "):
            assert "use_backend" not in text, name  # rr/equal baselines: no affinity
    for backend in frontends.values():
        text = sections[f"backend {backend}"]
        assert f"balance hdr({client.CONVERSATION_HEADER})" in text
        assert "hash-type consistent" in text and "hash-balance-factor 150" in text
        assert text.count(" track ") == 2
