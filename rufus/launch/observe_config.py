"""``make observe``'s Prometheus configuration: the ports of this machine's stack and of the
observers (:class:`Ports`), the jobs found only where their processes run (:data:`DISCOVERED`,
by their own metrics), and build/observe/prometheus.yml rendered from
observe/prometheus/local.yml with its target files (:func:`write_config`)."""

from __future__ import annotations

import json
import re
import string
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rufus.env import EnvError, env_port, environ
from rufus.launch.observe_common import BUILD, ROOT

TEMPLATE = ROOT / "observe" / "prometheus" / "local.yml"
RULES = ROOT / "observe" / "rules" / "*.yml"


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
    e = environ() if env is None else env
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
