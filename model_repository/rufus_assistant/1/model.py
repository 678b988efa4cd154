"""rufus_assistant: thin Triton adapter; the behaviour lives in ``rufus.assistant``."""

import os
import site
import sys

# The stub's embedded interpreter ignores PYTHONPATH: put those entries (our venv's
# site-packages and the project) first, ahead of the system site-packages.
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)

from rufus.assistant.triton_model import AssistantModel  # noqa: E402


class TritonPythonModel(AssistantModel):
    """Decoupled Python-backend shopping assistant (see rufus/assistant/triton_model.py)."""
