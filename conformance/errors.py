"""Errors a user can fix. Each renders as one line naming the problem and the fix."""

from __future__ import annotations


class ConformanceError(Exception):
    """Base of every user-facing error; ``str()`` is one line: problem, then the fix."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} (fix: {fix})" if fix else problem)


class UsageError(ConformanceError):
    """A bad argument or option value."""


class ModelError(ConformanceError):
    """The model folder is missing, unreadable, or inconsistent (e.g. tokenizer vs vocab)."""


class ProfileError(ConformanceError):
    """An unknown or malformed tolerance profile."""


class Unsupported(ConformanceError, NotImplementedError):
    """A capability an engine or backend declares it lacks: a precision or log-prob kind it
    refuses at start, or a call it cannot serve (``load_weights``, ``top_logprobs``). The
    harness skips what needs it, with this reason; at start it ends the run in one line."""


class EngineUnavailable(ConformanceError):
    """An engine or backend whose package is not installed, or a server that does not answer."""


class EngineCrashed(ConformanceError):
    """An engine died while measurements were being taken; what was measured is kept."""


class NonFiniteLogprobs(ConformanceError, ValueError):
    """NaN/inf log-probabilities at valid positions, or nothing valid to measure."""

    def __init__(self, problem: str, fix: str = "", *, count: int = 0) -> None:
        super().__init__(problem, fix)
        #: how many valid positions were NaN/inf (0: there was nothing valid at all)
        self.count = count


__all__ = [
    "ConformanceError",
    "EngineCrashed",
    "EngineUnavailable",
    "ModelError",
    "NonFiniteLogprobs",
    "ProfileError",
    "Unsupported",
    "UsageError",
]
