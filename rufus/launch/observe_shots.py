"""``python -m rufus.launch.observe screenshot``: that Phoenix holds spans (their trace ids
printed), then PNGs by headless chromium of its traces page and of a Prometheus graph, so a
change to tracing or to the rules can be shown; and the reads of Phoenix's API that
``status`` shares."""

from __future__ import annotations

import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

from rufus.launch.observe_common import StartError, http_get, http_json, say
from rufus.launch.observe_config import Ports
from rufus.launch.observe_installs import ensure_chromium


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
