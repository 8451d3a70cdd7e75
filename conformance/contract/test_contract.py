"""The engine contract on one engine, named by ``--contract-engine`` (``tim-conformance
contract --engine mymod:MyEngine`` runs this module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.contract.checks import *  # noqa: F403
from conformance.contract.checks import Subject
from conformance.models import default_model
from conformance.options import parse_key_values


@pytest.fixture(scope="module")
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    config = request.config
    model = config.getoption("contract_model")
    options = parse_key_values(config.getoption("contract_engine_option"))
    started = Subject(
        config.getoption("contract_engine"),
        Path(model) if model else default_model(),
        options=options,
    )
    yield started
    started.close()
