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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rufus.env import EnvError, env_port, exits_on_env_error, help_text

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "observe"
VENV = ROOT / "build" / "observe-venv"
REQUIREMENTS = ROOT / "observe" / "phoenix" / "requirements.txt"
PHOENIX_SERVE = ROOT / "observe" / "phoenix" / "serve.py"
TEMPLATE = ROOT / "observe" / "prometheus" / "local.yml"
RULES = ROOT / "observe" / "rules" / "*.yml"
STAMP = ".rufus-requirements"  # in the venv: what it was built from

# (name, pid file, log, what its command line holds: a pid reused by another program is not
# taken for ours)
PROMETHEUS = ("Prometheus", BUILD / "prometheus.pid", BUILD / "prometheus.log", "prometheus")
PHOENIX = ("Phoenix", BUILD / "phoenix.pid", BUILD / "phoenix.log", str(PHOENIX_SERVE))

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


class StartError(RuntimeError):
    """Something the operator has to fix; the message says what."""


def say(msg: str) -> None:
    print(f"[observe] {msg}", file=sys.stderr, flush=True)


def rel(path: Path) -> str:
    """``path`` relative to the repository where it is inside it (shorter log lines)."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Ports:
    """The ports of this machine's stack (what ``make serve`` reads) and of the observers."""

    metrics: int = 8002
    openai: int = 9000
    agent: int = 8090
    prometheus: int = 9090
    phoenix: int = 6006
    phoenix_grpc: int = 4317

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Ports:
        return cls(metrics=env_port("METRICS_PORT", cls.metrics, env),
                   openai=env_port("OPENAI_PORT", cls.openai, env),
                   agent=env_port("RUFUS_AGENT_PORT", cls.agent, env),
                   prometheus=env_port("PROMETHEUS_PORT", cls.prometheus, env),
                   phoenix=env_port("PHOENIX_PORT", cls.phoenix, env),
                   phoenix_grpc=env_port("PHOENIX_GRPC_PORT", cls.phoenix_grpc, env))

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus}"

    @property
    def phoenix_url(self) -> str:
        return f"http://127.0.0.1:{self.phoenix}"


@dataclass(frozen=True)
class Discovered:
    """A job that exists only where its processes run: its targets are the addresses in
    ``variable``, else those of ``candidates`` whose /metrics has a series named
    ``prefix...`` (so another program on the port is not scraped as this job)."""

    job: str
    variable: str
    prefix: str

    def candidates(self, ports: Ports) -> list[str]:
        by_job = {"rufus-agent": [ports.agent, 8190, 8191],  # make fleet --fixed-ports: 8190+i
                  "haproxy": [9100, 8404],  # make fleet --fixed-ports; the compose rig
                  "rufus-orchestrator": [9300]}
        return [f"127.0.0.1:{p}" for p in dict.fromkeys(by_job[self.job])]


DISCOVERED = (Discovered("rufus-agent", "OBSERVE_AGENTS", "rufus_unit_"),
              Discovered("haproxy", "OBSERVE_HAPROXY", "haproxy_"),
              Discovered("rufus-orchestrator", "OBSERVE_ORCHESTRATOR", "rufus_orchestrator_"))
_ADDRESS = re.compile(r"[A-Za-z0-9_.-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}")


def parse_targets(variable: str, raw: str) -> list[str]:
    """``host:port,host:port`` (``none``: no targets); a bad entry names the variable."""
    raw = raw.strip()
    if raw.lower() == "none":
        return []
    out = [t.strip() for t in raw.split(",") if t.strip()]
    for t in out:
        if not _ADDRESS.fullmatch(t) or not 0 < int(t.rsplit(":", 1)[1]) < 65536:
            raise EnvError(f"{variable}={raw[:40]!r}: expected host:port[,host:port...] or none")
    return out


def probe_metrics(address: str, prefix: str, timeout: float = 0.5) -> bool:
    """Whether ``http://address/metrics`` answers with a series whose name starts ``prefix``."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
            text = r.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    return re.search(rf"^(# (TYPE|HELP) )?{re.escape(prefix)}", text, re.M) is not None


def discover(job: Discovered, ports: Ports, env: Mapping[str, str] | None = None,
             probe: Callable[[str, str], bool] = probe_metrics) -> list[str]:
    e = os.environ if env is None else env
    if e.get(job.variable, "").strip():
        return parse_targets(job.variable, e[job.variable])
    return [a for a in job.candidates(ports) if probe(a, job.prefix)]


def targets_file(build: Path, job: str) -> Path:
    return build / "targets" / f"{job}.json"


def file_sd(targets: list[str]) -> str:
    """Prometheus file_sd JSON: one group, or none (the job stays, with no target)."""
    return json.dumps([{"targets": targets, "labels": {}}] if targets else [], indent=1) + "\n"


def render_prometheus(template: str, ports: Ports, *, rules: Path | str = RULES,
                      build: Path = BUILD) -> str:
    """The template with this machine's ports and paths (each a quoted YAML string)."""
    q = json.dumps
    return string.Template(template).substitute(
        rules=q(str(rules)),
        triton_target=q(f"127.0.0.1:{ports.metrics}"),
        frontend_target=q(f"127.0.0.1:{ports.openai}"),
        **{f"{d.job.removeprefix('rufus-')}_targets": q(str(targets_file(build, d.job)))
           for d in DISCOVERED})


def write_config(ports: Ports, build: Path = BUILD,
                 env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """build/observe/prometheus.yml and the discovered jobs' target files; returns the
    targets per job (written only when changed: Prometheus watches the files)."""
    (build / "targets").mkdir(parents=True, exist_ok=True)
    found = {"rufus-triton": [f"127.0.0.1:{ports.metrics}"],
             "rufus-frontend": [f"127.0.0.1:{ports.openai}"]}
    for d in DISCOVERED:
        found[d.job] = discover(d, ports, env)
        _write_if_changed(targets_file(build, d.job), file_sd(found[d.job]))
    _write_if_changed(build / "prometheus.yml",
                      render_prometheus(TEMPLATE.read_text(), ports, build=build))
    return found


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: Prometheus never reads half a file


# ------------------------------------------------------------------------- processes
def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def live_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and ours (``marker`` in its command
    line); a stale file (the process gone, or its pid taken by another program) is removed."""
    pid = read_pid(pid_file)
    if pid is not None and alive(pid) and (marker in cmdline(pid)
                                          or not Path("/proc").is_dir()):
        return pid
    pid_file.unlink(missing_ok=True)
    return None


def _signal(pid: int, sig: signal.Signals) -> None:
    """To the process's group where it leads one (``up`` starts each in its own session, so
    helpers it spawned go too), else to the process alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop(pid_file: Path, marker: str, name: str, grace: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; False when it was not running."""
    pid = live_pid(pid_file, marker)
    if pid is None:
        say(f"{name}: not running")
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    how = "stopped"
    if alive(pid):
        _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        how = f"killed (no exit {grace:.0f} s after SIGTERM)"
    pid_file.unlink(missing_ok=True)
    say(f"{name}: {how} (pid {pid})")
    return True


def spawn(argv: list[str], env: Mapping[str, str], log: Path, pid_file: Path
          ) -> subprocess.Popen[bytes]:
    """A background process in a session of its own, output appended to ``log``."""
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env), cwd=ROOT,
                                start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    return proc


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return 0, b""


def http_json(url: str, body: object | None = None, timeout: float = 5.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_logged(argv: list[str], log: Path, what: str, env: Mapping[str, str] | None = None
               ) -> None:
    """Run ``argv`` with its output in ``log``, a progress line every 15 s; a failure raises
    with the log's last lines."""
    t0 = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n=== {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=None if env is None else dict(env))
        next_say = 15.0
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() - t0 >= next_say:
                say(f"  {what}: {next_say:.0f} s (log {rel(log)})")
                next_say += 15
    if proc.returncode != 0:
        raise StartError(f"{what} failed (exit {proc.returncode}); last lines of {rel(log)}:\n"
                         f"{tail(log)}")


# ------------------------------------------------------------------------- installs
def ensure_prometheus(log: Path) -> str:
    """The prometheus binary; Debian's package is installed where it is missing (as root)."""
    exe = shutil.which("prometheus")
    if exe:
        return exe
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        raise StartError("prometheus is not installed: `sudo apt-get install -y "
                         "--no-install-recommends prometheus` (Debian 12: 2.42), or put a "
                         "prometheus binary on PATH")
    # --no-install-recommends: the recommended node exporter would take :9100, the port of
    # make fleet's HAProxy stats
    say("installing Debian's prometheus package (apt-get install -y prometheus; ~30 s)")
    apt = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        run_logged(apt, log, "apt-get install prometheus", env)
    except StartError:
        say("  apt-get install failed: apt-get update, then once more")
        run_logged(["apt-get", "update", "-q"], log, "apt-get update", env)
        run_logged(apt, log, "apt-get install prometheus", env)
    exe = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(exe).exists():
        raise StartError(f"prometheus still missing after apt-get install (log {rel(log)})")
    return exe


def pinned(requirements: Path, package: str) -> str:
    m = re.search(rf"^{re.escape(package)}==(\S+)", requirements.read_text(), re.M | re.I)
    return m.group(1) if m else "?"


def requirements_stamp(requirements: Path, python: str = sys.executable) -> str:
    """What a venv built from ``requirements`` by ``python`` records: the file's hash and
    the interpreter's version and machine (a venv does not survive a new interpreter)."""
    h = hashlib.sha256(requirements.read_bytes()).hexdigest()
    out = subprocess.run([python, "-c", "import platform, sys; print(sys.version.split()[0], "
                          "platform.machine())"], capture_output=True, text=True, check=True)
    return f"{h} {out.stdout.strip()}\n"


def venv_current(venv: Path, stamp: str) -> bool:
    try:
        return (venv / "bin" / "python").exists() and (venv / STAMP).read_text() == stamp
    except OSError:
        return False


def ensure_venv(venv: Path = VENV, requirements: Path = REQUIREMENTS,
                log: Path = BUILD / "pip.log") -> bool:
    """build/observe-venv from the pinned file; False (nothing done) when it already matches
    the file. Built with --no-deps: the file is a complete freeze."""
    stamp = requirements_stamp(requirements)
    version = pinned(requirements, "arize-phoenix")
    if venv_current(venv, stamp):
        say(f"{rel(venv)}: arize-phoenix {version}, matches {rel(requirements)}")
        return False
    n = sum(1 for x in requirements.read_text().splitlines() if "==" in x and x[:1] != "#")
    say(f"creating {rel(venv)}: arize-phoenix {version} and {n - 1} pinned packages from "
        f"{rel(requirements)} (once; ~1-2 min, ~850 MB; log {rel(log)})")
    (venv / STAMP).unlink(missing_ok=True)
    run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], log, "python -m venv")
    py = str(venv / "bin" / "python")
    run_logged([py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                "--no-input", "-r", str(requirements)], log, "pip install")
    run_logged([py, "-c", "import phoenix.server.main"], log, "import phoenix")
    (venv / STAMP).write_text(stamp)
    say(f"{rel(venv)} ready")
    return True


# ------------------------------------------------------------------------- the two servers
def phoenix_env(ports: Ports, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Phoenix's environment: loopback only, its data under build/, nothing fetched from or
    sent to the internet, no agent assistant or MCP server (a local trace viewer needs
    neither). The caller's OTEL_* settings are dropped: Phoenix would trace itself."""
    e = dict(os.environ if environ is None else environ)
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
        _signal(prometheus_pid, signal.SIGHUP)  # Prometheus re-reads its configuration
        say(f"Prometheus already running (pid {prometheus_pid}): configuration reloaded")
        pending[name] = Pending(f"{ports.prometheus_url}/-/ready", None, log, RUNNING_TIMEOUT_S)
    else:
        proc = spawn(prometheus_argv(exe, ports), os.environ, log, pid_file)
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


# ------------------------------------------------------------------------- screenshots
def phoenix_projects(ports: Ports) -> list[dict[str, object]]:
    """Each project's name, id and trace count (Phoenix's GraphQL API)."""
    data = http_json(f"{ports.phoenix_url}/graphql",
                     {"query": "{ projects { edges { node { id name traceCount } } } }"})
    assert isinstance(data, dict)
    return [e["node"] for e in data["data"]["projects"]["edges"]]


def phoenix_traces(ports: Ports, project: str, limit: int = 1000) -> list[str]:
    """Trace ids of the project's spans, newest first (Phoenix's REST API)."""
    url = (f"{ports.phoenix_url}/v1/projects/{urllib.parse.quote(project, safe='')}/spans"
           f"?limit={limit}")
    data = http_json(url)
    assert isinstance(data, dict)
    spans = sorted(data.get("data", []), key=lambda s: s.get("start_time", ""), reverse=True)
    return list(dict.fromkeys(s["context"]["trace_id"] for s in spans))


def ensure_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if exe := shutil.which(name):
            return exe
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        raise StartError("chromium is not installed: `sudo apt-get install -y chromium`")
    say("installing Debian's chromium package (apt-get install -y chromium; ~1 min)")
    BUILD.mkdir(parents=True, exist_ok=True)
    run_logged(["apt-get", "install", "-y", "-q", "chromium"], BUILD / "apt.log",
               "apt-get install chromium", dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    return shutil.which("chromium") or "/usr/bin/chromium"


def chromium_argv(exe: str, url: str, png: Path, profile: Path) -> list[str]:
    """Headless, no network of its own (no updates, sync or QUIC), a fresh profile; the
    virtual-time budget lets the page's scripts fetch and draw before the shot."""
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
            "--virtual-time-budget=15000", f"--screenshot={png}", "--window-size=1400,900",
            url]


def shoot(exe: str, url: str, png: Path) -> None:
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="rufus-chromium-") as profile:
        r = subprocess.run(chromium_argv(exe, url, png, Path(profile)), capture_output=True,
                           text=True, timeout=120)
    if not png.exists() or png.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise StartError(f"chromium wrote no PNG for {url} (exit {r.returncode}):\n"
                         f"{r.stderr[-1500:]}")
    say(f"{png} ({png.stat().st_size // 1024} KB): {url}")


def screenshot(ports: Ports, out: Path, project: str, expr: str, table: bool,
               wait: float) -> int:
    for name, url in (("Phoenix", f"{ports.phoenix_url}/healthz"),
                      ("Prometheus", f"{ports.prometheus_url}/-/ready")):
        if http_get(url)[0] != 200:
            raise StartError(f"{name} does not answer {url}: `make observe` first")
    deadline = time.monotonic() + wait
    projects = {str(p["name"]): p for p in phoenix_projects(ports)}
    traces = phoenix_traces(ports, project) if project in projects else []
    while not traces and time.monotonic() < deadline:
        time.sleep(2)
        projects = {str(p["name"]): p for p in phoenix_projects(ports)}
        traces = phoenix_traces(ports, project) if project in projects else []
    if not traces:
        raise StartError(f"no spans in Phoenix project {project!r} (projects: "
                         f"{', '.join(projects) or 'none'}): send traces first "
                         f"(OTEL_EXPORTER_OTLP_ENDPOINT={ports.phoenix_url}); the screenshot "
                         "would show an empty page")
    say(f"project {project!r}: {len(traces)} traces, newest first:")
    for t in traces[:20]:
        print(t, flush=True)
    if len(traces) > 20:
        say(f"  ... and {len(traces) - 20} more")
    q = urllib.parse.quote(expr, safe="")
    result = http_json(f"{ports.prometheus_url}/api/v1/query?query={q}")
    assert isinstance(result, dict)
    say(f"Prometheus {expr!r}: {len(result['data']['result'])} series")
    exe = ensure_chromium()
    out.mkdir(parents=True, exist_ok=True)
    shoot(exe, f"{ports.phoenix_url}/projects/{projects[project]['id']}/traces",
          out / "phoenix-traces.png")
    shoot(exe, f"{ports.prometheus_url}/graph?g0.expr={q}&g0.tab={1 if table else 0}"
               "&g0.range_input=15m", out / "prometheus-graph.png")
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
