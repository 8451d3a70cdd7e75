"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# the harness's own property tests are never failed for being slow on a loaded machine: timing
# belongs in benchmarks (Hypothesis's "ci" profile, which CI loads, is kept as the parent)
settings.register_profile("harness-tests", parent=settings(), deadline=None)
settings.load_profile("harness-tests")


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


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (two spin-wait against each other on a loaded 2-core
    machine), restored afterwards so later tests get the process's own setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
