"""rufus_llm: thin Triton adapter; the behaviour lives in the shared ``rufus`` package."""

from rufus.llm import LLMModel


class TritonPythonModel(LLMModel):
    """Decoupled Python-backend model wrapping vLLM's async engine (see rufus/llm.py)."""
