"""One wrapper around every component of the stack under test — engines and backends alike.

Each call through :class:`Guarded` is timed, held to a deadline, and watched: the first
unexpected failure (an exception, or a call that does not return in time) marks the component
dead exactly once and tells the session, which keeps what was measured, skips what is left and
ends ``incomplete`` with the reason. Calls on a closed or dead component fail fast.

:func:`start` is the one way a component is started (through the registry, within its start
deadline, a failure turned into one :class:`~conformance.errors.EngineUnavailable` line), and
:func:`started` the one way a stack is: the session, the RL loop and calibration all use them.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, cast

from conformance.backends import BACKENDS
from conformance.engines import ENGINES
from conformance.errors import ConformanceError, EngineCrashed, EngineUnavailable, UsageError
from conformance.metric_table import breach
from conformance.outcome import first_line

if TYPE_CHECKING:
    from conformance.backends.base import Backend, BackendConfig, Recompute
    from conformance.engines.base import Completion, Engine, EngineConfig, Request, SamplingSpec

    #: what ``audit`` hears after each guarded call: the component, the method, the call's
    #: arguments (``check_answer``'s) and its answer
    Audit = Callable[["Guarded", str, tuple[object, ...], object], None]

#: the component a :class:`Guarded` wraps: an Engine or a Backend
_Component = TypeVar("_Component", bound="Engine | Backend")

#: attributes that are answered by the component itself, never guarded or timed
_UNGUARDED = frozenset({"info", "artefacts", "knobs", "close", "name", "config", "options"})


class CallTimedOut(Exception):
    """A guarded call did not return within its deadline."""


class ProtocolViolation(AssertionError):
    """A component answered, but not in the shape its protocol promises (a result per input,
    one log-prob per token): a conformance failure, not a crash, named as the metric
    ``malformed_answers``."""

    def __init__(self, message: str) -> None:
        self.breach = breach("malformed_answers", 1, 0)
        super().__init__(f"{message} [{self.breach}]")


def check_answer(
    label: str,
    method: str,
    args: tuple[object, ...],
    result: object,
    eos_token_id: int | None = None,
) -> None:
    """Raise :class:`ProtocolViolation` when an Engine or Backend call's result does not line
    up with its inputs (``Engine.generate``/``generate_requests``/``score``,
    ``Backend.recompute``); a rollout must end as its ``finish_reason`` says (``eos_token_id``:
    the model's EOS), a request's under its own spec. ``args`` and ``result`` are the call's
    as the protocol types them for ``method`` (a result is what this checks the shape of)."""
    if method == "generate":
        prompts = cast("Sequence[Sequence[int]]", args[0])
        spec = cast("SamplingSpec", args[1]) if len(args) > 1 else None
        n = spec.n if spec is not None else 1
        result = cast("Sequence[Completion]", result)
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
            problem = spec is not None and _ending_problem(completion, spec, eos_token_id)
            if problem:
                raise ProtocolViolation(f"{label} generate() gave completion {row} {problem}")
    elif method == "generate_requests":
        requests = cast("Sequence[Request]", args[0])
        result = cast("Sequence[Completion]", result)
        if len(result) != len(requests):
            raise ProtocolViolation(
                f"{label} generate_requests() returned {len(result)} completions for "
                f"{len(requests)} requests"
            )
        for row, (request, completion) in enumerate(zip(requests, result, strict=True)):
            problem = _request_problem(request, completion) or _ending_problem(
                completion, request.spec, eos_token_id
            )
            if problem:
                raise ProtocolViolation(
                    f"{label} generate_requests() gave request {row}'s completion {problem}"
                )
    elif method in ("score", "recompute"):
        sequences = cast("Sequence[Sequence[int]]", args[0])
        rows = (
            cast("Recompute", result).logprobs
            if method == "recompute"
            else cast("Sequence[Sequence[float]]", result)
        )
        lengths = [len(r) for r in rows]
        wanted = [len(s) - 1 for s in sequences]
        if lengths != wanted:
            raise ProtocolViolation(
                f"{label} {method}() returned rows of {lengths[:8]} log-probs for sequences "
                f"needing {wanted[:8]}"
            )


def _request_problem(request: Request, completion: Completion) -> str:
    """How a completion does not answer its request (``Engine.generate_requests``), or ``""``:
    its prompt echoed, a log-prob per token, top log-probs per token exactly where asked."""
    if list(completion.prompt) != list(request.prompt):
        return f"another prompt (of {len(completion.prompt)} tokens, not {len(request.prompt)})"
    if len(completion.logprobs) != len(completion.tokens):
        return f"{len(completion.tokens)} tokens but {len(completion.logprobs)} log-probs"
    top = completion.top_logprobs
    if not request.top_logprobs:
        return "" if top is None else "top log-probs it did not ask for"
    if top is None or len(top) != len(completion.tokens):
        return (
            f"{'no' if top is None else len(top)} top log-prob entries for "
            f"{len(completion.tokens)} tokens (top_logprobs={request.top_logprobs} asked)"
        )
    return ""


def _ending_problem(completion: Completion, spec: SamplingSpec, eos_token_id: int | None) -> str:
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


class Terminated(KeyboardInterrupt):
    """SIGTERM (what CI sends on a timeout), handled as Ctrl-C is: pytest ends its session and
    the plugin still writes the report; certify reports a run cut short before its suites."""


#: SIGTERMs that landed where Python drops an exception (a garbage-collector callback, such as
#: Hypothesis's, or a ``__del__``), raised by the next guarded call instead
_deferred: list[str] = []


def _exceptions_dropped_in(frame: FrameType | None) -> bool:
    """Whether an exception raised in ``frame`` would be printed and dropped, not propagated:
    the frame runs inside a ``gc.callbacks`` function or a finalizer."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def raise_deferred_interrupt() -> None:
    """Raise the :class:`Terminated` a SIGTERM could not raise where it landed, once."""
    if _deferred:
        raise Terminated(_deferred.pop())


@contextmanager
def sigterm_as_interrupt(on_term: Callable[[], None] | None = None) -> Iterator[list[str]]:
    """Inside the block SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) after
    ``on_term()``; the handler before it is back when the block ends. Yields the SIGTERMs
    taken (an interrupt that lands as pytest starts is swallowed before a plugin can report
    it). A SIGTERM landing where Python would drop the exception is raised by the next
    guarded call (:func:`raise_deferred_interrupt`). Signals reach only the main thread:
    elsewhere nothing is installed."""
    taken: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield taken
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        taken.append("SIGTERM")
        if on_term is not None:
            on_term()
        if _exceptions_dropped_in(frame):
            _deferred.append("SIGTERM")
            return
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield taken
    finally:
        signal.signal(signal.SIGTERM, previous)
        _deferred.clear()


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

    def expire(signum: int, frame: FrameType | None) -> None:
        raise CallTimedOut(f"{what} did not return within {seconds:g} s (hung)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Guarded(Generic[_Component]):
    """Delegates to ``inner`` (an Engine or a Backend); its methods are guarded calls.

    ``kind`` (``"engine"``/``"backend"``) names the component in messages and picks the timing
    key (``timing[kind + "_s"]`` accumulates the seconds spent inside its calls).
    """

    def __init__(
        self,
        inner: _Component,
        *,
        kind: str,
        on_crash: Callable[[str], None],
        timing: dict[str, float],
        deadline_s: float | None,
        eos_token_id: int | None = None,
        audit: Audit | None = None,
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
        # the inner component's attribute, whatever it is; a method comes back guarded
        value = getattr(self.inner, name)
        if name in _UNGUARDED or name.startswith("_") or not callable(value):
            return value
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    @property
    def dead(self) -> str | None:
        """Why the component died, or ``None`` while it works."""
        return self._dead

    def _call(self, method: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        raise_deferred_interrupt()
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
        # the arguments the answer is checked against, as given by position or name
        given = (*args, *(kwargs[name] for name in ("requests", "spec") if name in kwargs))
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


def start(
    kind: str,
    name: str,
    config: EngineConfig | BackendConfig,
    *,
    start_timeout: float | None = None,
    call_timeout: float | None = None,
    on_crash: Callable[..., None] | None = None,
    timing: dict[str, float] | None = None,
    eos_token_id: int | None = None,
    audit: Audit | None = None,
) -> Guarded:
    """Start the ``kind`` (``"engine"``/``"backend"``) registered as ``name`` on ``config``,
    within ``start_timeout`` seconds, and return it :class:`Guarded` (each call held to
    ``call_timeout``). The start's seconds are booked to ``timing[kind + "_start_s"]``.

    A component that fails to start raises :class:`EngineUnavailable`: one line naming the
    component and its own reason and fix (a :class:`ConformanceError`), else its exception's
    first line; ``on_crash(line, fix=..., exc=...)`` hears of it first (the session logs the
    traceback there). ``audit`` hears of each call's arguments and answer (``Guarded``).
    """
    component_cls = (ENGINES if kind == "engine" else BACKENDS).get(name)
    timing = timing if timing is not None else defaultdict(float)
    began = time.perf_counter()
    try:
        with deadline(start_timeout, f"starting {kind} {name!r}"):
            inner = component_cls(config)
    except Exception as exc:
        component = f"{kind} {name!r} ({component_cls.__module__}.{component_cls.__qualname__})"
        if isinstance(exc, ConformanceError):
            verb, problem = "refused to start", exc.problem
        else:
            verb, problem = "failed to start", f"{type(exc).__name__}: {first_line(exc)}"
        where = 'in results.jsonl (event "crash")' if on_crash is not None else "above"
        fix = getattr(exc, "fix", "") or f"make the {kind} start; its traceback is {where}"
        if on_crash is not None:
            on_crash(f"{component} {verb}: {problem}", fix=fix, exc=exc)
        raise EngineUnavailable(f"{component} {verb}: {problem}", fix) from exc
    finally:
        timing[f"{kind}_start_s"] += time.perf_counter() - began
    return Guarded(
        inner,
        kind=kind,
        on_crash=on_crash or (lambda reason, **_: None),
        timing=timing,
        deadline_s=call_timeout,
        eos_token_id=eos_token_id,
        audit=audit,
    )


class _Guarding(TypedDict, total=False):
    """:func:`start`'s keyword arguments that :func:`started` passes on (``timing`` aside)."""

    start_timeout: float | None
    call_timeout: float | None
    on_crash: Callable[..., None] | None
    eos_token_id: int | None
    audit: Audit | None


@contextmanager
def started(
    engine: str,
    engine_config: EngineConfig,
    backend: str,
    backend_config: BackendConfig,
    *,
    timing: dict[str, float] | None = None,
    **guarding: Unpack[_Guarding],
) -> Iterator[tuple[Guarded[Engine], Guarded[Backend]]]:
    """The engine and backend registered as ``engine`` and ``backend``, started by
    :func:`start` (``guarding``: its keyword arguments) and closed when the block ends, both
    of them whatever fails: the one place a stack is started and stopped as a pair."""
    timing = timing if timing is not None else defaultdict(float)
    engine_ = start("engine", engine, engine_config, timing=timing, **guarding)
    try:
        backend_ = start("backend", backend, backend_config, timing=timing, **guarding)
        try:
            yield engine_, backend_
        finally:
            backend_.close()
    finally:
        engine_.close()
