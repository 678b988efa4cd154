"""The metric-name contract: every metric the stack exports, read from the code declaring it.

Dashboards and alert rules (observe/) name metrics; a rename in the code would leave them
silently empty. So the names are never typed twice: this module reads each declaration from
the source (by AST: telemetry sits below the exporters and imports none of them), and
docs/metrics.md and the rules' check (tests/unit/test_observe_rules.py) follow the code.
The reading is in metric_source.py (the AST evaluator) and metric_declarations.py (what a
module declares); here are the fixed lists, the contract, docs/metrics.md and the CLI.

- prometheus_client families (the OpenAI frontend), with the ``_total`` it adds to counters;
- Triton Python-backend families (``pb_utils.MetricFamily``): names built in loops, tables and
  f-strings are resolved from the literals the code iterates over and from the constructors'
  call sites (``AdmissionMetrics(pb_utils, "rufus_qp_plan", ...)``);
- Prometheus text written by hand (the unit agent, the traffic orchestrator): its ``# TYPE``
  and ``# HELP`` lines and its samples' labels;
- tritonserver's own ``nv_*`` families and Prometheus's ``up`` and ``ALERTS``: fixed lists.

    python -m rufus.telemetry.metric_names --write   # regenerate docs/metrics.md
    python -m rufus.telemetry.metric_names --check   # exit 1 when docs/metrics.md is stale
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from functools import cache

from .metric_declarations import declarations, exporter_files
from .metric_source import MORE, READER, ROOT

DOC = ROOT / "docs" / "metrics.md"
SELF = READER[0]  # where EXPORTERS is

TRITON = "tritonserver :8002 (METRICS_PORT)"
# the file a metric's owner is declared in (the call site of its publisher's constructor,
# else the declaration's own file) -> (endpoint, who exports it)
EXPORTERS: dict[str, tuple[str, str]] = {
    "rufus/serving/triton_backend.py": (TRITON, "rufus_llm, rufus_qp_medusa (every engine model)"),
    "rufus/qp/model.py": (TRITON, "rufus_qp_medusa"),
    "rufus/assistant/triton_model.py": (TRITON, "rufus_assistant"),
    "rufus/frontend/app.py": ("OpenAI frontend :9000 (OPENAI_PORT)", "python -m rufus.frontend"),
    "rufus/frontend/assistant_hook.py": ("OpenAI frontend :9000 (OPENAI_PORT)",
                                         "python -m rufus.frontend (rufus-assistant)"),
    "proxy/agent_http.py": ("unit agent :8090 (RUFUS_AGENT_PORT)", "python -m proxy.agent"),
    "proxy/orchestrator.py": ("traffic orchestrator :9300 (--metrics-port)",
                              "python -m proxy.orchestrator"),
}
ENDPOINT_ORDER = [TRITON, *dict.fromkeys(e for e, _ in EXPORTERS.values() if e != TRITON),
                  "Prometheus itself"]

MV = ("model", "version")
# tritonserver's own families that observe/ reads (Triton 2.51; its docs: metrics.md)
TRITON_FAMILIES: list[tuple[str, str, tuple[str, ...], str]] = [
    ("nv_inference_request_success", "counter", MV,
     "Requests that succeeded (a decoupled model: at its final response)"),
    ("nv_inference_request_failure", "counter", (*MV, "reason"),
     "Requests that failed, by reason (REJECTED, CANCELED, BACKEND, OTHER)"),
    ("nv_inference_count", "counter", MV, "Inferences performed (a batch counts its size)"),
    ("nv_inference_exec_count", "counter", MV, "Model executions (batches) performed"),
    ("nv_inference_request_duration_us", "counter", MV,
     "Cumulative request time, microseconds (a decoupled model: execute() only)"),
    ("nv_inference_queue_duration_us", "counter", MV,
     "Cumulative time requests waited in Triton's queue before execute(), microseconds"),
    ("nv_inference_compute_infer_duration_us", "counter", MV,
     "Cumulative time in execute(), microseconds (a decoupled model returns at once)"),
    ("nv_inference_pending_request_count", "gauge", MV,
     "Requests Triton holds for the model that execute() has not taken yet"),
    ("nv_cpu_utilization", "gauge", (), "The machine's CPU utilization (0-1)"),
    ("nv_cpu_memory_used_bytes", "gauge", (), "The machine's memory in use, bytes"),
    ("nv_cpu_memory_total_bytes", "gauge", (), "The machine's memory, bytes"),
]
# series Prometheus makes itself that the rules and dashboards read
PROMETHEUS_SERIES: list[tuple[str, str, tuple[str, ...], str]] = [
    ("up", "gauge", ("job", "instance"),
     "1 if the last scrape of the target worked; the rules expect the job names in "
     "observe/README.md (the agent's: rufus-agent)"),
    ("ALERTS", "gauge", ("alertname", "alertstate", "severity", MORE),
     "One series per pending or firing alert, with the alert's labels"),
]


@dataclass(frozen=True)
class MetricInfo:
    """One exported family: what a dashboard or a rule may name."""

    name: str
    kind: str  # counter, gauge, histogram, summary
    labels: tuple[str, ...]
    help: str
    endpoint: str
    exporter: str
    source: str  # the file that declares it ("" for the fixed lists)

    def series(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this family."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.kind == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


@cache
def contract() -> tuple[MetricInfo, ...]:
    """Every family the stack exports, and the outside ones observe/ reads."""
    found = declarations(exporter_files())
    out: list[MetricInfo] = []
    unknown = sorted({f for info in found.values() for f in info.files} - set(EXPORTERS))
    if unknown:
        raise RuntimeError(f"metrics declared for {unknown}: add them to EXPORTERS in {SELF}")
    for name, f in found.items():
        if not f.kind:
            raise RuntimeError(f"{f.source}: {name} has no type")
        endpoints = {EXPORTERS[r][0] for r in f.files}
        out.append(MetricInfo(name, f.kind, _ordered(f.labels), f.help, " / ".join(
            sorted(endpoints)), ", ".join(dict.fromkeys(EXPORTERS[r][1] for r in f.files)),
            f.source))
    out += [MetricInfo(n, k, labels, h, TRITON, "tritonserver", "")
            for n, k, labels, h in TRITON_FAMILIES]
    out += [MetricInfo(n, k, labels, h, "Prometheus itself", "Prometheus", "")
            for n, k, labels, h in PROMETHEUS_SERIES]
    names = [m.name for m in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuntimeError(f"declared twice with different exporters: {dup}")
    return tuple(sorted(out, key=lambda m: (_rank(m.endpoint), m.exporter, m.name)))


def _rank(endpoint: str) -> int:
    return ENDPOINT_ORDER.index(endpoint) if endpoint in ENDPOINT_ORDER else len(ENDPOINT_ORDER)


def _ordered(labels: set[str]) -> tuple[str, ...]:
    """model and version first (every Triton family), then the rest; "…" last."""
    first = [x for x in ("unit", "model", "version") if x in labels]
    rest = sorted(labels - {*first, MORE})
    return (*first, *rest, *([MORE] if MORE in labels else []))


def names() -> frozenset[str]:
    """Every family name."""
    return frozenset(m.name for m in contract())


def series_names() -> frozenset[str]:
    """Every sample name a scrape shows (histograms' ``_bucket``, ``_sum``, ``_count``)."""
    return frozenset(s for m in contract() for s in m.series())


# ----------------------------------------------------------------------- docs/metrics.md
HEADER = """\
# Metrics: every name the stack exports

<!-- generated by `python -m rufus.telemetry.metric_names --write` from the code that
declares each metric (rufus/telemetry/metric_names.py reads it): edit the code and rerun
it, not this file; `--check` (and tests/unit/test_observe_rules.py) says when it is stale -->

Read from each metric's declaration in the code, so this list cannot drift from what a scrape
shows. The alert rules and dashboards under `observe/` use only these names (checked by
tests/unit/test_observe_rules.py). A counter's name ends in `_total`; a histogram `x` is
scraped as `x_bucket{le}`, `x_sum` and `x_count`. Prometheus adds `job` and `instance` to
every series. `…` in Labels: more labels than the code names at the declaration.

**Renaming a metric or a label is a breaking change**: dashboards, alert rules and the unit
agent's and orchestrator's readers stop seeing it. List every rename in the README like any
other breaking change.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = [HEADER]
    by_endpoint = itertools.groupby(contract(), key=lambda m: m.endpoint)
    for endpoint, group in by_endpoint:
        lines += [f"## {endpoint}", "", "| Name | Type | Labels | What it means | Exported by |",
                  "|---|---|---|---|---|"]
        for m in group:
            labels = ", ".join(f"`{x}`" if x != MORE else x for x in m.labels) or "-"
            lines.append(f"| `{m.name}` | {m.kind} | {labels} | {_cell(m.help)} | "
                         f"{_cell(m.exporter)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rufus.telemetry.metric_names",
                                 description="The metric-name contract (docs/metrics.md).")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write docs/metrics.md")
    what.add_argument("--check", action="store_true",
                      help="exit 1 when docs/metrics.md is not what --write would write")
    a = ap.parse_args(argv)
    text = render()
    if a.write:
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(ROOT)} ({len(contract())} metrics)")
    elif a.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python -m rufus.telemetry.metric_names "
                  "--write", file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)} is up to date ({len(contract())} metrics)")
    else:
        for m in contract():
            print(f"{m.name}\t{m.kind}\t{','.join(m.labels)}\t{m.exporter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
