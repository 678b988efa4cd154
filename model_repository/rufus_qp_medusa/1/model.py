"""rufus_qp_medusa: thin Triton adapter; the behaviour lives in ``rufus.qp.model``."""

import os
import site
import sys

# The stub's embedded interpreter ignores PYTHONPATH: put those entries (our venv's
# site-packages and the project) first, ahead of the system site-packages.
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)

from rufus.qp.model import QueryPlannerModel  # noqa: E402


class TritonPythonModel(QueryPlannerModel):
    """Decoupled Python-backend query planner (see rufus/qp/model.py)."""
