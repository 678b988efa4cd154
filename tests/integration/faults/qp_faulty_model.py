"""rufus_qp_medusa whose decoder crashes once: tests/integration/test_recovery.py only.

The recovery test copies this file in as ``1/model.py`` of a temporary copy of
model_repository/rufus_qp_medusa/ (so it runs inside tritonserver's Python stub, where a
monkeypatch cannot reach). It is the shipped planner model except that every engine its
factory builds shares one count of the requests decoded in this process, and the forward
pass of client request ``FAULT_AT`` fails, once, as a crash of the decoder would: the engine
then reports itself dead (``errored``) and the model replaces it in place with a new engine
from the same factory, whose requests keep counting (so the fault never repeats). The
model's own warm-up requests (served before it reports ready, and again by the new engine
before it does) are not counted.
"""

import os
import site
import sys
from dataclasses import replace

# As in the shipped model.py: the stub's embedded interpreter ignores PYTHONPATH.
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)

from rufus.qp.model import QueryPlannerModel  # noqa: E402
from rufus.serving.engine import EngineSpec  # noqa: E402

FAULT_AT = 2  # the request, counted over every engine of this process, whose pass fails


def crash_on_request(decoder, started: list[int], counting, n: int = FAULT_AT) -> None:
    """Make ``decoder``'s forward pass fail for the ``n``-th sequence started while
    ``counting()`` is true (``started``: the count so far, shared by the engines of this
    process)."""
    start, step = decoder.start, decoder.step
    doomed: list[object] = []

    def counted_start(*args, **kwargs):
        run = start(*args, **kwargs)
        if counting():
            started[0] += 1
            if started[0] == n:
                doomed.append(run)
        return run

    def failing_step(runs):
        if any(r is d for r in runs for d in doomed):
            doomed.clear()
            raise RuntimeError(f"injected decoder fault: forward pass of request {n} "
                               "(tests/integration/faults/qp_faulty_model.py)")
        return step(runs)

    decoder.start = counted_start
    decoder.step = failing_step


class TritonPythonModel(QueryPlannerModel):
    """The planner, its engines built by a factory that arms the fault."""

    def engine_spec(self, spec: EngineSpec) -> EngineSpec:
        spec = super().engine_spec(spec)
        build = spec.factory
        if build is None:
            raise RuntimeError("the fault needs the torch planner engine (qp_backend "
                               "torch_medusa): no engine factory was set")
        started = [0]

        def faulty_engine(args):
            engine = build(args)
            # client requests only: the host is READY once its warm-up is done
            crash_on_request(engine.decoder, started, lambda: self.host.state == "ready")
            return engine

        return replace(spec, factory=faulty_engine)
