"""rufus_llm: thin Triton adapter; the behaviour lives in the shared ``rufus`` package."""

import os
import site
import sys

# The stub's embedded interpreter ignores PYTHONPATH: put those entries (our venv's
# site-packages and the project) first, ahead of the system site-packages.
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _p)
    site.addsitedir(_p)

from rufus.serving.llm import LLMModel  # noqa: E402


class TritonPythonModel(LLMModel):
    """Decoupled Python-backend model wrapping vLLM's async engine (see rufus/serving/llm.py)."""
