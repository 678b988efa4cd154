"""The variables only the tests and the lab read: the harness's knobs, not the product's
contract (deploy/contract.py) nor the rig's (deploy/configuration.py's RIG_ENV).
docs/configuration.md lists them with the rig's (``python -m deploy.configuration``)."""

from __future__ import annotations

HARNESS_ENV: dict[str, tuple[str, str]] = {
    "RUFUS_TEST_LOGS": ("tests/integration/conftest.py, scripts/repeat_death_tests.sh",
                        "tests: keep the servers' logs in this directory"),
    "RUFUS_RECOVERY_CYCLES": ("tests/integration/test_recovery.py",
                              "tests: engine kill/recover cycles (1)"),
    "RUFUS_PROXY_TEST_NNODES": ("tests/integration/test_proxy.py",
                                "tests: nodes per unit in the proxy tests (2)"),
    "RUFUS_QP_REQUIRE_IDENTICAL": ("tests/integration/test_qp.py", "tests: 1 requires Medusa "
                                   "plans identical to the autoregressive ones"),
    "RUFUS_BENCH_LOGS": ("lab/bench_openai.py, lab/bench.py", "benchmarks: log directory"),
}
