"""Options of the contract module when it runs as a tool (``tim-conformance contract``)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("engine contract")
    group.addoption("--contract-engine", default="hf-generate", help="engine or module:Class")
    group.addoption("--contract-model", default=None, help="model folder (default: embedded)")
    group.addoption(
        "--contract-engine-option", action="append", default=[], help="KEY=VALUE, repeatable"
    )
