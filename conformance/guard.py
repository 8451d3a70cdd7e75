"""One wrapper around every component of the stack under test — engines and backends alike.

Each call through :class:`Guarded` is timed, held to a deadline, and watched: the first
unexpected failure (an exception, or a call that does not return in time) marks the component
dead exactly once and tells the session, which keeps what was measured, skips what is left and
ends ``incomplete`` with the reason. Calls on a closed or dead component fail fast.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from conformance.errors import EngineCrashed, UsageError

#: attributes that are answered by the component itself, never guarded or timed
_UNGUARDED = frozenset({"info", "artefacts", "knobs", "close", "name", "config", "options"})


class CallTimedOut(Exception):
    """A guarded call did not return within its deadline."""


class ProtocolViolation(AssertionError):
    """A component answered, but not in the shape its protocol promises (a result per input,
    one log-prob per token): a conformance failure, not a crash."""


def check_answer(
    label: str, method: str, args: tuple[Any, ...], result: Any, eos_token_id: int | None = None
) -> None:
    """Raise :class:`ProtocolViolation` when an Engine or Backend call's result does not line
    up with its inputs (``Engine.generate``/``score``, ``Backend.recompute``); a rollout must
    end as its ``finish_reason`` says (``eos_token_id``: the model's EOS)."""
    if method == "generate":
        prompts, n = args[0], (args[1].n if len(args) > 1 else 1)
        if len(result) != len(prompts) * n:
            raise ProtocolViolation(
                f"{label} generate() returned {len(result)} completions for {len(prompts)} prompts"
                + (f" x n={n} samples" if n > 1 else "")
            )
        for row, completion in enumerate(result):
            if len(completion.logprobs) != len(completion.tokens):
                raise ProtocolViolation(
                    f"{label} generate() gave completion {row} {len(completion.tokens)} tokens "
                    f"but {len(completion.logprobs)} log-probs"
                )
            problem = len(args) > 1 and _ending_problem(completion, args[1], eos_token_id)
            if problem:
                raise ProtocolViolation(f"{label} generate() gave completion {row} {problem}")
    elif method in ("score", "recompute"):
        sequences = args[0]
        rows = result.logprobs if method == "recompute" else result
        lengths = [len(r) for r in rows]
        wanted = [len(s) - 1 for s in sequences]
        if lengths != wanted:
            raise ProtocolViolation(
                f"{label} {method}() returned rows of {lengths[:8]} log-probs for sequences "
                f"needing {wanted[:8]}"
            )


def _ending_problem(completion: Any, spec: Any, eos_token_id: int | None) -> str:
    """How a completion's end contradicts its ``finish_reason`` and the spec, or ``""``.

    ``"length"`` means ``max_new_tokens`` tokens; ``"stop"`` a rollout whose last token is a
    stop id (or, with stop strings, whose text the engine matched: the stop-string check holds
    that); no rollout runs on past a stop id or the length.
    """
    tokens, reason = completion.tokens, completion.finish_reason
    stops = spec.stops_at(eos_token_id)
    early = [t for t in tokens[:-1] if t in stops]
    if len(tokens) > spec.max_new_tokens or early:
        return f"{len(tokens)} tokens running on past " + (
            f"stop id {early[0]}" if early else f"max_new_tokens={spec.max_new_tokens}"
        )
    if reason == "length" and len(tokens) != spec.max_new_tokens:
        return (
            f"{len(tokens)} tokens, finish_reason 'length' and max_new_tokens={spec.max_new_tokens}"
        )
    if reason == "stop" and not spec.stop and not (tokens and tokens[-1] in stops):
        return (
            f"finish_reason 'stop' but its last token {tokens[-1:]} is no stop id "
            f"{sorted(stops)} (the stop token dropped?)"
        )
    if reason not in ("stop", "length"):
        return f"finish_reason {reason!r} (expected 'stop' or 'length')"
    return ""


@contextmanager
def deadline(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`CallTimedOut` in this thread if the block runs longer than ``seconds``.

    A SIGALRM interrupts the blocking system calls an engine hangs in (a lock, a socket, a
    pipe to a worker), which a watchdog thread could not. Signals reach only the main thread,
    so elsewhere (and for ``None``) the block runs unbounded.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CallTimedOut(f"{what} did not return within {seconds:g} s (hung)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Guarded:
    """Delegates to ``inner`` (an Engine or a Backend); its methods are guarded calls.

    ``kind`` (``"engine"``/``"backend"``) names the component in messages and picks the timing
    key (``timing[kind + "_s"]`` accumulates the seconds spent inside its calls).
    """

    def __init__(
        self,
        inner: Any,
        *,
        kind: str,
        on_crash: Callable[[str], None],
        timing: dict[str, float],
        deadline_s: float | None,
        eos_token_id: int | None = None,
        audit: Callable[[Guarded, str, tuple[Any, ...], Any], None] | None = None,
    ) -> None:
        self.inner = inner
        #: called with (this, method, args, result) after each answer passes ``check_answer``:
        #: a property the session holds on every call (the support of sampled tokens)
        self._audit = audit
        #: whether the component took new weights (``load_weights``, ``update``): it no longer
        #: holds the model the stack was started from
        self.weights_changed = False
        #: the model's EOS, which ends a rollout not ignoring it (see ``check_answer``)
        self._eos_token_id = eos_token_id
        self.kind = kind
        self._label = f"{kind} {inner.name!r}"
        self._on_crash = on_crash
        self._timing = timing
        self._deadline_s = deadline_s
        self._dead: str | None = None
        self._closed = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in _UNGUARDED or name.startswith("_") or not callable(value):
            return value
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    @property
    def dead(self) -> str | None:
        """Why the component died, or ``None`` while it works."""
        return self._dead

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._dead is not None:
            raise EngineCrashed(f"{self._label} is dead: {self._dead}")
        if self._closed:
            raise EngineCrashed(f"{self._label} was closed", "start a new one")
        started = time.perf_counter()
        try:
            with deadline(self._deadline_s, f"{self._label} {method}()"):
                result = getattr(self.inner, method)(*args, **kwargs)
        except (UsageError, NotImplementedError):
            # a request the component refuses, or a feature it lacks: it still works
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._dead = (
                first
                if isinstance(exc, CallTimedOut)
                else f"{self._label} died in {method}(): {type(exc).__name__}: {first}"
            )
            self._on_crash(self._dead)
            raise EngineCrashed(
                self._dead,
                "what was measured is kept in results.jsonl; check the component's log and rerun",
            ) from exc
        finally:
            self._timing[f"{self.kind}_s"] += time.perf_counter() - started
        if method in ("load_weights", "update"):
            self.weights_changed = True
        given = (*args, kwargs["spec"]) if "spec" in kwargs else args
        check_answer(self._label, method, given, result, self._eos_token_id)
        if self._audit is not None:
            self._audit(self, method, given, result)
        return result

    def close(self) -> None:
        """Close the component once; a dead one gets a bounded attempt (it may hang again).
        Closing (freeing a KV cache, stopping a server) is the component's time, not ours."""
        if self._closed:
            return
        self._closed = True
        started = time.perf_counter()
        try:
            with deadline(self._deadline_s if self._dead else None, f"closing {self._label}"):
                self.inner.close()
        except CallTimedOut:
            self._on_crash(f"{self._dead}; closing it hung too")
        finally:
            self._timing[f"{self.kind}_s"] += time.perf_counter() - started
