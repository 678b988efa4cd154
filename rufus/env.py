"""The one place that touches ``os.environ``: the low-level readers (a wrong value names its
variable), and the copy, set and unset a process uses to build a child's environment.

The typed, declared settings (rufus/serving/settings.py: ``env_var``, ``read``, ``rows``) read
through :func:`environ`; no other product module reads the environment directly
(tests/unit/test_settings.py). Every entrypoint lists the variables it reads in its ``--help``
(rufus/serving/settings.py's ``help_epilog``), so an operator can see them without starting
anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T", int, float)
R = TypeVar("R")


class EnvError(ValueError):
    """An environment variable holds a value the entrypoint cannot use."""


def environ() -> Mapping[str, str]:
    """This process's environment, live (read it where the process starts or an object is
    built, never at import)."""
    return os.environ


def environ_copy(*overlays: Mapping[str, str], **extra: str) -> dict[str, str]:
    """A copy of this process's environment with ``overlays`` and ``extra`` on top: the
    start of a child process's environment."""
    out = dict(os.environ)
    for overlay in overlays:
        out.update(overlay)
    out.update(extra)
    return out


def env_str(name: str, default: str = "", env: Mapping[str, str] | None = None) -> str:
    """The variable as it is (``default`` when unset; an empty value stays empty)."""
    return (os.environ if env is None else env).get(name, default)


def env_opt(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable, or None when it is unset."""
    return (os.environ if env is None else env).get(name)


def set_environ(name: str, value: str | None) -> None:
    """Set (``None``: remove) a variable of this process, for what it starts in-process
    (vLLM reads its own variables from here)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def setdefault_environ(name: str, value: str) -> None:
    os.environ.setdefault(name, value)


def _number(kind: Callable[[str], T], word: str, name: str, default: T,
            env: Mapping[str, str] | None, minimum: T | None, maximum: T | None) -> T:
    raw = (os.environ if env is None else env).get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise EnvError(f"{name}={raw[:40]!r}: expected {word}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"{minimum if minimum is not None else '-inf'}..{maximum if maximum is not None else 'inf'}"
        raise EnvError(f"{name}={raw[:40]!r}: expected {word} in {bounds}")
    return value


def env_int(name: str, default: int, env: Mapping[str, str] | None = None, *,
            minimum: int | None = None, maximum: int | None = None) -> int:
    return _number(int, "a whole number", name, default, env, minimum, maximum)


def env_float(name: str, default: float, env: Mapping[str, str] | None = None, *,
              minimum: float | None = None, maximum: float | None = None) -> float:
    return _number(float, "a number", name, default, env, minimum, maximum)


def env_port(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    return env_int(name, default, env, minimum=1, maximum=65535)


# Optimisations a benchmark turns off to measure its baseline (RUFUS_LAB_OFF=name,name): one
# variable for the lab, not an operator's knob each (issue 61 retired their own variables).
LAB_OFF_VAR = "RUFUS_LAB_OFF"
LAB_SWITCHES: dict[str, str] = {
    "gc_freeze": "each stub's start-up heap frozen out of the collector's scans",
    "fork": "the EngineCore forked from the stub (off: spawned, vLLM's CPU default)",
    "fp32_packed": "the planner's fp32 few-row passes through oneDNN's pre-packed matmul",
    "fused": "the planner's int8 passes of up to 128 rows in one call per decoder layer",
    "prewarm": "a follow-up's answer prefix prefilled while the planner runs",
    "short_warmup": "vLLM's compile warm-up with a short dummy batch where that is safe "
                    "(off: vLLM's full max_num_batched_tokens batch)",
}


def lab_on(name: str, env: Mapping[str, str] | None = None) -> bool:
    """False when ``RUFUS_LAB_OFF`` lists ``name`` (a benchmark's baseline); an unknown name
    there is an error naming the variable."""
    raw = (os.environ if env is None else env).get(LAB_OFF_VAR, "")
    off = {w.strip() for w in raw.split(",") if w.strip()}
    unknown = sorted(off - set(LAB_SWITCHES))
    if unknown:
        raise EnvError(f"{LAB_OFF_VAR}={raw[:40]!r}: unknown {unknown[0]!r} (one of "
                       f"{', '.join(LAB_SWITCHES)})")
    return name not in off


def help_text(variables: Mapping[str, str]) -> str:
    """An ``--help`` epilog: one line per variable with what it sets."""
    width = max(map(len, variables), default=0)
    return "environment:\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in variables.items())


def exits_on_env_error(main: Callable[..., R]) -> Callable[..., R]:
    """Decorate an entrypoint's ``main``: a bad variable ends it with exit code 2 and one line
    naming the variable, not a traceback."""
    import functools
    import sys

    @functools.wraps(main)
    def wrapper(*args: object, **kwargs: object) -> R:
        try:
            return main(*args, **kwargs)
        except EnvError as exc:
            print(f"configuration error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper
