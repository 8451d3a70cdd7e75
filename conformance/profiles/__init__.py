"""Tolerance profiles: one threshold per mismatch metric, shipped as TOML in this package.

A profile file is a flat table ``metric = threshold`` (plus an optional ``description``).
Metric names, and which side of a threshold is a violation, come from
:mod:`conformance.metric_table`.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.errors import ProfileError
from conformance.metric_table import METRIC_NAMES, Bound, metric

_HERE = Path(__file__).parent
_META_KEYS = frozenset({"description"})


@dataclass
class Violation:
    """One metric on the wrong side of its threshold."""

    metric: str
    value: float
    threshold: float
    bound: Bound

    def __str__(self) -> str:
        return f"{self.metric} = {metric(self.metric).relation(self.value, self.threshold)}"


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    thresholds: dict[str, float]
    description: str = ""

    def check(self, metrics: Mapping[str, float]) -> list[Violation]:
        """Violations among the metrics both measured and bounded; NaN always violates."""
        violations = []
        for name, threshold in self.thresholds.items():
            if name not in metrics:
                continue
            fact, value = metric(name), float(metrics[name])
            if fact.violates(value, threshold):
                violations.append(Violation(name, value, threshold, fact.bound))
        return violations


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in _HERE.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``exact``, ``fp32``, ``bf16``, ``fp16``) or a TOML file path.

    Raises:
        ProfileError: unknown name, missing or malformed file, unknown metric, bad threshold.
    """
    path = _resolve(name_or_path)
    try:
        table = tomllib.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ProfileError(
            f"profile file {path} not found", "pass an existing .toml file or a profile name"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}", "pass a readable file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            f"profile {path} is not valid TOML ({exc})", "fix the syntax: lines of metric = number"
        ) from None
    description = table.pop("description", "")
    unknown = sorted(set(table) - set(METRIC_NAMES) - _META_KEYS)
    if unknown:
        raise ProfileError(
            f"profile {path} names unknown metric(s) {', '.join(unknown)}",
            f"use metric names from: {', '.join(METRIC_NAMES)}",
        )
    thresholds = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ProfileError(
                f"profile {path}: {name} = {value!r} is not a number",
                f"write a number, e.g. {name} = 1e-5",
            )
        thresholds[name] = float(value)
    return Profile(name=path.stem, source=path, thresholds=thresholds, description=description)


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        return Path(name_or_path)
    shipped = _HERE / f"{text}.toml"
    if not shipped.is_file():
        raise ProfileError(
            f"unknown profile {text!r}",
            f"use one of {', '.join(available_profiles())} or a path to a .toml file",
        )
    return shipped
