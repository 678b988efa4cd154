"""Every entrypoint answers ``--help`` (exit 0, its options) without starting anything, names
every environment variable its own source reads, and a wrong setting names the variable.

Entrypoints are found, not listed: every script in scripts/, every package with a
``__main__.py`` and every module with a ``__main__`` guard under rufus/, proxy/, follower/
and lab/. A script is a thin wrapper: the module whose ``main`` it calls is its source too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rufus", "proxy", "follower", "lab")
# Read directly in the entrypoint's own file: os.environ.get("X"), os.environ["X"],
# os.getenv("X"), env_int/env_float/env_port("X").
READ = re.compile(r"(?:environ\.get\(|environ\[|getenv\(|env_(?:int|float|port)\()"
                  r"""\s*["']([A-Z][A-Z0-9_]+)["']""")
# Read by the tooling, never by an operator: not part of --help.
INTERNAL = {"PYTHONPATH", "LD_LIBRARY_PATH", "PATH", "HOME"}
# a thin script's call: ``from lab.qp.plan_bench import main``
MAIN_FROM = re.compile(r"^from ([\w.]+) import main\b", re.M)


def _entrypoints() -> dict[str, tuple[list[str], list[Path]]]:
    """name -> (argv after the interpreter, the source files whose env reads it must list)."""
    out: dict[str, tuple[list[str], list[Path]]] = {}
    for f in sorted((ROOT / "scripts").glob("*.py")):
        called = [ROOT / (m.replace(".", "/") + ".py") for m in MAIN_FROM.findall(f.read_text())]
        out[f"scripts/{f.name}"] = ([str(f)], [f, *called])
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT)
            if "__pycache__" in rel.parts:
                continue
            if f.name == "__main__.py":
                module = ".".join(rel.parent.parts)
                own = [f] + ([f.parent / "node.py"] if module == "follower" else [])
                out[module] = (["-m", module], own)
            elif f.name != "__init__.py" and re.search(
                    r"^if __name__ == .__main__.:", f.read_text(), re.M):
                module = ".".join(rel.with_suffix("").parts)
                out[module] = (["-m", module], [f])
    return out


ENTRYPOINTS = _entrypoints()


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_the_documented_entrypoints_are_found():
    for name in ("follower", "rufus.launch.server", "rufus.client", "rufus.qp.client",
                 "proxy.agent", "proxy.haproxy", "rufus.launch.fleet", "scripts/rig.py",
                 "scripts/bench.py", "scripts/fleet.py", "scripts/client.py"):
        assert name in ENTRYPOINTS, name


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_help_lists_options_and_environment(name):
    argv, sources = ENTRYPOINTS[name]
    text = "".join(f.read_text() for f in sources)
    # never run one that would ignore --help and do its work (write files, start servers)
    parses = re.search(r"ArgumentParser|parser\(|^from \S+ import main$", text, re.M)
    assert parses, f"{name} has no argument parser: --help would run it"
    r = _run([*argv, "--help"])
    assert r.returncode == 0, f"{name} --help: exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "usage:" in r.stdout and "--help" in r.stdout, r.stdout[:500]
    read = {v for f in sources for v in READ.findall(f.read_text())} - INTERNAL
    missing = sorted(v for v in read if v not in r.stdout)
    assert not missing, f"{name} reads {missing} but its --help does not name them"


@pytest.mark.parametrize("argv,env,variable", [
    (["-m", "follower"], {"RUFUS_PEER_TIMEOUT_S": "fast"}, "RUFUS_PEER_TIMEOUT_S"),
    (["-m", "follower"], {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "one"}, "LWS_WORKER_INDEX"),
    (["-m", "rufus.launch.server"], {"GRPC_PORT": "80o1"}, "GRPC_PORT"),
    (["-m", "rufus.client", "hi"], {"GRPC_PORT": "x"}, "GRPC_PORT"),
    (["-m", "proxy.agent"], {"RUFUS_AGENT_PORT": "8o90"}, "RUFUS_AGENT_PORT"),
    (["-m", "rufus.launch.fleet", "--nnodes", "0"], {}, "--nnodes"),
    (["scripts/rig.py"], {"HTTP_PORT": "99999"}, "HTTP_PORT"),
])
def test_a_wrong_setting_names_the_variable(argv, env, variable):
    r = _run(argv, **env)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert variable in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


# ----------------------------------------------------------------- stalled loads
def test_a_load_tritonserver_gave_up_on_is_detected_and_restarted(tmp_path, monkeypatch):
    """initialize() returned (the stub's marker) but the model never became ready: after
    LOAD_STALL_S the launcher restarts tritonserver, at most MAX_STALL_RESTARTS times, then
    stops with EXIT_LOAD_STALLED; a slow load without a marker is never a stall."""
    import time as _time

    from rufus.launch import server as srv_mod
    from rufus.serving.triton_backend import mark_initialized

    srv = srv_mod.TritonServer(models=["rufus_llm", "rufus_qp_medusa"])
    srv.markers = tmp_path
    ready: set[str] = set()
    monkeypatch.setattr(srv, "is_ready", lambda m="": m in ready)
    starts: list[float] = []
    monkeypatch.setattr(srv, "stop", lambda timeout=0: None)
    monkeypatch.setattr(srv, "start", lambda: starts.append(_time.time()) or srv)
    assert srv.stalled_loads() == []  # no stub finished initialize(): slow, not stalled
    monkeypatch.setenv(srv_mod.INIT_MARKERS_ENV, str(tmp_path))
    old = _time.time() - srv_mod.LOAD_STALL_S - 1
    mark_initialized("rufus_qp_medusa")
    os.utime(tmp_path / "rufus_qp_medusa", (old, old))
    # tritonserver answers nothing until every model loaded: one model done long ago while
    # another is still in initialize() is a slow start, not a stall
    assert srv.stalled_loads() == []
    mark_initialized("rufus_llm")
    assert srv.stalled_loads() == []  # the last one just now: tritonserver takes milliseconds
    os.utime(tmp_path / "rufus_llm", (old, old))
    assert srv.stalled_loads() == ["rufus_llm", "rufus_qp_medusa"]
    assert "#7192" in srv.stall_message(["rufus_llm"])
    watch = srv_mod.LoadWatch(srv)
    for _ in range(srv_mod.MAX_STALL_RESTARTS):
        watch.checked = 0.0
        assert watch.poll() is True
    watch.checked = 0.0
    assert watch.poll() is False and len(starts) == srv_mod.MAX_STALL_RESTARTS
    ready.update(srv.models)  # a model unloaded after it was ready is not a stall
    watch = srv_mod.LoadWatch(srv)
    watch.checked = 0.0
    assert watch.poll() is True and not watch.loading


def test_freeze_heap_takes_what_exists_out_of_the_collectors_scans():
    """After a stub's start the objects it built are frozen, so a full collection does not
    walk them on a client's request (its cost: docs/benchmarks.md)."""
    import gc

    from rufus.serving.triton_backend import freeze_heap

    kept = [object() for _ in range(1000)]
    try:
        freeze_heap("test")
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


def test_freeze_before_the_fork_does_not_collect(monkeypatch):
    """Right before the EngineCore's fork the heap is frozen without a collection: it
    found a few hundred unreachable objects and cost most of a second of each start."""
    import gc

    from rufus.serving import triton_backend

    calls: list[str] = []
    monkeypatch.setattr(triton_backend.gc, "collect", lambda *a: calls.append("collect") or 0)
    try:
        triton_backend.freeze_heap("test", collect=False)
        assert calls == [] and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_free_port_never_hands_out_a_port_twice():
    from rufus.launch.ports import free_port

    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == len(ports)


def test_free_port_is_below_the_ephemeral_range_and_bindable(monkeypatch):
    """A server binds its ports a minute after they are chosen: none from the range the
    kernel gives outgoing connections, every one free on all addresses."""
    import socket

    from rufus.launch import ports as server

    low = server._ephemeral_low()
    if low - server._LOW_PORT < 1000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    for port in (server.free_port() for _ in range(16)):
        assert server._LOW_PORT <= port < low
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))
    # a machine whose ephemeral range leaves no room below it: the kernel's choice
    monkeypatch.setattr(server, "_ephemeral_low", lambda: server._LOW_PORT + 10)
    assert server.free_port() > 0


def test_free_port_never_repeats_a_random_draw(monkeypatch):
    """The draw may repeat a port (its socket is closed again at once): a second call must
    not return it, or two servers would share a port for good."""
    import socket

    from rufus.launch import ports as server

    free = []
    for port in range(21000, 32000, 97):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        free.append(port)
        if len(free) == 2:
            break
    else:
        pytest.skip("no two free ports in 21000-32000")
    p, q = free
    draws = iter([p, p, p, q])

    class Draws:
        def randrange(self, lo: int, hi: int) -> int:
            return next(draws)

    monkeypatch.setattr(server, "_GIVEN_PORTS", set())
    monkeypatch.setattr(server, "_PORT_RANDOM", Draws())
    monkeypatch.setattr(server, "_ephemeral_low", lambda: 32768)
    assert [server.free_port(), server.free_port()] == [p, q]
