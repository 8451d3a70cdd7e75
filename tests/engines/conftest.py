"""Fixtures the engine tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.backends.base import BackendConfig


@pytest.fixture(scope="module")
def hf(default_model: Path) -> Iterator[Any]:
    """The transformers fp32 forward every engine is measured against."""
    from conformance.backends.hf import HFBackend

    backend = HFBackend(BackendConfig(model=default_model))
    yield backend
    backend.close()
