"""The rules and dashboards against the live stack: Debian's real Prometheus scrapes the
shared stack's tritonserver and OpenAI frontend with observe/rules/rufus.rules.yml loaded,
and after real assistant turns the recorded series have values; every metric a dashboard
panel or a rule reads from these two processes is in their live scrape, so a renamed metric
fails here as well as in the contract (tests/unit/test_observe_rules.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rufus.launch.server import free_port
from rufus.launch.stack import stop_process
from rufus.telemetry import metric_names
from tests.unit.test_observe_rules import dashboard_queries, metric_names_in, rules

from .conftest import scrape, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "observe" / "rules" / "rufus.rules.yml"
FRONTEND = "OpenAI frontend :9000 (OPENAI_PORT)"
# families a process creates only when their event first happens (a restart, a dropped
# reason, a refusal, a failed request): absent from a scrape of a healthy stack
LAZY = {"rufus_assistant_reasons_dropped_total", "rufus_engine_restart_backoff_seconds"}


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("prometheus missing: scripts/setup.sh installs Debian's package (make setup)")
    pytest.skip("prometheus not installed and not root (Debian's prometheus package)")


def _query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(stack, assistant_frontend, log_dir) -> Iterator[str]:
    """A real Prometheus (1-s scrapes and rule evaluation) over the stack; its base URL."""
    binary = _prometheus()
    d = log_dir / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    fe = assistant_frontend.removeprefix("http://")
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - {{job_name: rufus-triton, static_configs: [{{targets: ['127.0.0.1:{stack.metrics_port}']}}]}}\n"
        f"  - {{job_name: rufus-frontend, static_configs: [{{targets: ['{fe}']}}]}}\n")
    port = free_port()
    with open(d / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={d / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        assert wait_for(ready, timeout=60), (d / "prometheus.log").read_text()[-2000:]
        yield base
    finally:
        stop_process(proc)


def test_the_recorded_series_have_values_after_real_turns(prometheus, stack, assistant_frontend):
    import asyncio

    from openai import OpenAI

    from rufus.client import AsyncStreams

    # through rufus_assistant itself (its metrics), and the OpenAI path (the frontend's)
    async def model_turns(questions: tuple[str, ...]) -> None:
        s = AsyncStreams(f"127.0.0.1:{stack.grpc_port}")
        for q in questions:
            [o async for o in s.stream("rufus_assistant", {"question": q})]
        await s.close()

    client = OpenAI(base_url=assistant_frontend + "/v1", api_key="unused")
    recorded = ["rufus:goodput:rate5m", "rufus:slo_attainment:ratio_rate5m",
                "rufus:requests:rate5m", "rufus:first_token_seconds:p99_5m",
                "rufus:engine_ready:avg", "rufus:generation_tokens:rate5m"]
    have: dict[str, list[dict]] = {}
    questions = iter(["a tent for 4 people", "running shoes under $100", "a blender",
                      "a kettle", "hiking boots", "a rice cooker", "a drill", "a desk lamp"] * 4)

    def all_have_values() -> bool:
        # a family a model creates at its first event is scraped at its first value, which
        # rate() does not count: turns keep coming until the rates see an increase
        asyncio.run(model_turns((next(questions),)))
        client.chat.completions.create(model="rufus-assistant",
                                       messages=[{"role": "user", "content": next(questions)}])
        for name in recorded:
            have[name] = _query(prometheus, name)
        return all(have.values()) and any(float(x["value"][1]) > 0
                                          for x in have["rufus:goodput:rate5m"])

    assert wait_for(all_have_values, timeout=120, interval=1), have
    goodput = have["rufus:goodput:rate5m"]
    assert any(float(s["value"][1]) > 0 for s in goodput), goodput
    ready = {s["metric"].get("model"): float(s["value"][1]) for s in have["rufus:engine_ready:avg"]}
    assert ready and all(v == 1.0 for v in ready.values()), ready
    # and no rule failed to evaluate
    with urllib.request.urlopen(prometheus + "/api/v1/rules", timeout=10) as r:
        groups = json.loads(r.read())["data"]["groups"]
    bad = [(g["name"], rule.get("name"), rule.get("lastError")) for g in groups
           for rule in g["rules"] if rule.get("health") not in ("ok", "unknown")]
    assert not bad, bad


def test_every_metric_a_panel_or_rule_reads_is_in_the_live_scrape(stack, assistant_frontend,
                                                                 prometheus):
    time.sleep(1)  # the turns of the test before are in every family by now
    live = set()
    for text in (scrape(stack), urllib.request.urlopen(assistant_frontend + "/metrics",
                                                       timeout=10).read().decode()):
        live |= {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                 if line and not line.startswith("#")}
    owner = {s: m for m in metric_names.contract() for s in m.series()}
    uses = [expr for _, expr in dashboard_queries()] + [r["expr"] for r in rules()]
    read = {n for expr in uses for n in metric_names_in(expr)}
    ours = {n for n in read if n in owner
            and owner[n].endpoint in (metric_names.TRITON, FRONTEND)}
    missing = sorted(n for n in ours - live if owner[n].name not in LAZY)
    assert ours and not missing, f"read by observe/ but not in the live scrape: {missing}"
