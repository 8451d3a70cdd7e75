"""The suites run under a tim-conformance session even when no ``--tim-*`` flag is given."""

import pytest

from conformance.plugin import activate


def pytest_configure(config: pytest.Config) -> None:
    activate(config)
