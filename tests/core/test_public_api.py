"""docs/public-api.md and the code name the same public surface: every module the page lists
imports and declares ``__all__``, the page's names for it are exactly that ``__all__``, and every
name in it exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "public-api.md"


def _listed() -> dict[str, set[str]]:
    """Each ``### `module``` section of the page and the names on its ``Names:`` line(s)."""
    listed: dict[str, set[str]] = {}
    for section in re.split(r"^### ", PAGE.read_text(), flags=re.MULTILINE)[1:]:
        module = re.match(r"`(conformance[\w.]*)`", section)
        names = re.search(r"^Names: (.*?)(?:\n\n|\Z)", section, flags=re.MULTILINE | re.DOTALL)
        assert module and names, (
            f"public-api.md: section {section.splitlines()[0]!r} lacks a Names line"
        )
        listed[module.group(1)] = set(re.findall(r"`(\w+)`", names.group(1)))
    return listed


LISTED = _listed()


def test_the_page_lists_the_public_modules() -> None:
    assert {"conformance.engines.base", "conformance.strategies", "conformance.errors"} <= set(
        LISTED
    )


@pytest.mark.parametrize("module", sorted(LISTED))
def test_a_public_module_declares_exactly_the_names_the_page_lists(module: str) -> None:
    imported = importlib.import_module(module)
    declared = getattr(imported, "__all__", None)
    assert declared is not None, f"{module} has no __all__"
    assert len(declared) == len(set(declared)), f"{module}.__all__ repeats a name"
    assert set(declared) == LISTED[module]
    missing = [name for name in declared if not hasattr(imported, name)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"
