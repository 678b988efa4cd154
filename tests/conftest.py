"""Work units for running the container and integration suites side by side on two
pytest-xdist workers (``make test SUITES_XDIST="-n 2 --dist loadgroup"``).

A work unit is a test module, except that every module using the session's shared servers
(tests/integration/conftest.py) is one unit, :data:`SHARED_MODULES`: a module's own servers
then start on one worker only, and the session's servers start once. The scheduler
(``pytest_xdist_make_scheduler``, used with ``--dist loadgroup``) cannot see fixtures, so the
list is written here; collection fails if a module uses the shared servers and is not in it.
(xdist's own ``xdist_group`` marks do not group under pytest 9: they rewrite a node id
attribute pytest no longer reads.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.environment import HARNESS_OPTIONS, option, set_options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rufus", "rufus's test harness (tests/environment.py)")
    for name, (default, kind, _, meaning) in HARNESS_OPTIONS.items():
        if kind is bool:
            group.addoption(name, action="store_true", default=default, help=meaning)
        else:
            group.addoption(name, type=kind, default=default, help=meaning)


def pytest_configure(config: pytest.Config) -> None:
    set_options({name: config.getoption(name) for name in HARNESS_OPTIONS})


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    """Where the integration servers' and the container rig's logs go: ``--logs DIR``, else
    pytest's temporary folder (kept after a green run too)."""
    d = Path(option("--logs") or tmp_path_factory.mktemp("logs"))
    d.mkdir(parents=True, exist_ok=True)
    return d


# session-scoped fixtures of tests/integration/conftest.py that start servers
SHARED_FIXTURES = frozenset({"session_servers", "llm_server", "stack", "stack_server",
                             "assistant_frontend", "url"})
SHARED_MODULES = frozenset(f"tests/integration/{m}.py" for m in (
    "test_adversarial", "test_adversarial_assistant", "test_adversarial_openai",
    "test_assistant", "test_conformance", "test_llm", "test_openai", "test_security",
    "test_tracing", "test_observe"))
SHARED_UNIT = "shared-servers"


def work_unit(nodeid: str) -> str:
    """The scheduling unit of a test: its module, or :data:`SHARED_UNIT`."""
    module = nodeid.split("::", 1)[0]
    return SHARED_UNIT if module in SHARED_MODULES else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = sorted({i.nodeid.split("::", 1)[0] for i in items
                      if i.nodeid.startswith("tests/integration/")
                      and SHARED_FIXTURES & set(getattr(i, "fixturenames", ()))}
                     - SHARED_MODULES)
    if missing:
        raise pytest.UsageError(f"{missing} use the session's shared servers: add them to "
                                "SHARED_MODULES in tests/conftest.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)
