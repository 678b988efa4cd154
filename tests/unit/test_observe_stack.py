"""`make observe` without its servers (rufus/launch/observe.py): the Prometheus config it
renders scrapes the ports it is given under the job names the rules expect, the jobs that
exist only where their processes run are found by their own metrics, pid files never lead to
another program, stop escalates to SIGKILL, the venv is rebuilt only when its pinned file
changes, Phoenix is kept on loopback, and the compose rig's Prometheus matches the rig."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from rufus.env import EnvError
from rufus.launch import observe as obs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
PORTS = obs.Ports(metrics=18002, openai=19000, agent=18090, prometheus=19090, phoenix=16006,
                  phoenix_grpc=14317)
RULE_JOBS = {"rufus-triton", "rufus-frontend", "rufus-agent"}  # what rules/tests label series


def jobs(cfg: dict) -> dict[str, dict]:
    return {j["job_name"]: j for j in cfg["scrape_configs"]}


def static_targets(job: dict) -> list[str]:
    return [t for sc in job.get("static_configs", []) for t in sc["targets"]]


def promtool_check(path: Path) -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool missing: bash scripts/setup.sh promtool")
    r = subprocess.run([exe, "check", "config", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------------- the config
def test_rendered_config_scrapes_the_given_ports(tmp_path):
    build = tmp_path / "a dir with spaces"  # paths are quoted, whatever they hold
    cfg = yaml.safe_load(obs.render_prometheus(obs.TEMPLATE.read_text(), PORTS, build=build))
    assert cfg["global"]["scrape_interval"] == "5s"
    assert cfg["rule_files"] == [str(ROOT / "observe" / "rules" / "*.yml")]
    assert list((ROOT / "observe" / "rules").glob("*.yml")), "the rules glob matches nothing"
    j = jobs(cfg)
    assert set(j) == {"rufus-triton", "rufus-frontend", "rufus-agent", "haproxy",
                      "rufus-orchestrator"}
    assert static_targets(j["rufus-triton"]) == ["127.0.0.1:18002"]
    assert static_targets(j["rufus-frontend"]) == ["127.0.0.1:19000"]
    for d in obs.DISCOVERED:
        assert j[d.job]["file_sd_configs"] == [{"files": [str(build / "targets" /
                                                               f"{d.job}.json")]}]
    # the job names of the example config and of the rules' own tests
    example = jobs(yaml.safe_load((ROOT / "observe" / "prometheus.yml").read_text()))
    assert RULE_JOBS <= set(example) & set(j)
    tested = set(re.findall(r'job="([^"]+)"', "".join(
        f.read_text() for f in (ROOT / "observe" / "rules" / "tests").glob("*.yml"))))
    assert tested <= set(j), tested - set(j)


def test_written_config_passes_promtool_and_lists_the_targets_given(tmp_path):
    env = {"OBSERVE_AGENTS": "127.0.0.1:18190, agent-b:8090", "OBSERVE_HAPROXY": "none",
           "OBSERVE_ORCHESTRATOR": "[::1]:9300"}
    found = obs.write_config(PORTS, build=tmp_path, env=env)
    assert found["rufus-agent"] == ["127.0.0.1:18190", "agent-b:8090"]
    assert found["haproxy"] == [] and found["rufus-orchestrator"] == ["[::1]:9300"]
    agents = json.loads((tmp_path / "targets" / "rufus-agent.json").read_text())
    assert agents == [{"targets": ["127.0.0.1:18190", "agent-b:8090"], "labels": {}}]
    assert json.loads((tmp_path / "targets" / "haproxy.json").read_text()) == []
    before = (tmp_path / "prometheus.yml").stat().st_mtime_ns
    obs.write_config(PORTS, build=tmp_path, env=env)  # unchanged: not rewritten
    assert (tmp_path / "prometheus.yml").stat().st_mtime_ns == before
    promtool_check(tmp_path / "prometheus.yml")


def test_ports_come_from_the_environment_and_a_bad_one_names_its_variable():
    p = obs.Ports.from_env({"METRICS_PORT": "18002", "OPENAI_PORT": "19000",
                            "PROMETHEUS_PORT": "19090", "PHOENIX_PORT": "16006",
                            "PHOENIX_GRPC_PORT": "14317", "RUFUS_AGENT_PORT": "18090"})
    assert p == PORTS
    assert obs.Ports.from_env({}) == obs.Ports()
    with pytest.raises(EnvError, match="PROMETHEUS_PORT"):
        obs.Ports.from_env({"PROMETHEUS_PORT": "9o90"})


@pytest.mark.parametrize("raw,want", [
    ("a:1", ["a:1"]), (" a:1 , b.c-d:65535 ", ["a:1", "b.c-d:65535"]), ("none", []),
    ("NONE", []), ("[::1]:9", ["[::1]:9"])])
def test_target_lists(raw, want):
    assert obs.parse_targets("OBSERVE_AGENTS", raw) == want


@pytest.mark.parametrize("raw", ["a", "a:0", "a:70000", "http://a:1", "a:1,b"])
def test_a_bad_target_list_names_its_variable(raw):
    with pytest.raises(EnvError, match="OBSERVE_HAPROXY"):
        obs.parse_targets("OBSERVE_HAPROXY", raw)


def test_candidates_follow_the_agent_port_without_repeats():
    agent = obs.DISCOVERED[0]
    assert agent.candidates(obs.Ports()) == ["127.0.0.1:8090", "127.0.0.1:8190", "127.0.0.1:8191"]
    assert agent.candidates(obs.Ports(agent=8190)) == ["127.0.0.1:8190", "127.0.0.1:8191"]
    tried: list[tuple[str, str]] = []
    assert obs.discover(agent, obs.Ports(), {}, lambda a, p: tried.append((a, p)) or
                        a.endswith(":8191")) == ["127.0.0.1:8191"]
    assert {p for _, p in tried} == {"rufus_unit_"}


def test_a_job_is_found_by_its_own_metrics_only():
    body = (b"# HELP rufus_unit_healthy 1 if ...\n# TYPE rufus_unit_healthy gauge\n"
            b"rufus_unit_healthy 1\n")

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        addr = f"127.0.0.1:{srv.server_address[1]}"
        assert obs.probe_metrics(addr, "rufus_unit_")
        assert not obs.probe_metrics(addr, "haproxy_")  # another program on the port
    finally:
        srv.shutdown()
        srv.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    assert not obs.probe_metrics(closed, "rufus_unit_")


# ------------------------------------------------------------------------- pids
def test_pid_files(tmp_path):
    f = tmp_path / "x.pid"
    assert obs.read_pid(f) is None
    for junk in ("", "abc", "-5", "0"):
        f.write_text(junk)
        assert obs.read_pid(f) is None
    f.write_text(f"{os.getpid()}\n")
    assert obs.live_pid(f, obs.cmdline(os.getpid()).split()[0]) == os.getpid()
    # the pid is alive but another program's: not ours, and the stale file goes
    assert obs.live_pid(f, "no-such-program-xyz") is None and not f.exists()


def test_stop_ends_the_process_and_reaps_nothing_it_does_not_own(tmp_path, capsys):
    f = tmp_path / "sleep.pid"
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    f.write_text(f"{proc.pid}\n")
    try:
        # Popen returns once exec began; the kernel sets the new command line a moment later
        deadline = time.monotonic() + 5
        while "sleep" not in obs.cmdline(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert obs.live_pid(f, "sleep") == proc.pid
        assert obs.stop(f, "sleep", "sleeper") is True
        assert proc.wait(5) == -15 and not f.exists()
        assert "sleeper: stopped" in capsys.readouterr().err
        assert obs.stop(f, "sleep", "sleeper") is False  # nothing left to stop
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_kills_what_ignores_sigterm(tmp_path, capsys):
    f = tmp_path / "stubborn.pid"
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(30)  # stubborn-marker")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        f.write_text(f"{proc.pid}\n")
        assert obs.stop(f, "stubborn-marker", "stubborn", grace=0.3) is True
        assert proc.wait(5) == -9
        assert "stubborn: killed" in capsys.readouterr().err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


def test_a_server_that_dies_before_it_answers_fails_with_its_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("starting\nerror: port in use\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/-/ready"
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(obs.StartError, match=r"(?s)exited \(0\).*port in use"):
        obs.wait_ready({"X": obs.Pending(url, proc, log, 30)})
    with pytest.raises(obs.StartError, match="running already"):
        obs.wait_ready({"X": obs.Pending(url, None, log, 0)})


# ------------------------------------------------------------------------- the venv
def test_the_venv_is_rebuilt_only_when_its_file_changes(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("arize-phoenix==1.0\n")
    stamp = obs.requirements_stamp(req)
    venv = tmp_path / "venv"
    assert not obs.venv_current(venv, stamp)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / obs.STAMP).write_text(stamp)
    assert obs.venv_current(venv, stamp)
    req.write_text("arize-phoenix==1.1\n")
    assert not obs.venv_current(venv, obs.requirements_stamp(req))


def test_the_phoenix_requirements_are_exact_pins():
    lines = [x for x in obs.REQUIREMENTS.read_text().splitlines() if x and x[0] != "#"]
    bad = [x for x in lines if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+", x)]
    assert not bad, bad
    assert obs.pinned(obs.REQUIREMENTS, "arize-phoenix") != "?"
    names = [x.split("==")[0].lower() for x in lines]
    assert len(names) == len(set(names))


# ------------------------------------------------------------------------- Phoenix
def test_phoenix_stays_on_loopback_and_off_the_internet():
    env = obs.phoenix_env(PORTS, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "PATH": "/bin",
                                  "PYTHONPATH": "/elsewhere"})
    assert env["PHOENIX_HOST"] == "127.0.0.1" and env["OBSERVE_PHOENIX_GRPC_HOST"] == "127.0.0.1"
    assert (env["PHOENIX_PORT"], env["PHOENIX_GRPC_PORT"]) == ("16006", "14317")
    assert env["PHOENIX_WORKING_DIR"] == str(obs.BUILD / "phoenix")
    assert env["PHOENIX_TELEMETRY_ENABLED"] == "false"
    assert env["PHOENIX_ALLOW_EXTERNAL_RESOURCES"] == "false"
    assert env["PHOENIX_AGENTS_DISABLE_BASH"] == "true"
    assert not any(k.startswith("OTEL_") for k in env) and "PYTHONPATH" not in env
    assert obs.phoenix_env(PORTS, {"PHOENIX_WORKING_DIR": "/data"})["PHOENIX_WORKING_DIR"] \
        == "/data"


def test_phoenix_grpc_receiver_binds_the_loopback_address(monkeypatch):
    """observe/phoenix/serve.py rewrites Phoenix's ``[::]:N`` (every interface)."""
    import grpc.aio

    bound: list[str] = []

    class Server:
        def add_insecure_port(self, address: str) -> int:
            bound.append(address)
            return 1

    monkeypatch.setattr(grpc.aio, "server", lambda *a, **k: Server())
    spec = importlib.util.spec_from_file_location("phoenix_serve", obs.PHOENIX_SERVE)
    assert spec is not None and spec.loader is not None
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    serve._bind_one_address("127.0.0.1")
    grpc.aio.server().add_insecure_port("[::]:4317")
    grpc.aio.server().add_insecure_port("10.0.0.1:4317")  # an explicit address is kept
    assert bound == ["127.0.0.1:4317", "10.0.0.1:4317"]


def test_the_summary_says_where_to_send_traces():
    text = obs.summary(PORTS, {"rufus-triton": ["127.0.0.1:18002"], "haproxy": []}, 3, 1.0)
    assert "export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:16006\n" in text
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in text and "http://127.0.0.1:14317" in text
    assert "http://127.0.0.1:19090" in text and "none answered" in text


def test_chromium_runs_headless_with_a_fresh_profile(tmp_path):
    argv = obs.chromium_argv("chromium", "http://127.0.0.1:1/", tmp_path / "a.png",
                             tmp_path / "profile")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,900"):
        assert flag in argv
    assert f"--user-data-dir={tmp_path / 'profile'}" in argv
    assert f"--screenshot={tmp_path / 'a.png'}" in argv and argv[-1] == "http://127.0.0.1:1/"


# ------------------------------------------------------------------------- make, compose
def test_make_has_the_targets():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)
    assert phony and {"observe", "observe-down"} <= set(phony.group(1).split())
    assert re.search(r"^observe:.*\n\t.*-m rufus\.launch\.observe up$", text, re.M)
    assert re.search(r"^observe-down:.*\n\t.*-m rufus\.launch\.observe down$", text, re.M)


def test_compose_prometheus_is_opt_in_and_scrapes_the_rig():
    svc = COMPOSE["services"]["prometheus"]
    assert svc["profiles"] == ["observe"], "the default rig (and its tests) must not start it"
    assert svc["ports"] == ["127.0.0.1:9090:9090"], "this host only"
    assert "../observe/prometheus/compose.yml:/etc/prometheus/prometheus.yml:ro" in svc["volumes"]
    assert "../observe/rules:/etc/prometheus/rules:ro" in svc["volumes"]
    assert not any("profiles" in s for n, s in COMPOSE["services"].items()
                   if n not in ("prometheus", "grafana") and not n.endswith("-b")), \
        "only cell b and observe"
    path = ROOT / "observe" / "prometheus" / "compose.yml"
    cfg = yaml.safe_load(path.read_text())
    assert cfg["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    j = jobs(cfg)
    local = jobs(yaml.safe_load(obs.render_prometheus(obs.TEMPLATE.read_text(), PORTS)))
    assert set(j) <= set(local) and RULE_JOBS <= set(j)
    want = {"rufus-triton": ["leader:8002", "leader-b:8002"],
            "rufus-agent": ["agent:8090", "agent-b:8090"],
            "haproxy": ["haproxy:8404"], "rufus-frontend": ["openai:9000"]}
    assert {n: static_targets(x) for n, x in j.items()} == want
    for targets in want.values():  # each target is a service that exposes that port
        for t in targets:
            name, port = t.split(":")
            s = COMPOSE["services"][name]
            ports = {str(p) for p in s.get("expose", [])} | {
                str(p).rsplit(":", 1)[-1] for p in s.get("ports", [])}
            assert port in ports, t
    stats = (ROOT / "proxy" / "haproxy" / "haproxy.cfg").read_text()
    assert re.search(r"bind :8404\n\s+http-request use-service prometheus-exporter "
                     r"if \{ path /metrics \}", stats)
    promtool_check(path)


def test_compose_grafana_is_opt_in_and_provisions_the_dashboards_over_the_rigs_prometheus():
    svc = COMPOSE["services"]["grafana"]
    assert svc["profiles"] == ["observe"] and svc["ports"] == ["127.0.0.1:3000:3000"]
    assert svc["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    mounts = {v.split(":")[1]: ROOT / "docker" / v.split(":")[0] for v in svc["volumes"]}
    for path in mounts.values():
        assert path.exists(), path
    ds = yaml.safe_load(mounts["/etc/grafana/provisioning/datasources/prometheus.yml"].read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load(mounts["/etc/grafana/provisioning/dashboards/rufus.yml"].read_text())
    boards = mounts[prov["providers"][0]["options"]["path"]]
    names = {p.name for p in boards.glob("*.json")}
    assert {"rufus-unit.json", "rufus-fleet.json"} <= names
    home = svc["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.rsplit("/", 1)[-1] in names


def test_the_prometheus_image_is_built_only_when_asked():
    image_sh = (ROOT / "scripts" / "image.sh").read_text()
    block = re.search(r'^if \[\[ "\$OBSERVE" == 1 \]\]; then\n(.*?)^fi$',
                      image_sh, re.M | re.S)
    assert block and "observe/prometheus/Dockerfile" in block.group(1)
    # the one build of it (the comment at the top names the flag)
    assert len(re.findall(r"^\s*docker build .*observe/prometheus/Dockerfile", image_sh, re.M)) == 1
    dockerfile = (ROOT / "observe" / "prometheus" / "Dockerfile").read_text()
    assert re.search(r"^ARG DEBIAN_IMAGE=debian:12\.\d+-slim$", dockerfile, re.M)
    assert "FROM ${DEBIAN_IMAGE}" in dockerfile and "USER prometheus" in dockerfile
