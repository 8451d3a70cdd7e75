"""The stack of one run, started lazily and once: the engine and backend, their variants, the
engine's answers shared between checks, each guarded and timed; a crash remembered; all closed
together.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.errors import EngineCrashed
from conformance.fingerprint import fingerprint
from conformance.guard import Guarded, start
from conformance.models import inspect_model
from conformance.report.schema import Stack
from conformance.shared_answers import SharedAnswers
from conformance.stack import StackSpec

if TYPE_CHECKING:
    from conformance.backends import Backend
    from conformance.engines import Engine
    from conformance.models import ModelInfo

#: hears of each engine call's arguments and answer (``Guarded``'s ``audit``)
Audit = Callable[[Guarded, str, tuple[Any, ...], Any], None]

#: ``info()`` keys that carry the release of the package an engine runs on
RELEASE_KEYS = ("version", "vllm", "sglang", "transformers")


def _unlogged(**event: object) -> None:
    """What a stack no run reports on does with its events: nothing."""


def _no_check() -> None:
    return None


class StartedStack:
    """The engine and backend of ``spec``, each started on first use, through
    :func:`conformance.guard.start`; ``log`` hears of starts, crashes and failures to close,
    ``current_check`` names the check that is running (for the log), and ``audit`` hears of
    each call of an engine on the model's own weights. With none of them, a stack outside any
    run: nothing logged, no check running."""

    def __init__(
        self,
        spec: StackSpec,
        *,
        log: Callable[..., None] = _unlogged,
        current_check: Callable[[], str | None] = _no_check,
        audit: Audit | None = None,
    ) -> None:
        self.spec = spec
        self._log = log
        self._current_check = current_check
        self._audit = audit
        #: engines and backends started so far, by their option changes (``()``: the stack's own)
        self._engines: dict[tuple[Any, ...], Guarded] = {}
        self._backends: dict[tuple[Any, ...], Guarded] = {}
        #: the stack's own engine's and backend's ``info()``, kept past their closing
        self._infos: dict[str, dict[str, Any]] = {}
        self._shared: SharedAnswers | None = None
        self._model_info: ModelInfo | None = None
        self._crash: str | None = None
        self._crash_fix: str | None = None
        #: seconds spent starting engines and backends and inside their calls (the guard books
        #: them); everything else in a run's wall time is the harness's own overhead
        self.timing = dict.fromkeys(
            ("engine_start_s", "engine_s", "backend_start_s", "backend_s"), 0.0
        )

    @property
    def model_info(self) -> ModelInfo:
        if self._model_info is None:
            self._model_info = inspect_model(self.spec.model_dir())
        return self._model_info

    @property
    def crash(self) -> str | None:
        """Why the stack crashed (or hung), if it did: nothing starts after it."""
        return self._crash

    @property
    def crash_fix(self) -> str | None:
        """What the user can do about the crash, when the component that crashed said."""
        return self._crash_fix

    @property
    def engine(self) -> Engine:
        """The engine under test, started on first use."""
        return self.engine_variant()

    @property
    def backend(self) -> Backend:
        return self.backend_variant()

    @property
    def shared_engine(self) -> SharedAnswers:
        """The engine under test, answering a request the running check makes with the answer
        an earlier check got for the same request (``conformance.shared_answers``)."""
        if self._shared is None:
            self._shared = SharedAnswers(
                self.engine, current_check=self._current_check, log=self._log
            )
        return self._shared

    def engine_variant(self, **option_changes: str) -> Engine:
        """The engine under test started with ``option_changes`` on top of its own options
        (strings, as ``--engine-option`` gives them), guarded and timed like it.

        Each distinct variant starts once. Variants hold memory (a KV cache each), so starting
        one closes the variant before it; the stack's own engine stays.
        """
        key = tuple(sorted(option_changes.items()))
        if key not in self._engines:
            for old in [k for k in self._engines if k]:
                self._engines.pop(old).close()
            config = self.spec.engine_config(self.model_info.path, **option_changes)
            self._engines[key] = self._start("engine", config, key)
        return self._engines[key]

    def backend_variant(self, **changes: Any) -> Backend:
        """The backend, or a variant of it (e.g. another micro-batch size), built once each.

        ``options={KEY: VALUE}`` changes backend options on top of the stack's own (strings, as
        ``--backend-option`` gives them).
        """
        key = tuple(sorted((k, _hashable(v)) for k, v in changes.items()))
        if key not in self._backends:
            config = self.spec.backend_config(self.model_info.path, **changes)
            self._backends[key] = self._start("backend", config, key)
        return self._backends[key]

    @contextmanager
    def engine_for(self, model: Path, **option_changes: str) -> Iterator[Engine]:
        """The engine under test started afresh on another model folder, with
        ``option_changes`` on top of its own options, closed when the block ends.

        Its samples are not held to the support property: they come from weights the backend
        does not hold."""
        config = self.spec.engine_config(model, **option_changes)
        key = (("model", model), *sorted(option_changes.items()))
        with closing(self._start("engine", config, key, audited=False)) as engine:
            yield engine

    def _start(self, kind: str, config: Any, key: tuple, *, audited: bool = True) -> Guarded:
        """Start the stack's ``kind`` on ``config`` (:func:`conformance.guard.start`: within the
        start deadline, guarded and timed); a failure to start ends the run.

        Start time is the component's own work, booked to ``timing[kind + "_start_s"]``.
        """
        if self._crash is not None:
            raise EngineCrashed(f"the stack crashed earlier: {self._crash}", "see results.jsonl")
        name = self.spec.engine if kind == "engine" else self.spec.backend
        before = self.timing[f"{kind}_start_s"]
        # no engine or backend means no measurement: the rest is skipped, not errored
        guarded = start(
            kind,
            name,
            config,
            start_timeout=self.spec.start_timeout,
            call_timeout=self.spec.call_timeout,
            on_crash=self._on_crash,
            timing=self.timing,
            eos_token_id=self.model_info.eos_token_id,
            audit=self._audit if kind == "engine" and audited else None,
        )
        seconds = self.timing[f"{kind}_start_s"] - before
        info = guarded.info()
        # an engine's own artefacts (converted weights, compiled graphs) join its fingerprint
        artefacts = dict(getattr(guarded.inner, "artefacts", dict)())
        if artefacts:
            info = {**info, "artefacts": artefacts}
        if not key:
            # kept for the report, which is written after everything has been closed
            self._infos[kind] = info
        self._log(event=f"{kind}_started", changes=dict(key), seconds=round(seconds, 3), info=info)
        return guarded

    def _on_crash(
        self, reason: str, *, fix: str | None = None, exc: BaseException | None = None
    ) -> None:
        if self._crash is None:
            self._crash, self._crash_fix = reason, fix
        self._log(
            event="crash", reason=reason, **({"traceback": format_traceback(exc)} if exc else {})
        )

    def fingerprint(self) -> Stack:
        """The stack as the report records it: its spec, the model, and what the engine and
        backend started so far said of themselves."""
        engine, backend = self._infos.get("engine", {}), self._infos.get("backend", {})
        return Stack(fingerprint(self.spec, self.model_info, engine, backend))

    @classmethod
    def fingerprint_of(cls, spec: StackSpec) -> Stack:
        """:meth:`fingerprint` of ``spec``'s stack, started and closed again: starting the
        engine and backend is how their versions and knobs are learned."""
        with closing(cls(spec)) as stack:
            stack.engine  # noqa: B018
            stack.backend  # noqa: B018
            return stack.fingerprint()

    def engine_release(self) -> str:
        """The engine and the release of the package behind it, from its ``info()``: what a
        harness or adapter fault is reported against."""
        info = self._infos.get("engine", {})
        versions = [f"{key} {info[key]}" for key in RELEASE_KEYS if info.get(key)]
        return f"{self.spec.engine!r}" + (f" ({', '.join(versions)})" if versions else "")

    def close(self) -> None:
        """Close every engine and backend started; one failing to close does not keep the
        others open."""
        for component in [*self._engines.values(), *self._backends.values()]:
            try:
                component.close()
            except Exception as exc:
                self._log(event="close_failed", kind=component.kind, error=repr(exc))
        self._engines.clear()
        self._backends.clear()
        self._shared = None


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _hashable(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, dict) else value
