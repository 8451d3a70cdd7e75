"""One build of every arch, shared by the zoo tests (each build trains a tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.models import ARCHS, ModelStats, make_model


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelStats]:
    """arch → stats of a default-sized model of that arch, built once per session."""
    root = tmp_path_factory.mktemp("zoo")
    return {arch: make_model(root / arch, arch=arch) for arch in ARCHS}


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}
