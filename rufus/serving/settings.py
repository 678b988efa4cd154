"""Typed settings: each one declared once, on a dataclass field, and read once at load.

A field says where its value lives (the key operators already use), its type, default,
bounds and meaning:

* :func:`param`: a config.pbtxt ``parameters`` entry; where it is declared ``env=True`` (the
  few an operator sets per deployment), ``RUFUS_<KEY>`` in the environment wins;
* :func:`model_json`: a model.json key (``RUFUS_<MODEL>_ENGINE_ARGS`` and ``RUFUS_ENGINE_ARGS``
  override it before it gets here: rufus/serving/config.py);
* :func:`env_var`: an environment variable alone;
* :func:`group`: a nested settings object read from the same sources.

:func:`read` builds the dataclass. A value of the wrong type or out of bounds fails the load
with a :class:`SettingError` that names the key (and its variable) and quotes at most a short
prefix of the value. An empty value means the default. Unknown keys are left alone, as
before: config.pbtxt also carries Triton's own parameters, and model.json's other keys are
vLLM's engine arguments, which vLLM checks. Keys are written out, not taken from field names,
so renaming a field cannot change what operators write. docs/configuration.md is generated
from these declarations (:func:`rows`; deploy/configuration.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rufus.env import EnvError, environ, help_text

T = TypeVar("T")

PBTXT, MODEL_JSON, ENVIRONMENT = "config.pbtxt", "model.json", "environment"
QUOTE_CHARS = 40  # a bad value is quoted up to this many characters
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_SPEC, _GROUP = "rufus.setting", "rufus.group"


class ConfigError(ValueError):
    """A configuration file or override is unusable; the message says which and why
    (rufus/serving/config.py's name for it too)."""


class SettingError(ConfigError):
    """A setting's value is unusable; the message names the key and what it expects."""


class EnvSettingError(SettingError, EnvError):
    """An environment variable's value is unusable: an entrypoint's ``exits_on_env_error``
    ends with exit code 2 and this one line."""


def _quote(raw: Any) -> str:
    text = raw if isinstance(raw, str) else repr(raw)
    if len(text) > QUOTE_CHARS:
        return f"{text[:QUOTE_CHARS]!r}... ({len(text)} chars)"
    return repr(raw)


@dataclass(frozen=True)
class Spec:
    """Where one setting is read and what it accepts."""

    source: str                          # PBTXT, MODEL_JSON or ENVIRONMENT
    key: str                             # its name there (ENVIRONMENT: the variable)
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # a reader of its own (raw value -> value, ValueError/TypeError when unusable) and the
    # type in words, for settings that are not a plain bool, int, float or str
    parse: Callable[[Any], Any] | None = None
    kind: str = ""
    unset: tuple[Any, ...] = (None,)     # model.json values that mean "the default"
    default_text: str = ""               # the default in words, where it is derived
    override: bool = False               # PBTXT: RUFUS_<KEY> in the environment wins

    @property
    def env(self) -> str | None:
        """The environment variable that sets it (None: only its file)."""
        if self.source == ENVIRONMENT:
            return self.key
        return "RUFUS_" + self.key.upper() if self.source == PBTXT and self.override else None


def _field(spec: Spec, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def param(key: str, default: Any, help: str, *, env: bool = False, **kw: Any) -> Any:
    """A config.pbtxt ``parameters`` entry (string value); with ``env``, ``RUFUS_<KEY>``
    wins (a deployment's knob; the rest are set in the model repository, as the official
    backend's are)."""
    return _field(Spec(PBTXT, key, help, override=env, **kw), default)


def model_json(key: str, default: Any, help: str, **kw: Any) -> Any:
    """A model.json key (a JSON value: types are checked as JSON, ``"4"`` is not 4)."""
    return _field(Spec(MODEL_JSON, key, help, **kw), default)


def env_var(name: str, default: Any, help: str, **kw: Any) -> Any:
    """An environment variable alone."""
    return _field(Spec(ENVIRONMENT, name, help, **kw), default)


@dataclass(frozen=True)
class Group:
    """A nested settings object; ``read``/``describe`` for one that keeps its own reader."""

    read: Callable[[Mapping[str, str]], Any] | None = None
    describe: Callable[[], list[Row]] | None = None


def group(cls: type, *, read: Callable[[Mapping[str, str]], Any] | None = None,
          describe: Callable[[], list[Row]] | None = None,
          default: Callable[[], Any] | None = None) -> Any:
    """A nested settings dataclass, read from the same sources (or by ``read(env)``);
    ``default`` builds its default where that is not ``cls()``."""
    return dataclasses.field(default_factory=default or cls,
                             metadata={_GROUP: Group(read, describe)})


def config_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """config.pbtxt ``parameters`` as ``{key: string_value}`` (Triton's model_config JSON)."""
    return {k: str(v.get("string_value", "")) for k, v in
            (model_config.get("parameters") or {}).items() if isinstance(v, dict)}


def _base(tp: Any) -> Any:
    """``X | None`` -> X; other types as they are."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bounds(spec: Spec) -> str:
    lo, hi = spec.minimum, spec.maximum
    if spec.choices:
        return "one of " + ", ".join(spec.choices)
    if lo is not None and hi is not None:
        return f"{_num(lo)}..{_num(hi)}"
    if lo is not None:
        return f">= {_num(lo)}"
    return f"<= {_num(hi)}" if hi is not None else ""


_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
_KINDS = {bool: "bool", int: "int", float: "float", str: "string"}


def _expected(spec: Spec, tp: Any) -> str:
    words = spec.kind or _WORDS.get(tp, getattr(tp, "__name__", str(tp)))
    bounds = _bounds(spec)
    if spec.choices:
        return bounds
    return f"{words} in {bounds}" if ".." in bounds else f"{words} {bounds}".rstrip()


def _convert(spec: Spec, tp: Any, raw: Any) -> Any:
    """The typed value of ``raw``; ValueError (its message unused) when it does not fit."""
    if spec.parse is not None:
        value = spec.parse(raw)
    elif isinstance(raw, str) and spec.source != MODEL_JSON:
        text = raw.strip()
        if tp is bool:
            if text.lower() not in TRUE + FALSE:
                raise ValueError
            value = text.lower() in TRUE
        else:
            value = tp(text) if tp in (int, float) else raw
    else:
        ok = {bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}[tp]
        if not ok(raw):
            raise ValueError
        value = float(raw) if tp is float else raw
    if spec.choices and value not in spec.choices:
        raise ValueError
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or (spec.minimum is not None and value < spec.minimum) or (
                spec.maximum is not None and value > spec.maximum):
            raise ValueError
    return value


def _is_unset(value: Any, unset: tuple[Any, ...]) -> bool:
    return any(value is u or (type(value) is type(u) and value == u) for u in unset)


def _lookup(spec: Spec, params: Mapping[str, str], values: Mapping[str, Any],
            env: Mapping[str, str]) -> tuple[Any, str] | None:
    """(raw value, where it came from) or None for the default."""
    if spec.source == MODEL_JSON:
        if spec.key in values and not _is_unset(values[spec.key], spec.unset):
            return values[spec.key], f"model.json key {spec.key!r}"
        return None
    var = spec.env
    if var and env.get(var, "").strip():
        where = var if spec.source == ENVIRONMENT else \
            f"{var} (overrides config.pbtxt parameter {spec.key!r})"
        return env[var], where
    if spec.source == PBTXT and params.get(spec.key, "").strip():
        return params[spec.key], f"config.pbtxt parameter {spec.key!r}"
    return None


def read(cls: type[T], *, params: Mapping[str, str] | None = None,
         values: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
         model: str = "") -> T:
    """``cls`` from config.pbtxt ``params``, model.json ``values`` and ``env`` (default
    this process's environment); :class:`SettingError` names the first unusable key (``model``: prefix)."""
    env = environ() if env is None else env
    hints = typing.get_type_hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        grp = f.metadata.get(_GROUP)
        if grp is not None:
            kw[f.name] = grp.read(env) if grp.read else read(
                hints[f.name], params=params, values=values, env=env, model=model)
            continue
        spec = f.metadata.get(_SPEC)
        if spec is None:
            continue
        found = _lookup(spec, params or {}, values or {}, env)
        if found is None:
            continue
        raw, where = found
        tp = _base(hints[f.name])
        if spec.parse is None and tp not in _WORDS:
            raise TypeError(f"{cls.__name__}.{f.name}: a {tp} setting needs its own parse")
        try:
            kw[f.name] = _convert(spec, tp, raw)
        except (ValueError, TypeError):
            prefix = f"{model}: " if model else ""
            error = SettingError if where.startswith(("model.json", "config.pbtxt")) \
                else EnvSettingError
            raise error(f"{prefix}{where}: expected {_expected(spec, tp)}, "
                               f"got {_quote(raw)}") from None
    return cls(**kw)


def keys(cls: type, source: str = MODEL_JSON) -> tuple[str, ...]:
    """The keys ``cls`` reads from ``source``, nested groups included."""
    return tuple(r.key for r in rows(cls) if r.source == source)


# ---------------------------------------------------------------------- documentation

@dataclass(frozen=True)
class Row:
    """One setting as docs/configuration.md lists it."""

    source: str
    key: str
    env: str | None
    kind: str
    bounds: str
    default: str
    help: str


def _default_text(spec: Spec, value: Any) -> str:
    if spec.default_text:
        return spec.default_text
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return f'"{value}"' if value else '""'
    return repr(list(value)) if isinstance(value, tuple) else f"{value}"


def rows(cls: type) -> list[Row]:
    """Every setting of ``cls`` (nested groups in place), in declaration order."""
    hints = typing.get_type_hints(cls)
    out: list[Row] = []
    for f in dataclasses.fields(cls):
        grp = f.metadata.get(_GROUP)
        if grp is not None:
            out += grp.describe() if grp.describe else rows(hints[f.name])
            continue
        spec = f.metadata.get(_SPEC)
        if spec is None:
            continue
        tp = _base(hints[f.name])
        out.append(Row(spec.source, spec.key, spec.env,
                       spec.kind or _KINDS.get(tp, str(tp)), _bounds(spec),
                       _default_text(spec, f.default), spec.help))
    return out


def help_epilog(*classes: type, extra: Mapping[str, str] | None = None) -> str:
    """An entrypoint's ``--help`` epilog from its settings' declarations: one line per
    variable with its meaning, default and bounds (``extra``: lines for variables that
    another reader of the process declares, e.g. the topology's)."""
    lines: dict[str, str] = {}
    for cls in classes:
        for r in rows(cls):
            if r.env and r.env not in lines:
                bounds = f"; {r.bounds}" if r.bounds else ""
                lines[r.env] = f"{r.help} (default {r.default}{bounds})"
    lines.update(extra or {})
    return help_text(lines)
