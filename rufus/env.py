"""Settings read from the environment by the entrypoints: a wrong value names its variable.

Every entrypoint lists the variables it reads in its ``--help`` (:func:`help_text`), so an
operator can see them without starting anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T", int, float)
R = TypeVar("R")


class EnvError(ValueError):
    """An environment variable holds a value the entrypoint cannot use."""


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
