"""The suites run under a tim-conformance session even when no ``--tim-*`` flag is given."""

import pytest

from conformance.plugin import activate


@pytest.hookimpl(trylast=True)  # after Hypothesis has applied --hypothesis-seed / -profile
def pytest_configure(config: pytest.Config) -> None:
    activate(config)
