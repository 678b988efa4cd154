"""Reading the product's source by AST, for the metric-name contract: a small evaluator that
gives an expression the value the source fixes (constants, f-strings, tuples and dicts, loop
variables over spelled-out tables, a constructor's arguments at its call sites). Nothing is
imported but the vocabulary: telemetry sits below the exporters it reads.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rufus", "proxy", "follower")  # the product (lab/ and tests/ export nothing)
# the contract reader's own files: they name the markers and classes they look for, and
# export nothing
READER = ("rufus/telemetry/metric_names.py", "rufus/telemetry/metric_declarations.py",
          "rufus/telemetry/metric_source.py")
# the modules a table may come from at import: the vocabulary only (docs/architecture.md)
IMPORTABLE = ("rufus.wire",)
HOLE = "\x00"  # an f-string part that cannot be known from the source
MORE = "…"    # labels beyond those the source names (a dict spread from elsewhere)


class _Unknown:
    """A value the source does not fix (a parameter, a call's result)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Kind:
    name: str  # counter, gauge, histogram


KIND_ATTRS = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}


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
        if other_rel in READER or cls_name not in (ROOT / other_rel).read_text():
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

