"""Running a module's docstring examples as a test."""

from __future__ import annotations

import doctest
from types import ModuleType


def run_doctests(module: ModuleType) -> None:
    """Run ``module``'s docstring examples; fail if any fails, or if none ran (a run of zero
    examples passes by counting nothing)."""
    result = doctest.testmod(module)
    assert result.attempted > 0, f"{module.__name__} has no docstring examples to run"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
