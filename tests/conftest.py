"""Work units for pytest-xdist's ``--dist loadgroup`` (``make test`` runs the container and
integration suites side by side on two workers).

Every test gets an ``xdist_group``: its module's, or ``shared-servers`` for every module
where any test uses the session's servers (tests/integration/conftest.py), so a module's own
servers start on one worker only and the session's servers start once. Without xdist the
marks do nothing.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

# session-scoped fixtures of tests/integration/conftest.py that start servers
SHARED = frozenset({"session_servers", "llm_server", "stack", "assistant_frontend", "url"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_module: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_module[item.nodeid.split("::", 1)[0]].append(item)
    for module, module_items in by_module.items():
        shared = any(SHARED & set(getattr(i, "fixturenames", ())) for i in module_items)
        group = "shared-servers" if shared else module
        for item in module_items:
            item.add_marker(pytest.mark.xdist_group(name=group))
