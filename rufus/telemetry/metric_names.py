"""The metric-name contract: every metric the stack exports, read from the code declaring it.

Dashboards and alert rules (observe/) name metrics; a rename in the code would leave them
silently empty. So the names are never typed twice: this module reads each declaration from
the source (by AST: telemetry sits below the exporters and imports none of them), and
docs/metrics.md and the rules' check (tests/unit/test_observe_rules.py) follow the code.

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
import ast
import importlib
import itertools
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
PACKAGES = ("rufus", "proxy", "follower")  # the product (lab/ and tests/ export nothing)
SELF = "rufus/telemetry/metric_names.py"
# what a file declares metrics with; every product file holding one is read (a new exporter
# file without an entry in EXPORTERS fails loudly rather than being left out)
MARKERS = ("MetricFamily", "prometheus_client", "# TYPE ")
# the modules a table may come from at import: the vocabulary only (docs/architecture.md)
IMPORTABLE = ("rufus.wire",)
METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
HOLE = "\x00"  # an f-string part that cannot be known from the source
MORE = "…"    # labels beyond those the source names (a dict spread from elsewhere)

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


# ----------------------------------------------------------------------- reading the source
class _Unknown:
    """A value the source does not fix (a parameter, a call's result)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Kind:
    name: str  # counter, gauge, histogram


KIND_ATTRS = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
CLIENT_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
                "Summary": "summary"}


@dataclass
class Module:
    rel: str
    tree: ast.Module
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @classmethod
    def read(cls, rel: str) -> Module:
        tree = ast.parse((ROOT / rel).read_text(), rel)
        mod = cls(rel, tree)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                mod.parents[id(child)] = node
        return mod

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        p = self.parent(node)
        while p is not None:
            yield p
            p = self.parent(p)

    def function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return next((a for a in self.ancestors(node)
                     if isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef)), None)

    def klass(self, node: ast.AST) -> ast.ClassDef | None:
        return next((a for a in self.ancestors(node) if isinstance(a, ast.ClassDef)), None)


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions or classes defined in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                          | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


@dataclass
class Scope:
    """Where an expression is read, and the loop variables and parameters bound there."""

    mod: Module
    at: ast.AST
    bound: dict[str, Any] = field(default_factory=dict)


def _assigned(nodes: Iterable[ast.AST], name: str) -> ast.expr | None:
    """The value last assigned to ``name`` among ``nodes`` (tuple assignments unpacked)."""
    found: list[tuple[int, ast.expr]] = []
    for node in nodes:
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs = [(node.target, node.value)]
        else:
            continue
        for target, value in pairs:
            if isinstance(target, ast.Name) and target.id == name:
                found.append((node.lineno, value))
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                for t, v in zip(target.elts, value.elts, strict=False):
                    if isinstance(t, ast.Name) and t.id == name:
                        found.append((node.lineno, v))
    return max(found, key=lambda f: f[0])[1] if found else None


def _self_assigned(cls: ast.ClassDef, attr: str) -> ast.expr | None:
    """What ``self.<attr>`` is first set to, ``__init__`` first."""
    methods = sorted((n for n in cls.body if isinstance(n, ast.FunctionDef)),
                     key=lambda f: f.name != "__init__")
    for fn in methods:
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (isinstance(t, ast.Attribute) and t.attr == attr
                            and isinstance(t.value, ast.Name) and t.value.id == "self"):
                        return node.value
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _imported(mod: Module, name: str) -> Any:
    """A module-level ``from <vocabulary> import name``, as the object (else UNKNOWN)."""
    for node in mod.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in IMPORTABLE:
            for a in node.names:
                if (a.asname or a.name) == name:
                    return getattr(importlib.import_module(node.module), a.name, UNKNOWN)
    return UNKNOWN


_ACTIVE: set[int] = set()  # assignments being evaluated (``x = f(x)`` must not loop)


def _value_of(value: ast.expr, scope: Scope) -> Any:
    if id(value) in _ACTIVE:
        return UNKNOWN
    _ACTIVE.add(id(value))
    try:
        return evaluate(value, scope)
    finally:
        _ACTIVE.discard(id(value))


def lookup(name: str, scope: Scope) -> Any:
    if name in scope.bound:
        return scope.bound[name]
    mod = scope.mod
    for fn in (a for a in [scope.at, *mod.ancestors(scope.at)]
               if isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef)):
        if name in _params(fn):
            return UNKNOWN
        value = _assigned(_own_nodes(fn), name)
        if value is not None:
            return _value_of(value, Scope(mod, value, scope.bound))
    value = _assigned(mod.tree.body, name)  # a module-level constant
    if value is not None:
        return _value_of(value, Scope(mod, value))
    return _imported(mod, name)


def evaluate(node: ast.AST, scope: Scope) -> Any:
    """The value of an expression as far as the source fixes it: str (an f-string's unknown
    parts as HOLE), numbers, tuples, dicts, :class:`Kind`, else UNKNOWN."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for p in node.values:
            if isinstance(p, ast.Constant):
                parts.append(str(p.value))
                continue
            assert isinstance(p, ast.FormattedValue)
            v = evaluate(p.value, scope) if p.format_spec is None else UNKNOWN
            parts.append(str(v) if isinstance(v, str | int | float) else HOLE)
        return "".join(parts)
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(evaluate(e, scope) for e in node.elts)
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                spread = evaluate(v, scope)
                out.update(spread if isinstance(spread, dict) else {MORE: UNKNOWN})
            else:
                out[evaluate(k, scope)] = UNKNOWN  # the keys are the labels; values vary
        return out
    if isinstance(node, ast.Name):
        return lookup(node.id, scope)
    if isinstance(node, ast.Attribute):
        if node.attr in KIND_ATTRS:
            return Kind(KIND_ATTRS[node.attr])
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = scope.mod.klass(scope.at)
            value = _self_assigned(cls, node.attr) if cls is not None else None
            return UNKNOWN if value is None else _value_of(value, Scope(scope.mod, value))
        return UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "items" and not node.args:
        d = evaluate(node.func.value, scope)
        return tuple(d.items()) if isinstance(d, dict) else UNKNOWN
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = evaluate(node.left, scope), evaluate(node.right, scope)
        return a + b if isinstance(a, str) and isinstance(b, str) else UNKNOWN
    return UNKNOWN


def _unpack(target: ast.AST, value: Any, out: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        out[target.id] = value
    elif isinstance(target, ast.Tuple | ast.List):
        ok = isinstance(value, tuple) and len(value) == len(target.elts)
        for i, t in enumerate(target.elts):
            _unpack(t, value[i] if ok else UNKNOWN, out)


def loop_bindings(mod: Module, node: ast.AST, base: dict[str, Any]) -> list[dict[str, Any]]:
    """One binding of the loop variables per iteration of the loops around ``node`` (in its
    function), where the loop runs over something the source spells out."""
    fn = mod.function(node)
    loops: list[tuple[ast.AST, ast.AST]] = []  # (target, iter), outermost first
    for a in mod.ancestors(node):
        if a is fn:
            break
        if isinstance(a, ast.For):
            loops.insert(0, (a.target, a.iter))
        elif isinstance(a, ast.GeneratorExp | ast.ListComp | ast.SetComp | ast.DictComp):
            loops[:0] = [(g.target, g.iter) for g in a.generators]
    out = [dict(base)]
    for target, it in loops:
        step = []
        for b in out:
            items = evaluate(it, Scope(mod, it, b))
            for item in items if isinstance(items, tuple) else (UNKNOWN,):
                nb = dict(b)
                _unpack(target, item, nb)
                step.append(nb)
        out = step
    return out


@cache
def product_files() -> tuple[str, ...]:
    return tuple(sorted(str(f.relative_to(ROOT)) for pkg in PACKAGES
                        for f in (ROOT / pkg).rglob("*.py") if "__pycache__" not in f.parts))


@cache
def module(rel: str) -> Module:
    return Module.read(rel)


def exporter_files() -> list[str]:
    """The product files that declare metrics (the files this module reads)."""
    return [rel for rel in product_files() if rel != SELF
            and any(m in (ROOT / rel).read_text() for m in MARKERS)]


def constructor_sites(mod: Module, node: ast.AST) -> list[tuple[str, dict[str, Any]]]:
    """(call-site file, parameter binding) per call of the constructor of the class ``node``
    is in (the parameters bound only for a node in ``__init__``); [] when nothing in the
    product calls it (Triton instantiates the model)."""
    cls = mod.klass(node)
    if cls is None:
        return []
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    return _sites(mod.rel, cls.name, init is not None and mod.function(node) is init)


@cache
def _sites(rel: str, cls_name: str, in_init: bool) -> list[tuple[str, dict[str, Any]]]:
    mod = module(rel)
    cls = next(n for n in ast.walk(mod.tree) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    params = _params(init)[1:] if init is not None else []
    sites = []
    for other_rel in product_files():
        if other_rel == SELF or cls_name not in (ROOT / other_rel).read_text():
            continue
        other = module(other_rel)
        for call in ast.walk(other.tree):
            if not (isinstance(call, ast.Call) and (
                    (isinstance(call.func, ast.Name) and call.func.id == cls_name)
                    or (isinstance(call.func, ast.Attribute) and call.func.attr == cls_name))):
                continue
            bound: dict[str, Any] = {}
            if in_init:
                here = Scope(other, call, loop_bindings(other, call, {})[0])
                bound = {p: UNKNOWN for p in params}
                for p, arg in zip(params, call.args, strict=False):
                    bound[p] = evaluate(arg, here)
                for kw in call.keywords:
                    if kw.arg in bound:
                        bound[kw.arg] = evaluate(kw.value, here)
            sites.append((other_rel, bound))
    return sites


def _arg(call: ast.Call, pos: int | None, kw: str) -> ast.expr | None:
    """A call's argument by keyword, else by position (None: no positional form)."""
    for k in call.keywords:
        if k.arg == kw:
            return k.value
    return call.args[pos] if pos is not None and len(call.args) > pos else None


def _label_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else MORE for k in value}
    if isinstance(value, tuple):
        return {str(v) for v in value if isinstance(v, str)}
    return {MORE}


def _metric_calls(region: ast.AST, receiver: ast.AST | None) -> list[ast.Call]:
    """``<receiver>.Metric(labels=...)`` calls in region (any receiver when None)."""
    want = None if receiver is None else ast.unparse(receiver)
    return [n for n in ast.walk(region) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "Metric"
            and _arg(n, None, "labels") is not None
            and (want is None or ast.unparse(n.func.value) == want)]


def triton_labels(mod: Module, decl: ast.Call, bound: dict[str, Any]) -> set[str]:
    """The label keys of a pb_utils family: those of the ``.Metric(labels=...)`` made from it
    (chained, or through the name or attribute it is stored in), else those every metric of
    its class shares."""
    def keys(calls: list[ast.Call]) -> list[set[str]]:
        out = []
        for c in calls:
            labels = _arg(c, None, "labels")
            assert labels is not None
            for b in loop_bindings(mod, c, bound)[:1]:
                out.append(_label_keys(evaluate(labels, Scope(mod, c, b))))
        return out

    parent = mod.parent(decl)
    if isinstance(parent, ast.Attribute) and parent.attr == "Metric":
        call = mod.parent(parent)
        if isinstance(call, ast.Call):
            return set().union(*keys([call]))
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        target = parent.targets[0]
        region = mod.function(decl) if isinstance(target, ast.Name) else mod.klass(decl)
        found = keys(_metric_calls(region, target)) if region is not None else []
        if found:
            return set().union(*found)
    region = mod.klass(decl) or mod.function(decl)
    found = keys(_metric_calls(region, None)) if region is not None else []
    return set.intersection(*found) if found else {MORE}


def _text(v: Any) -> str:
    return " ".join(v.replace(HOLE, MORE).split()) if isinstance(v, str) else ""


@dataclass
class _Found:
    kind: str = ""
    help: str = ""
    labels: set[str] = field(default_factory=set)
    files: dict[str, None] = field(default_factory=dict)  # owner files, in order
    source: str = ""


def _declared(mod: Module, found: dict[str, _Found]) -> None:
    """pb_utils families and prometheus_client families declared in ``mod``."""
    client = {a.asname or a.name: a.name for n in mod.tree.body
              if isinstance(n, ast.ImportFrom) and n.module == "prometheus_client"
              for a in n.names if a.name in CLIENT_KINDS}
    for call in ast.walk(mod.tree):
        if not isinstance(call, ast.Call):
            continue
        fn = call.func
        client_kind = CLIENT_KINDS.get(client.get(fn.id, "")) if isinstance(fn, ast.Name) \
            else None
        name_expr, kind_expr = _arg(call, 0, "name"), _arg(call, 2, "kind")
        if name_expr is None or (client_kind is None and kind_expr is None):
            continue
        if client_kind is None and not any(  # a cheap look first: is this a family at all?
                isinstance(evaluate(kind_expr, Scope(mod, call, b)), Kind)  # type: ignore[arg-type]
                for b in loop_bindings(mod, call, {})):
            continue
        for site, params in constructor_sites(mod, call) or [(mod.rel, {})]:
            for b in loop_bindings(mod, call, params):
                _declare(mod, call, b, site, client_kind, found)


def _declare(mod: Module, call: ast.Call, b: dict[str, Any], site: str,
             client_kind: str | None, found: dict[str, _Found]) -> None:
    here = Scope(mod, call, b)
    name = evaluate(_arg(call, 0, "name"), here)  # type: ignore[arg-type]
    kind: Any = client_kind or evaluate(_arg(call, 2, "kind"), here)  # type: ignore[arg-type]
    if isinstance(kind, Kind):
        kind = kind.name
    if not (isinstance(kind, str) and isinstance(name, str) and METRIC_RE.match(name)):
        return
    desc = _arg(call, 1, "description" if client_kind is None else "documentation")
    if client_kind is not None:
        labels_expr = _arg(call, 2, "labelnames")
        labels = _label_keys(evaluate(labels_expr, here)) if labels_expr else set()
        if kind == "counter" and not name.endswith("_total"):
            name += "_total"  # as prometheus_client exposes it
    else:
        labels = triton_labels(mod, call, b)
    f = found.setdefault(name, _Found(kind, source=mod.rel))
    f.help = f.help or _text(evaluate(desc, here) if desc is not None else "")
    f.labels |= labels
    f.files[site] = None


EXPOSITION = re.compile(r"^# (TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*) ?(.*)$", re.S)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def _written(mod: Module, found: dict[str, _Found]) -> None:
    """Families a module writes as Prometheus text: its ``# TYPE`` / ``# HELP`` lines and
    the label names of its samples."""
    texts: list[str] = []
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.Constant | ast.JoinedStr) or isinstance(
                mod.parent(node), ast.JoinedStr | ast.FormattedValue):
            continue
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            continue
        for b in loop_bindings(mod, node, {}):
            text = evaluate(node, Scope(mod, node, b))
            if isinstance(text, str):
                texts.append(text)
    samples: dict[str, set[str]] = {}
    for text in texts:
        m = EXPOSITION.match(text)
        if m and HOLE not in m.group(2):
            what, name, rest = m.groups()
            f = found.setdefault(name, _Found(source=mod.rel))
            f.files[mod.rel] = None
            if what == "TYPE":
                f.kind = rest.strip()
            else:
                f.help = f.help or _text(rest)
        m = SAMPLE.match(text)
        if m:
            keys = set(re.findall(r"([a-zA-Z_]\w*)=\"", m.group(2)))
            samples.setdefault(m.group(1), set()).update(keys)
    for name, f in found.items():
        if f.source == mod.rel:
            f.labels |= samples.get(name, set())


@cache
def contract() -> tuple[MetricInfo, ...]:
    """Every family the stack exports, and the outside ones observe/ reads."""
    found: dict[str, _Found] = {}
    for rel in exporter_files():
        mod = module(rel)
        _declared(mod, found)
        _written(mod, found)
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
