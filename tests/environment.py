"""The harness's own knobs: pytest options (``tests/conftest.py`` adds them), not environment
variables, so that the product's ``RUFUS_*`` names are only the product's. The lab's
benchmarks take theirs as flags (``--log-dir``). docs/configuration.md lists these with the
rig's variables (``python -m deploy.configuration``)."""

from __future__ import annotations

from typing import Any

# option -> (default, type, who reads it, meaning)
HARNESS_OPTIONS: dict[str, tuple[Any, type, str, str]] = {
    "--logs": (None, str, "tests/conftest.py, scripts/repeat_death_tests.sh",
               "keep the servers' and the rig's logs in this directory"),
    "--recovery-cycles": (1, int, "tests/integration/test_recovery.py",
                          "engine kill/recover cycles"),
    "--proxy-nnodes": (2, int, "tests/integration/test_proxy.py",
                       "nodes per unit in the proxy tests"),
    "--require-identical-plans": (False, bool, "tests/integration/test_qp.py",
                                  "require Medusa plans identical to the autoregressive ones"),
    "--remove-images": (False, bool, "tests/containers/conftest.py",
                        "remove the images and compile-cache volumes at the end (default: "
                        "kept for the next run)"),
    "--prebuild": ("1", str, "tests/containers/conftest.py",
                   "the rig image's build-time warm-up (scripts/image.sh --prebuild: 1, "
                   "precision, 0 or auto; make test's: auto)"),
}

_VALUES: dict[str, Any] = {}


def set_options(values: dict[str, Any]) -> None:
    """tests/conftest.py's pytest_configure: the parsed options, for modules that read one at
    import (a parametrisation, a fixture's environment)."""
    _VALUES.update(values)


def option(name: str) -> Any:
    """A harness option's value (its default outside pytest)."""
    return _VALUES.get(name, HARNESS_OPTIONS[name][0])
