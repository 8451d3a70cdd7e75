"""Engine and backend options as ``--engine-option``/``--backend-option KEY=VALUE`` give them
(strings), parsed and checked: one parser in the core that every adapter uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from conformance.errors import UsageError


def parse_bool(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("expected an integer >= 1")
    return number


def parse_engine_options(
    engine: str,
    options: Mapping[str, Any],
    parsers: Mapping[str, Callable[[str], Any]],
    defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """``defaults`` updated with each option parsed by its parser; an unknown key or a bad
    value is a one-line ``UsageError`` listing the valid keys."""
    unknown = sorted(set(options) - set(parsers))
    if unknown:
        raise UsageError(
            f"unknown {engine} option(s) {unknown}", f"valid options: {', '.join(sorted(parsers))}"
        )
    parsed = dict(defaults)
    for key, value in options.items():
        try:
            parsed[key] = parsers[key](value)
        except ValueError as exc:
            raise UsageError(
                f"{engine} option {key}={value!r} is invalid ({exc})", f"give {key} a valid value"
            ) from None
    return parsed
