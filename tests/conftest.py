"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def default_model() -> Path:
    from conformance.models import default_model

    return default_model()


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running ``tim-conformance`` as a subprocess from the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env
