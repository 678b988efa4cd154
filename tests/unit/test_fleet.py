"""The local fleet's start-up (rufus/launch/fleet.py) without engines: a unit that cannot
start ends the wait with a diagnosis instead of a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rufus.launch.fleet import Fleet, FleetPorts, FleetUnit
from rufus.launch.rig import LocalUnit, Supervisor


class NeverStarts(LocalUnit):
    """A unit whose leader exits during every start (as one whose port is taken would)."""

    def start(self) -> LocalUnit:
        self.generation += 1
        return self

    def wait_ready(self, timeout: float = 900.0) -> float:
        raise RuntimeError("unit failed to start: leader exited with 1")

    def stop(self) -> None:
        pass


def test_a_unit_that_never_starts_ends_the_wait_with_a_diagnosis(tmp_path: Path):
    unit = NeverStarts(log_dir=tmp_path / "unit0")
    (unit.log_dir / "rig-leader.log").write_text("E tritonserver: failed to bind the port\n")
    fu = FleetUnit(0, unit, Supervisor(unit, drain_s=0.1), FleetPorts.free())
    f = Fleet(n_units=1, log_dir=tmp_path, units=[fu])
    fu.sup.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as exc:
            f.wait_ready(timeout=60, progress_s=0, max_failed_starts=2)
    finally:
        fu.sup.stop()
    assert time.monotonic() - t0 < 30, "it must not wait out the timeout"
    text = str(exc.value)
    assert "unit0 does not start (2 failed starts in a row)" in text
    assert "leader exited with 1" in text  # the supervisor's reason
    assert f"grpc {unit.grpc_port} free" in text  # the unit's ports, and who holds them
    assert "failed to bind the port" in text  # the leader's log tail
    assert "busiest processes:" in text
