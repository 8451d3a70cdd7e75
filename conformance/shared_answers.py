"""The engine's answers, shared between the checks that make the same request of it.

Properties drawn from the same strategies under one seed draw the same cases: seeded-sampling
determinism and rollout parity sample identical batches; batch invariance, scoring determinism
and prefill parity score identical ones. Where a property needs *an* answer of the engine to its
request, not a fresh one (determinism's rerun must be fresh), it asks through
:class:`SharedAnswers`, which hands it the answer an earlier check got for exactly that request:
the engine does that work once per run. That answer is the engine's by the contract: a seeded
request repeats (``SamplingSpec``), and scoring is one forward.

Each check is served a kept answer once; asking again (Hypothesis replaying a failing case) goes
to the engine, so a replay sees what the stack does now. Once the engine has taken new weights
nothing is shared: the answers kept were the old model's.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from conformance.engines import Completion, SamplingSpec

if TYPE_CHECKING:
    from conformance.engines import Engine
    from conformance.guard import Guarded


@dataclass
class _Kept:
    #: the engine's answer (``generate``'s completions, ``score``'s rows)
    answer: object
    #: the check whose request the engine answered
    asked_by: str
    #: the checks this answer went to, ``asked_by`` among them
    served: set[str] = field(default_factory=set)


def request_key(method: str, args: tuple[object, ...]) -> str:
    """A digest of an engine request: the method and its arguments (token ids, the spec)."""
    method_and_args = (method, *(_plain(a) for a in args))
    return hashlib.blake2b(repr(method_and_args).encode(), digest_size=16).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_plain(v) for v in value)
    return value


class SharedAnswers:
    """``generate`` and ``score`` of ``engine`` (a guarded engine), answered from what an
    earlier check asked where it asked the same; ``current_check`` names the running check (None
    outside one), ``log`` records each answer shared (a ``shared_answer`` event)."""

    def __init__(
        self,
        engine: Guarded[Engine],
        *,
        current_check: Callable[[], str | None],
        log: Callable[..., None],
    ) -> None:
        self._engine = engine
        self._current_check = current_check
        self._log = log
        self._kept: dict[str, _Kept] = {}

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Completion]:
        return cast("list[Completion]", self._ask("generate", (prompts, spec)))

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return cast("list[list[float]]", self._ask("score", (sequences,)))

    def _ask(self, method: str, args: tuple[object, ...]) -> object:
        check = self._current_check()
        if check is None or self._engine.weights_changed:
            self._kept.clear()
            return getattr(self._engine, method)(*args)
        key = request_key(method, args)
        kept = self._kept.get(key)
        if kept is not None and check not in kept.served:
            kept.served.add(check)
            self._log(event="shared_answer", nodeid=check, method=method, asked_by=kept.asked_by)
            # a check may reshape what it gets; the next one gets the engine's answer
            return copy.deepcopy(kept.answer)
        answer = getattr(self._engine, method)(*args)
        self._kept[key] = _Kept(copy.deepcopy(answer), asked_by=check, served={check})
        return answer


__all__ = [
    "SharedAnswers",
]
