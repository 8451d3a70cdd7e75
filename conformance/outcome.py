"""How a conformance check ended, from the exception its test raised.

A violated property is a ``fail`` whatever form it reaches us in: one assertion, a group of
distinct failures Hypothesis raises together, or a failure that did not repeat when Hypothesis
ran the same case again (``Flaky``: the stack's result changed on a rerun, which is itself a
finding). Only a stack that crashed, or a harness error, leaves a check ``error``, which makes a
run ``incomplete`` rather than failed.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from conformance.errors import ConformanceError, EngineCrashed
from conformance.metric_table import Breach

#: how an error that is neither a violation nor the stack's own is named
FAULT = "harness/adapter fault"

#: first lines of further failures listed in one message
_MORE_SHOWN = 3


class Finding(AssertionError):
    """A violated property; ``breach`` names it as a metric, its value and the bound it broke,
    where it has one (the report's violation)."""

    def __init__(self, message: str, breach: Breach | None = None) -> None:
        super().__init__(message)
        self.breach = breach


class ProfileViolation(Finding):
    """A measurement outside the active profile's bounds."""


class PropertyFailure(Finding):
    """A property's own finding (processed logprobs, a rollout that differs on a rerun, a
    measurement below the rounding floor): more specific than a bound, so it leads a report.

    A distinct type, because Hypothesis tells failures apart by type and raising line: were
    it a plain profile violation, shrinking could slide from this finding to a bound broken
    by a smaller case and lose the diagnosis.
    """


@dataclass(frozen=True)
class Outcome:
    status: str
    #: one line for the terminal and the report
    message: str
    #: the failure whose case the report records (the first violation), if any
    primary: BaseException | None = None
    #: the stack crashed or hung: its traceback is the harness's, not the user's to read
    crashed: bool = False
    #: an exception raised in the harness's or an adapter's own code: the terminal shows one
    #: line and the log keeps the traceback
    fault: bool = False


def origin(exc: BaseException) -> tuple[str, str, int]:
    """Where an exception was raised: its type and innermost frame — the key Hypothesis uses to
    tell distinct failures apart (``InterestingOrigin``)."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    filename, lineno = (frames[-1].filename, frames[-1].lineno or 0) if frames else ("", 0)
    return type(exc).__name__, filename, lineno


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order; ``[exc]`` for a plain one."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def classify(exc: BaseException) -> Outcome:
    """The outcome of a check whose test raised ``exc``."""
    from hypothesis.errors import Flaky

    found = leaves(exc)
    violations = sorted(
        (e for e in found if isinstance(e, AssertionError)),
        key=lambda e: not isinstance(e, PropertyFailure),
    )
    crashed = any(isinstance(e, EngineCrashed) for e in found)
    flaky = isinstance(exc, Flaky)
    if violations:
        primary = violations[0]
        message = first_line(primary)
        # a replay that crashed says nothing about determinism
        if flaky and not crashed:
            message = f"non-deterministic: {message} — and not when the same case ran again"
        others = [e for e in found if e is not primary]
        if others:
            shown = "; ".join(f"{type(e).__name__}: {first_line(e)}" for e in others[:_MORE_SHOWN])
            more = f" (+{len(others) - _MORE_SHOWN} more)" if len(others) > _MORE_SHOWN else ""
            message += f" [and {len(others)} other failure(s): {shown}{more}]"
        return Outcome("fail", message, primary)
    if flaky and not crashed:
        inner = found[0]
        return Outcome(
            "fail",
            f"non-deterministic: the same case raised {type(inner).__name__} "
            f"({first_line(inner)}) once and not when it ran again",
            inner,
        )
    inner = found[0]
    message = f"{type(inner).__name__}: {first_line(inner)}"
    if crashed or isinstance(inner, ConformanceError):
        # the stack crashed or refused, and said why in one line
        return Outcome("error", message, crashed=True)
    return Outcome("error", f"{FAULT}: {message}", fault=True)
