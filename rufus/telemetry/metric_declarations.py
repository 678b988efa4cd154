"""The metric families a product module declares or writes, found in its source: pb_utils and
prometheus_client declarations (with the labels of the metrics made from them) and the
Prometheus text written by hand (its ``# TYPE`` / ``# HELP`` lines and samples' labels).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .metric_source import (
    HOLE,
    MORE,
    READER,
    ROOT,
    Kind,
    Module,
    Scope,
    constructor_sites,
    evaluate,
    loop_bindings,
    module,
    product_files,
)

# what a file declares metrics with; every product file holding one is read (a new exporter
# file without an entry in EXPORTERS fails loudly rather than being left out)
MARKERS = ("MetricFamily", "prometheus_client", "# TYPE ")
METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
CLIENT_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
                "Summary": "summary"}


def exporter_files() -> list[str]:
    """The product files that declare metrics (the files the contract reads)."""
    return [rel for rel in product_files() if rel not in READER
            and any(m in (ROOT / rel).read_text() for m in MARKERS)]


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
class Found:
    """What the source says of one family so far, merged over its declarations."""

    kind: str = ""
    help: str = ""
    labels: set[str] = field(default_factory=set)
    files: dict[str, None] = field(default_factory=dict)  # owner files, in order
    source: str = ""


def _declared(mod: Module, found: dict[str, Found]) -> None:
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
             client_kind: str | None, found: dict[str, Found]) -> None:
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
    f = found.setdefault(name, Found(kind, source=mod.rel))
    f.help = f.help or _text(evaluate(desc, here) if desc is not None else "")
    f.labels |= labels
    f.files[site] = None


EXPOSITION = re.compile(r"^# (TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*) ?(.*)$", re.S)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def _written(mod: Module, found: dict[str, Found]) -> None:
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
            f = found.setdefault(name, Found(source=mod.rel))
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


def declarations(files: Iterable[str]) -> dict[str, Found]:
    """Every family the given product files declare or write, by name, in the order found."""
    found: dict[str, Found] = {}
    for rel in files:
        mod = module(rel)
        _declared(mod, found)
        _written(mod, found)
    return found
