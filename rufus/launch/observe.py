"""``make observe``: Prometheus and a trace backend (Arize Phoenix) beside ``make serve``.

    python -m rufus.launch.observe up                 # start both; installs what is missing
    python -m rufus.launch.observe status             # what runs and what Prometheus scrapes
    python -m rufus.launch.observe down               # stop both, by pid
    python -m rufus.launch.observe screenshot [DIR]   # PNGs of the traces and of a graph

Both run in the background in sessions of their own (they outlive ``make``): pids in
build/observe/*.pid, logs in build/observe/*.log, data under build/observe/. Phoenix runs
from a venv of its own (build/observe-venv, from observe/phoenix/requirements.txt), never
from the project's: its numpy, pandas and grpcio would fight requirements.lock. Why Phoenix,
the jobs and the ports: observe/README.md. Only the Python standard library is used here,
so this runs before ``make setup`` too.

This module starts, checks and stops the two servers; its parts, one job each:
observe_config (the Prometheus configuration and the ports), observe_procs (pid files,
background processes), observe_installs (prometheus, chromium, the venv), observe_shots
(``screenshot``) and observe_common (paths, messages, HTTP), all in rufus/launch/.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rufus.env import environ_copy, exits_on_env_error, help_text
from rufus.launch.observe_common import (
    BUILD,
    PHOENIX,
    PHOENIX_SERVE,
    PROMETHEUS,
    StartError,
    http_get,
    http_json,
    port_busy,
    rel,
    say,
)
from rufus.launch.observe_config import (
    DISCOVERED,
    RULES,
    TEMPLATE,
    Ports,
    discover,
    parse_targets,
    probe_metrics,
    render_prometheus,
    write_config,
)
from rufus.launch.observe_installs import (
    REQUIREMENTS,
    STAMP,
    VENV,
    ensure_prometheus,
    ensure_venv,
    pinned,
    requirements_stamp,
    venv_current,
)
from rufus.launch.observe_procs import cmdline, live_pid, read_pid, signal_process, spawn, stop, tail
from rufus.launch.observe_shots import chromium_argv, phoenix_projects, screenshot

# This module's commands, and the names of the parts it joins that its callers
# (tests/unit/test_observe_stack.py) read through it.
__all__ = [
    "BUILD", "DISCOVERED", "ENVIRONMENT", "PHOENIX_SERVE", "REQUIREMENTS", "RUNNING_TIMEOUT_S",
    "STAMP", "START_TIMEOUT_S", "TEMPLATE", "Pending", "Ports", "StartError", "chromium_argv",
    "cmdline", "discover", "down", "live_pid", "main", "parse_targets", "parser", "phoenix_env",
    "pinned", "probe_metrics", "prometheus_argv", "read_pid", "render_prometheus",
    "requirements_stamp", "rule_groups", "screenshot", "status", "stop", "summary", "up",
    "venv_current", "wait_ready", "write_config",
]

ENVIRONMENT = {
    "METRICS_PORT": "tritonserver's metrics port, scraped as job rufus-triton (8002)",
    "OPENAI_PORT": "the OpenAI frontend's port, scraped as job rufus-frontend (9000)",
    "RUFUS_AGENT_PORT": "a unit agent's port tried for job rufus-agent (8090)",
    "OBSERVE_AGENTS": "host:port,... of unit agents (default: those of 8090, 8190, "
                            "8191 that answer; 'none': no job targets)",
    "OBSERVE_HAPROXY": "host:port,... of HAProxy stats listeners (default: 9100, 8404 "
                             "where they answer)",
    "OBSERVE_ORCHESTRATOR": "host:port,... of traffic orchestrators (default: 9300 "
                                  "where it answers)",
    "PROMETHEUS_PORT": "Prometheus's web/API port on 127.0.0.1 (9090)",
    "PHOENIX_PORT": "Phoenix's UI and OTLP/HTTP port on 127.0.0.1 (6006)",
    "PHOENIX_GRPC_PORT": "Phoenix's OTLP/gRPC port on 127.0.0.1 (4317)",
    "PHOENIX_WORKING_DIR": "Phoenix's data (default build/observe/phoenix)",
}


def phoenix_env(ports: Ports, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Phoenix's environment: loopback only, its data under build/, nothing fetched from or
    sent to the internet, no agent assistant or MCP server (a local trace viewer needs
    neither). The caller's OTEL_* settings are dropped: Phoenix would trace itself."""
    e = environ_copy() if environ is None else dict(environ)
    env = {k: v for k, v in e.items() if not k.startswith("OTEL_") and k != "PYTHONPATH"}
    env.update(PHOENIX_HOST="127.0.0.1", PHOENIX_PORT=str(ports.phoenix),
               PHOENIX_GRPC_PORT=str(ports.phoenix_grpc), OBSERVE_PHOENIX_GRPC_HOST="127.0.0.1",
               PHOENIX_WORKING_DIR=e.get("PHOENIX_WORKING_DIR") or str(BUILD / "phoenix"))
    for k, v in {"PHOENIX_TELEMETRY_ENABLED": "false",
                 "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
                 "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
                 "PHOENIX_AGENTS_DISABLE_BASH": "true",
                 "PHOENIX_ENABLE_MCP_SERVER": "false",
                 "PHOENIX_DB_LOGGING_LEVEL": "warning"}.items():
        env.setdefault(k, v)
    return env


def prometheus_argv(exe: str, ports: Ports, build: Path = BUILD) -> list[str]:
    return [exe, f"--config.file={build / 'prometheus.yml'}",
            f"--storage.tsdb.path={build / 'prometheus'}",
            "--storage.tsdb.retention.time=7d",
            f"--web.listen-address=127.0.0.1:{ports.prometheus}"]


def _free_or_fail(port: int, name: str, variable: str) -> None:
    if port_busy(port):
        raise StartError(f"port {port} ({name}) is taken by another process: stop it "
                         f"(Debian's prometheus service: `systemctl disable --now prometheus`) "
                         f"or set {variable}")


@dataclass
class Pending:
    """A server ``up`` waits for: its readiness URL, the process it started (None: one that
    was already running) and how long it may take."""

    url: str
    proc: subprocess.Popen[bytes] | None
    log: Path
    timeout: float


def wait_ready(pending: dict[str, Pending]) -> None:
    """Until each answers 200; one whose process exits, or that is not ready in time, raises
    with its log's last lines."""
    t0 = time.monotonic()
    next_say = 10.0
    while pending:
        elapsed = time.monotonic() - t0
        for name, w in list(pending.items()):
            if http_get(w.url, timeout=1.0)[0] == 200:
                say(f"{name} answers {w.url} ({time.monotonic() - t0:.0f} s)")
                del pending[name]
            elif w.proc is not None and w.proc.poll() is not None:
                raise StartError(f"{name} exited ({w.proc.returncode}) before it answered "
                                 f"{w.url}; last lines of {rel(w.log)}:\n{tail(w.log)}")
            elif elapsed > w.timeout:
                hint = ("" if w.proc is not None else " (it was running already: started with "
                        "other ports? `make observe-down`, then `make observe`)")
                raise StartError(f"{name} did not answer {w.url} within {w.timeout:.0f} s"
                                 f"{hint}; last lines of {rel(w.log)}:\n{tail(w.log)}")
        if pending and elapsed >= next_say:
            say(f"waiting for {', '.join(pending)} ({elapsed:.0f} s)")
            next_say += 10
        if pending:
            time.sleep(0.5)


START_TIMEOUT_S = 180.0  # Phoenix's first start migrates its database: ~10 s on 2 idle cores
RUNNING_TIMEOUT_S = 15.0


def up(ports: Ports) -> int:
    t0 = time.monotonic()
    BUILD.mkdir(parents=True, exist_ok=True)
    exe = ensure_prometheus(BUILD / "apt.log")
    found = write_config(ports)
    promtool = shutil.which("promtool")
    if promtool:  # a broken template or rule file: promtool's message, not a dead server
        r = subprocess.run([promtool, "check", "config", str(BUILD / "prometheus.yml")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise StartError(f"promtool rejects {rel(BUILD / 'prometheus.yml')}:\n"
                             f"{r.stdout}{r.stderr}")
    name, pid_file, log, marker = PHOENIX
    phoenix_pid = live_pid(pid_file, marker)
    if phoenix_pid is not None and not venv_current(VENV, requirements_stamp(REQUIREMENTS)):
        say(f"{rel(REQUIREMENTS)} changed: stopping Phoenix to rebuild its venv")
        stop(pid_file, marker, name)
        phoenix_pid = None
    prometheus_pid = live_pid(PROMETHEUS[1], PROMETHEUS[3])
    # every port checked before anything starts: a taken one leaves nothing half up
    if phoenix_pid is None:
        _free_or_fail(ports.phoenix, "Phoenix UI", "PHOENIX_PORT")
        _free_or_fail(ports.phoenix_grpc, "Phoenix OTLP/gRPC", "PHOENIX_GRPC_PORT")
    if prometheus_pid is None:
        _free_or_fail(ports.prometheus, "Prometheus", "PROMETHEUS_PORT")
    ensure_venv()
    pending: dict[str, Pending] = {}
    if phoenix_pid is not None:
        say(f"Phoenix already running (pid {phoenix_pid})")
        pending[name] = Pending(f"{ports.phoenix_url}/healthz", None, log, RUNNING_TIMEOUT_S)
    else:
        env = phoenix_env(ports)
        Path(env["PHOENIX_WORKING_DIR"]).mkdir(parents=True, exist_ok=True)
        proc = spawn([str(VENV / "bin" / "python"), str(PHOENIX_SERVE)], env, log, pid_file)
        say(f"Phoenix starting (pid {proc.pid}; log {rel(log)})")
        pending[name] = Pending(f"{ports.phoenix_url}/healthz", proc, log, START_TIMEOUT_S)
    name, pid_file, log, marker = PROMETHEUS
    if prometheus_pid is not None:
        signal_process(prometheus_pid, signal.SIGHUP)  # Prometheus re-reads its configuration
        say(f"Prometheus already running (pid {prometheus_pid}): configuration reloaded")
        pending[name] = Pending(f"{ports.prometheus_url}/-/ready", None, log, RUNNING_TIMEOUT_S)
    else:
        proc = spawn(prometheus_argv(exe, ports), environ_copy(), log, pid_file)
        say(f"Prometheus starting (pid {proc.pid}; log {rel(log)})")
        pending[name] = Pending(f"{ports.prometheus_url}/-/ready", proc, log, START_TIMEOUT_S)
    wait_ready(pending)
    groups = rule_groups(ports)
    print(summary(ports, found, groups, time.monotonic() - t0), flush=True)
    return 0


def rule_groups(ports: Ports) -> int | None:
    """How many rule groups Prometheus loaded (None: it did not say)."""
    try:
        data = http_json(f"{ports.prometheus_url}/api/v1/rules")
    except (OSError, ValueError):
        return None
    return len(data.get("data", {}).get("groups", [])) if isinstance(data, dict) else None


def summary(ports: Ports, found: dict[str, list[str]], groups: int | None, took: float) -> str:
    absent = "(none answered: `make observe` again once one runs)"
    jobs = "\n".join(f"    {job:<19} {', '.join(t) if t else absent}" for job, t in found.items())
    rules = ("rules: none loaded (see build/observe/prometheus.log)" if not groups
             else f"rules: {groups} groups from {rel(RULES)}")
    return f"""[observe] up in {took:.0f} s
  Prometheus  {ports.prometheus_url}  (/targets, /alerts; {rules})
{jobs}
  Phoenix     {ports.phoenix_url}  (traces: Projects > default)

Send traces there, then start `make serve` in that shell (rufus's default protocol, OTLP
http/protobuf; the exporter adds /v1/traces):
  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{ports.phoenix}
or over OTLP/gRPC:
  export OTEL_EXPORTER_OTLP_PROTOCOL=grpc \\
         OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{ports.phoenix_grpc}
Status: python -m rufus.launch.observe status   Stop: make observe-down"""


def status(ports: Ports) -> int:
    running = 0
    for (name, pid_file, log, marker), url in ((PROMETHEUS, ports.prometheus_url),
                                               (PHOENIX, ports.phoenix_url)):
        pid = live_pid(pid_file, marker)
        if pid is None:
            say(f"{name}: not running")
            continue
        running += 1
        say(f"{name}: running, pid {pid}, {url} (log {rel(log)})")
    if live_pid(PROMETHEUS[1], PROMETHEUS[3]) is not None:
        try:
            active = http_json(f"{ports.prometheus_url}/api/v1/targets?state=active")
            assert isinstance(active, dict)
            for t in active["data"]["activeTargets"]:
                err = f" ({t['lastError']})" if t.get("lastError") else ""
                say(f"  {t['labels']['job']:<19} {t['labels']['instance']:<22} "
                    f"{t['health']}{err}")
        except (OSError, ValueError, KeyError, AssertionError) as exc:
            say(f"  targets: Prometheus did not answer ({exc})")
    if live_pid(PHOENIX[1], PHOENIX[3]) is not None:
        try:
            for p in phoenix_projects(ports):
                say(f"  project {p['name']!r}: {p.get('traceCount', '?')} traces")
        except (OSError, ValueError, KeyError) as exc:
            say(f"  projects: Phoenix did not answer ({exc})")
    return 0 if running == 2 else 3


def down() -> int:
    for name, pid_file, _log, marker in (PROMETHEUS, PHOENIX):
        stop(pid_file, marker, name)
    return 0


# ------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    epilog = help_text(ENVIRONMENT)
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(prog="python -m rufus.launch.observe", description=(
        "Prometheus (127.0.0.1:9090) and Arize Phoenix (traces, 127.0.0.1:6006) beside "
        "make serve"), epilog=epilog, formatter_class=fmt)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start both (installs prometheus, builds build/observe-venv)",
                   epilog=epilog, formatter_class=fmt)
    sub.add_parser("down", help="stop both (SIGTERM, then SIGKILL)", epilog=epilog,
                   formatter_class=fmt)
    sub.add_parser("status", help="what runs, Prometheus's targets, Phoenix's projects",
                   epilog=epilog, formatter_class=fmt)
    shot = sub.add_parser("screenshot", epilog=epilog, formatter_class=fmt,
                          help="PNGs of Phoenix's traces page and a Prometheus graph",
                          description="Check that Phoenix holds spans (printing their trace "
                          "ids), then take PNGs with headless chromium of its traces page "
                          "and of Prometheus's graph page for --expr")
    shot.add_argument("out", nargs="?", type=Path, default=BUILD / "screenshots",
                      help="folder for the PNGs (default build/observe/screenshots)")
    shot.add_argument("--project", default="default",
                      help="Phoenix project (default: %(default)s, where rufus's spans go)")
    shot.add_argument("--expr", default="up", help="PromQL expression (default: %(default)s)")
    shot.add_argument("--graph", action="store_true", help="graph tab, not the table")
    shot.add_argument("--wait", type=float, default=0.0,
                      help="seconds to wait for a first span (default: %(default)s)")
    return ap


@exits_on_env_error
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    ports = Ports.from_env()
    try:
        if a.command == "up":
            return up(ports)
        if a.command == "down":
            return down()
        if a.command == "status":
            return status(ports)
        return screenshot(ports, a.out, a.project, a.expr, not a.graph, a.wait)
    except StartError as exc:
        say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
