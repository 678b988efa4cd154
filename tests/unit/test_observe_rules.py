"""What an operator sees (observe/): the alert rules pass promtool's checks and unit tests,
every rule and alert is tested, every alert says how bad it is and where its runbook is, the
rules and dashboards name only metrics the stack exports (the contract that
rufus/telemetry/metric_names.py reads from the code), that contract is what the code really
registers, and docs/metrics.md is what it renders."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from rufus.telemetry import metric_names

ROOT = Path(__file__).resolve().parents[2]
OBSERVE = ROOT / "observe"
RULES = OBSERVE / "rules" / "rufus.rules.yml"
RULE_TESTS = sorted((OBSERVE / "rules" / "tests").glob("*.yml"))
DASHBOARDS = sorted((OBSERVE / "grafana" / "dashboards").glob("*.json"))
OPERATIONS = ROOT / "docs" / "operations.md"
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    """promtool's path. Missing: a failure where setup could have installed it (root with
    apt-get: scripts/setup.sh all does), else a skip that says how to get it."""
    path = shutil.which("promtool")
    if path:
        return path
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("promtool missing: `bash scripts/setup.sh promtool` installs Debian's "
                    "prometheus package")
    pytest.skip("promtool missing and not root: `apt-get install prometheus` provides it")


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def recording_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


# --------------------------------------------------------------------------- promtool
def test_promtool_checks_the_rules() -> None:
    out = run(promtool(), "check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool tests in observe/rules/tests/"
    out = run(promtool(), "test", "rules", *RULE_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_example_prometheus_config_is_valid() -> None:
    out = run(promtool(), "check", "config", OBSERVE / "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and template-variable query."""
    found = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        stack = list(board["panels"])
        while stack:
            panel = stack.pop()
            stack += panel.get("panels", [])
            for t in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']}", t["expr"]))
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q, re.S)
                found.append((f"{path.name}: ${var['name']}", m.group(1) if m else q))
    return found


def grafana_free(expr: str) -> str:
    """A dashboard query as plain PromQL: Grafana's variables replaced by a value."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?(\w+)\}?", "x", expr)


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each dashboard query, as a recording rule, passes promtool's parser."""
    queries = dashboard_queries()
    assert len(queries) > 40
    doc = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query:{i}", "expr": grafana_free(q)}
        for i, (_, q) in enumerate(queries)]}]}
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump(doc))
    out = run(promtool(), "check", "rules", path)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- rule hygiene
def test_every_rule_and_alert_is_tested() -> None:
    """Each recording rule is evaluated by a promql_expr_test; each alert has a test where it
    fires and one where it does not."""
    tested: set[str] = set()
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert [str(RULES.relative_to(path.parent.parent))] == [
            f.removeprefix("../") for f in doc["rule_files"]], path.name
        for case in doc["tests"]:
            for t in case.get("promql_expr_test", []):
                tested |= set(re.findall(r"rufus:[a-z0-9_:]+", t["expr"]))
            for t in case.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a["alert"] for a in alerts()}
    assert recording_names() - tested == set(), "recording rules without a promtool test"
    assert names - fires == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    out = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_alert_has_a_severity_and_a_runbook() -> None:
    anchors = github_anchors(OPERATIONS.read_text())
    assert len(alerts()) >= 10
    for a in alerts():
        name = a["alert"]
        assert a.get("labels", {}).get("severity") in SEVERITIES, name
        notes = a.get("annotations", {})
        assert {"summary", "description", "runbook"} <= set(notes), name
        doc, _, anchor = notes["runbook"].partition("#")
        assert doc == "docs/operations.md" and anchor in anchors, \
            f"{name}: runbook {notes['runbook']} is no heading of docs/operations.md"
        assert name.startswith("Rufus"), name


def test_recording_rules_follow_the_naming_convention() -> None:
    """level:metric:operations (Prometheus' convention), all under rufus:."""
    for name in recording_names():
        assert re.fullmatch(r"rufus:[a-z0-9_]+:[a-z0-9_]+", name), name


# --------------------------------------------------------------------------- metric names
PROMQL_WORDS = {
    # aggregations and keywords
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, roughly: identifiers that are not a
    function call, a keyword, a label (matchers, by/on lists) or a duration."""
    e = STRING.sub('""', expr)
    e = re.sub(r"\{[^}]*\}", "{}", e)
    e = re.sub(r"\[[^\]]*\]", "[]", e)
    e = LABEL_LIST.sub(r"\1", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    return {n for n in IDENT.findall(e) if n.lower() not in PROMQL_WORDS}


def test_the_metric_name_reader() -> None:
    expr = ('sum by (model, le) (rate(rufus_x_bucket{stage="first_token", le=~"1(\\\\.0)?"}[5m]))'
            ' / on (instance) group_left(model) rufus:y:rate5m > bool 0.5 or vector(1)'
            ' unless up{job="a"} offset 5m and histogram_quantile(0.99, nv_z[$__rate_interval])'
            ' * 1e6 - max without (a) (ALERTS)')
    assert metric_names_in(expr) == {"rufus_x_bucket", "rufus:y:rate5m", "up", "nv_z", "ALERTS"}
    assert metric_names_in('vllm:prompt_tokens_total{model="$m"}') == {"vllm:prompt_tokens_total"}


def test_rules_and_dashboards_name_only_exported_metrics() -> None:
    known = metric_names.series_names() | recording_names()
    uses = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in rules()]
    uses += dashboard_queries()
    unknown = sorted({f"{where}: {n}" for where, expr in uses for n in metric_names_in(expr)
                      if n not in known})
    assert not unknown, "names neither exported (docs/metrics.md) nor recorded:\n" + \
        "\n".join(unknown)
    read = {n for _, expr in uses for n in metric_names_in(expr)}
    assert {"rufus_engine_ready", "rufus_unit_node_up", "rufus_qp_spec_num_drafts_total",
            "rufus_assistant_stage_seconds_bucket", "nv_inference_request_success"} <= read


def test_dashboards_use_the_datasource_variable() -> None:
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["schemaVersion"] >= 39 and board["uid"], path.name
        assert any(v["name"] == "datasource" and v["type"] == "datasource"
                   for v in board["templating"]["list"]), path.name
        stack = list(board["panels"])
        while stack:
            panel = stack.pop()
            stack += panel.get("panels", [])
            if panel["type"] == "row":
                continue
            for where in (panel, *panel.get("targets", [])):
                assert where["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, \
                    f"{path.name}: {panel['title']}"
    assert {p.name for p in DASHBOARDS} >= {"rufus-unit.json", "rufus-fleet.json"}


# --------------------------------------------------------------------------- the contract
def test_docs_metrics_is_up_to_date() -> None:
    assert metric_names.DOC.read_text() == metric_names.render(), \
        "docs/metrics.md is stale: run `.venv/bin/python -m rufus.telemetry.metric_names --write`"
    assert metric_names.main(["--check"]) == 0


def test_the_contract_names_what_the_issue_needs() -> None:
    by_name = {m.name: m for m in metric_names.contract()}
    assert by_name["rufus_openai_requests_total"].kind == "counter"
    assert by_name["rufus_openai_requests_total"].labels == ("model", "endpoint", "status")
    assert by_name["rufus_assistant_stage_seconds"].labels == ("model", "version", "stage")
    assert by_name["rufus_assistant_first_token_slo_seconds"].exporter == "rufus_assistant"
    assert by_name["rufus_qp_plan_slo_seconds"].exporter == "rufus_qp_medusa"
    assert by_name["rufus_qp_spec_num_drafts_total"].exporter == "rufus_qp_medusa"
    assert by_name["rufus_engine_nodes"].kind == "gauge"
    assert by_name["rufus_unit_node_up"].labels == ("unit", "check", "node")
    assert by_name["rufus_requests_total"].labels == ("model", "version", "outcome")
    assert "rufus_time_to_first_token_seconds_bucket" in metric_names.series_names()
    assert metric_names.exporter_files() == [
        "proxy/agent_http.py", "proxy/orchestrator.py", "rufus/assistant/triton_model.py",
        "rufus/frontend/app.py", "rufus/frontend/assistant_hook.py", "rufus/qp/model.py",
        "rufus/serving/metrics.py",
        "rufus/serving/triton_backend.py"], "a new exporter: check that the contract reads it"


class FakeMetric:
    def __init__(self, family: FakeFamily, labels: dict[str, str]) -> None:
        family.labels |= set(labels)

    def increment(self, v: float) -> None: ...

    def observe(self, v: float) -> None: ...

    def set(self, v: float) -> None: ...


class FakeFamily:
    """pb_utils.MetricFamily that records what it is asked to create."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict[str, FakeFamily] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind, self.labels = name, kind, set[str]()
        FakeFamily.made[name] = self

    def Metric(self, labels: dict[str, str], buckets: Any = None) -> FakeMetric:
        return FakeMetric(self, labels)


def registered_by_the_code(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, set[str]]]:
    """name -> (kind, label names) of what each exporter registers when it runs, every
    lazily labelled child made once."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.parser import text_string_to_metric_families

    import rufus.assistant.triton_model as assistant
    import rufus.qp.model as qp
    import rufus.serving.triton_backend as backend
    from proxy.agent_http import metrics_text
    from proxy.capacity import Capacity, Load
    from proxy.orchestrator import Metrics as OrchestratorMetrics
    from proxy.orchestrator_policy import RegionSignals
    from proxy.probes import NodeCheck, Snapshot
    from rufus.frontend.app import FrontendMetrics
    from rufus.frontend.assistant_hook import AdmissionSeries
    from rufus.serving.admission import AdmissionSettings, queue_features
    from rufus.serving.metrics import EngineCapacity, TritonMetrics

    pb = SimpleNamespace(MetricFamily=FakeFamily)
    FakeFamily.made = {}
    for mod in (assistant, qp, backend):
        monkeypatch.setattr(mod, "pb_utils", pb)
    tm = TritonMetrics(pb, "m", "1")
    tm.init_vllm(64)
    tm.set_capacity(EngineCapacity(1, 2, 3, 4, 5, 6))
    tm.count_request("stop")
    backend.EngineStateMetrics("m", "1")
    am = assistant.TritonAssistantMetrics("m", "1", 1.0)
    am.observe("first_token", 0.1)
    am.count("ok", "products")
    am.dropped("brand")
    planner = SimpleNamespace(name="m", version="1", _spec_families=[], settings=SimpleNamespace(
        admission=AdmissionSettings(slo_s=0.3), report_custom_metrics=True),
        backend=SimpleNamespace(admission_features=lambda: queue_features))
    qp.QueryPlannerModel._make_admission(planner)  # type: ignore[arg-type]
    planner._admission_metrics.close()
    qp.QueryPlannerModel._spec_counters(planner)  # type: ignore[arg-type]
    out = {n: (f.kind, f.labels) for n, f in FakeFamily.made.items()}

    for m in [*vars(FrontendMetrics()).values(),
              *vars(AdmissionSeries(CollectorRegistry())).values()]:
        if isinstance(m, MetricWrapperBase):
            name = m._name + ("_total" if m._type == "counter" else "")
            out[name] = (m._type, set(m._labelnames))

    snap = Snapshot(checks=[NodeCheck("leader", "ready", True, "")], load=Load(),
                    capacity=Capacity("m", 4), at=1.0, poll_s=0.1)
    orch = OrchestratorMetrics(["r"], dry_run=False)
    orch.shares, orch.decisions, orch.samples = {"r": 50}, {("r", "shed"): 1}, {"r": 3.0}
    orch.signals = [RegionSignals("r", 1.0, 1, 1, load=0.5, ttft_p50_s=0.1, ttft_p99_s=0.2)]
    for text in (metrics_text("u", snap, False, {"healthy": 1}, 64), orch.render()):
        for fam in text_string_to_metric_families(text):
            name = fam.name + ("_total" if fam.type == "counter" else "")
            out[name] = (fam.type, {k for s in fam.samples for k in s.labels})
    return out


def test_the_contract_is_what_the_code_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract is read from the source; run, the code registers the same names, kinds
    and labels ("…": labels the source does not spell out, such as rufus_cpu_info's)."""
    real = registered_by_the_code(monkeypatch)
    read = {m.name: m for m in metric_names.contract() if m.source}
    assert set(read) == set(real)
    for name, (kind, labels) in real.items():
        m = read[name]
        assert m.kind == kind, name
        named = set(m.labels) - {metric_names.MORE}
        if metric_names.MORE in m.labels:
            assert named < labels, name
        else:
            assert named == labels, name
