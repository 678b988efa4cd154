"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import llama_with_heads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model folder, Medusa heads folder) of a tiny random Llama with three heads
    (:func:`tests.tiny_models.llama_with_heads`), built once per test module: the planner's
    shape for the torch decoder and int8 tests. A module that needs another checkpoint
    defines its own ``tiny``."""
    return llama_with_heads(tmp_path_factory.mktemp("tiny"))
