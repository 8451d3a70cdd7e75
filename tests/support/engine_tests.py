"""What the engine tests share: the marks of an engine that needs a package, a started engine."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conformance.engines import ENGINES, Engine, EngineConfig


def needs(package: str) -> list[pytest.MarkDecorator]:
    """The package's marker (``-m vllm`` selects its tests) and a skip where it is missing."""
    missing = importlib.util.find_spec(package) is None
    reason = f"{package} is not installed (tox -e {package})"
    return [getattr(pytest.mark, package), pytest.mark.skipif(missing, reason=reason)]


@contextmanager
def started(name: str, model: Path, **config: Any) -> Iterator[Engine]:
    """The engine registered as ``name``, closed at the end of the block."""
    engine = ENGINES.get(name)(EngineConfig(model=model, **config))
    try:
        yield engine
    finally:
        engine.close()
