"""One conformance session: the engine and backend (started once), the recorder that streams
every measurement to ``results.jsonl``, and the summary written to ``report.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shlex
import time
import traceback
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from conformance.backends import Backend
from conformance.engines import Engine, LogprobKind
from conformance.errors import EngineCrashed
from conformance.guard import Guarded, start
from conformance.host import device_info
from conformance.outcome import FAULT, Outcome, first_line
from conformance.recorder import CheckRecord, Recorder
from conformance.report.coverage import feature_coverage, unreached_reason
from conformance.report.schema import (
    Check,
    FeatureCoverage,
    ProfileInfo,
    Report,
    Shrink,
    Stack,
    Timing,
    Violation,
)
from conformance.shared_answers import SharedAnswers
from conformance.stack import StackSpec, fingerprint


class HarnessSession:
    """State of one run, kept in ``config.stash`` by the plugin and used by certify."""

    def __init__(
        self,
        spec: StackSpec,
        *,
        seed: int,
        report_dir: Path | None,
        command: str,
        rootdir: Path | None = None,
    ) -> None:
        from conformance.profiles import load_profile

        self.spec = spec
        self.seed = seed
        self.report_dir = report_dir
        self.command = command
        #: the folder pytest's node ids are relative to (None: the one the run started in)
        self.rootdir = rootdir
        self._started_in = Path.cwd()
        self.profile = load_profile(spec.profile)
        self.recorder = Recorder(self.profile, log=self.log, replay=self.replay_command)
        self.checks: list[Check] = []
        self.crash: str | None = None
        #: what the user can do about the crash, when the component that crashed said
        self.crash_fix: str | None = None
        #: why the run was cut short (a signal, Ctrl-C), if it was
        self.interrupted: str | None = None
        #: ``stack`` or ``suites``, as the report's field; the plugin sets it once collected
        self.scope: str = "stack"
        self.final_report: Report | None = None
        #: the RL smoke run's summary, with ``curves_path`` relative to the report folder
        self.rl: dict[str, Any] | None = None
        #: engines and backends started so far, by their option changes (``()``: the stack's own)
        self._engines: dict[tuple[Any, ...], Guarded] = {}
        self._backends: dict[tuple[Any, ...], Guarded] = {}
        self._infos: dict[str, dict[str, Any]] = {}
        self._shared: SharedAnswers | None = None
        self._model_info: Any = None
        self._started = dt.datetime.now(dt.UTC)
        self._clock = time.perf_counter()
        #: seconds spent starting engines and backends and inside their calls; everything else
        #: in the wall time is the harness's own overhead
        self.timing = dict.fromkeys(
            ("engine_start_s", "engine_s", "backend_start_s", "backend_s"), 0.0
        )
        if report_dir is not None:
            report_dir.mkdir(parents=True, exist_ok=True)
            (report_dir / "results.jsonl").write_text("")

    # -- the stack, started lazily and once ---------------------------------------------
    @property
    def model_info(self) -> Any:
        if self._model_info is None:
            from conformance.models import inspect_model

            self._model_info = inspect_model(self.spec.model_dir())
        return self._model_info

    @property
    def engine(self) -> Engine:
        """The engine under test, started on first use."""
        return self.engine_variant()

    @property
    def shared_engine(self) -> SharedAnswers:
        """The engine under test, answering a request the running check makes with the answer
        an earlier check got for the same request (``conformance.shared_answers``)."""
        if self._shared is None:
            self._shared = SharedAnswers(
                self.engine,
                current_check=lambda: getattr(self.recorder.current, "nodeid", None),
                log=self.log,
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

    @property
    def backend(self) -> Backend:
        return self.backend_variant()

    @contextmanager
    def backend_for(self, model: Path) -> Iterator[Backend]:
        """A backend like the stack's on another model folder, closed when the block ends."""
        config = self.spec.backend_config(model)
        with closing(self._start("backend", config, (("model", model),))) as backend:
            yield backend

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
        if self.crash is not None:
            raise EngineCrashed(f"the stack crashed earlier: {self.crash}", "see results.jsonl")
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
            audit=self._audit_support if kind == "engine" and audited else None,
        )
        seconds = self.timing[f"{kind}_start_s"] - before
        inner = guarded.inner
        info = guarded.info()
        # an engine's own artefacts (converted weights, compiled graphs) join its fingerprint
        artefacts = dict(getattr(inner, "artefacts", dict)())
        if artefacts:
            info = {**info, "artefacts": artefacts}
        if not key:
            # kept for the report, which is written after everything has been closed
            self._infos[kind] = info
        self.log(event=f"{kind}_started", changes=dict(key), seconds=round(seconds, 3), info=info)
        return guarded

    def _audit_support(self, engine: Guarded, method: str, args: tuple, result: Any) -> None:
        """Hold a sampled batch to the support property (``conformance.support_audit``): count
        its tokens in the running check, fail it on a token outside. A mixed batch
        (``generate_requests``) is held per request, to its own spec. Batches sampled without
        top-k/top-p, outside a check, or once engine or backend took new weights are not held,
        nor a batch the check already held and found clean (``CheckRecord.audited``)."""
        from conformance.metric_table import breach
        from conformance.outcome import PropertyFailure
        from conformance.support_audit import audit_key, audit_rollouts, sampled_batches

        record = self.recorder.current
        batches = sampled_batches(method, args, result)
        if not batches or record is None:
            return
        backend = self.backend
        if engine.weights_changed or backend.weights_changed:
            return
        audit = {
            "order": engine.capabilities.sampler_order,
            "margin": self.profile.bounds(record.suite).get("abs_diff_max", 0.0),
            "raw_logprobs": engine.inner.config.logprobs is LogprobKind.RAW,
        }
        for spec, completions, rows in batches:
            # a batch found clean is not held again; one with a token outside is, so its
            # failure repeats when Hypothesis replays it
            digest = audit_key(spec, completions, **audit)
            if digest in record.audited:
                continue
            try:
                found = audit_rollouts(backend, spec, completions, **audit)
            except NotImplementedError as exc:
                self.recorder.remark(f"sampled tokens' support not checked: {first_line(exc)}")
                return
            counts = {"support_tokens": found.tokens, "out_of_support_tokens": found.outside}
            for key, value in counts.items():
                record.extra[key] = record.extra.get(key, 0.0) + value
            if not found.outside:
                record.audited.add(digest)
                continue
            first = found.first
            if rows is not None:
                completion, rest = first.split(" ", 2)[1:]
                first = f"request {rows[int(completion)]}'s completion {rest}"
            outside = breach("out_of_support_tokens", found.outside, 0)
            raise PropertyFailure(
                f"engine {engine.name!r} {method}() gave {first} outside the stated "
                f"sampler's support ({found.outside} of {found.tokens} sampled tokens; "
                f"temperature {spec.temperature:g}, top_k {spec.top_k}, top_p "
                f"{spec.top_p:g}{f', min_p {spec.min_p:g}' if spec.min_p else ''}, "
                f"{engine.capabilities.sampler_order.value}): its processed probability "
                "is 0, so a trainer recomputing it gets -inf — check the order and masking "
                "of the engine's sampler (or declare its order as capabilities.sampler_order) "
                f"[{outside}]",
                outside,
            )

    def _breaches(
        self, record: CheckRecord, outcome: Outcome, metrics: dict[str, float], tokens: int | None
    ) -> list[Any]:
        """The check's violations: the profile's bounds its pooled metrics broke, and the
        property's own finding (``Recorder.fail``'s breach), first where the check names it."""
        found = getattr(outcome.primary, "breach", None) if outcome.status == "fail" else None
        bounds = self.profile.check(metrics, tokens=tokens, suite=record.suite) if metrics else []
        if found is None or any(b.metric == found.metric for b in bounds):
            return bounds
        return [found, *bounds]

    def _on_crash(
        self, reason: str, *, fix: str | None = None, exc: BaseException | None = None
    ) -> None:
        if self.crash is None:
            self.crash, self.crash_fix = reason, fix
        self.log(
            event="crash", reason=reason, **({"traceback": format_traceback(exc)} if exc else {})
        )

    def log_fault(self, nodeid: str, exc: BaseException) -> None:
        """Keep the traceback of an exception a check raised for the log, not the terminal."""
        self.log(event="fault", nodeid=nodeid, traceback=format_traceback(exc))

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
                self.log(event="close_failed", kind=component.kind, error=repr(exc))
        self._engines.clear()
        self._backends.clear()
        self._shared = None

    # -- recording -----------------------------------------------------------------------
    def log(self, **event: Any) -> None:
        if self.report_dir is None:
            return
        with (self.report_dir / "results.jsonl").open("a") as stream:
            stream.write(json.dumps(event, default=str) + "\n")

    @contextmanager
    def check(self, suite: str, name: str, nodeid: str) -> Iterator[CheckRecord]:
        record = CheckRecord(suite=suite, name=name, nodeid=nodeid, started=time.perf_counter())
        self.recorder.current = record
        try:
            yield record
        finally:
            self.recorder.current = None

    def finish_check(
        self, record: CheckRecord, outcome: Outcome, exc: BaseException | None
    ) -> Check:
        """Turn a finished check into its report entry. A failed check records the case of the
        failure it names (Hypothesis's final, shrunk example), else its worst example."""
        metrics, tokens = record.pooled(), record.tokens()
        uncovered = [*record.remarks, self._unjudged_pool(tokens)]
        failure = record.failure_for(exc) if outcome.status != "pass" else None
        named = (
            failure
            if failure is not None and failure.case is not None
            else record.worst[1]
            if record.worst
            else None
        )
        case = named.case if named else None
        # an example that failed inside a check that passes (a rerun judged it) was not shrunk
        shrink = record.shrink(self.spec.shrink_seconds) if failure is not None else None
        check = Check(
            suite=record.suite,
            name=record.name,
            nodeid=record.nodeid,
            status=outcome.status,
            message=outcome.message or "; ".join(filter(None, uncovered)),
            metrics=metrics,
            tokens=tokens,
            thresholds={
                k: v
                for k, v in self.profile.bounds(record.suite, tokens, metrics).items()
                if k in metrics
            },
            violations=[Violation.of(b) for b in self._breaches(record, outcome, metrics, tokens)],
            not_judged=self.profile.unjudged(metrics, tokens=tokens, suite=record.suite),
            worst_case={**case, "replay": self.replay_command(record.nodeid)} if case else None,
            worst_case_metrics=named.metrics if named else None,
            worst_case_example=named.number if case else None,
            shrink=Shrink(**shrink) if shrink else None,
            samples=record.samples(),
            examples_run=record.examples_run,
            seconds=round(time.perf_counter() - record.started, 3),
            context=record.context,
            reached=record.reached,
        )
        self.checks.append(check)
        self.log(event="check", **{k: v for k, v in check.to_json().items() if k != "samples"})
        return check

    def _unjudged_pool(self, tokens: int) -> str:
        """What a check says when its pool was too small for the profile's pooled bounds."""
        why = self.profile.small_pool(tokens) if tokens else ""
        return f"pooled bounds not judged: {why} (run more examples to judge them)" if why else ""

    def replay_command(self, nodeid: str) -> str:
        """The pytest command that reruns ``nodeid`` on this stack and seed, from the folder
        the run started in."""
        target = nodeid
        if self.rootdir is not None:
            # node ids are relative to pytest's rootdir, which certify sets to the suites'
            # parent: the clone's root, or the installed package's folder (a wheel's suites),
            # which a user's pytest does not start in
            file, sep, rest = nodeid.partition("::")
            path = self.rootdir / file
            if path.is_relative_to(self._started_in):
                path = path.relative_to(self._started_in)
            target = f"{path.as_posix()}{sep}{rest}"
        args = ["pytest", target, *self.spec.pytest_args(), f"--hypothesis-seed={self.seed}"]
        return shlex.join(args)

    # -- the summary ---------------------------------------------------------------------
    def verdict(self) -> tuple[str, str | None]:
        """``fail`` when any property was violated — even if the run was then cut short, since
        the stack is known to be broken; else ``incomplete`` when the run could not finish
        (the stack crashed or hung, a check errored, the run was interrupted); else ``pass``."""
        statuses = [c.status for c in self.checks]
        unfinished = self.crash or self.interrupted
        if "fail" in statuses:
            return "fail", f"and the run did not finish: {unfinished}" if unfinished else None
        if unfinished:
            measured = sum(1 for c in self.checks if c.metrics)
            return "incomplete", f"{unfinished} ({measured} checks measured)"
        if "error" in statuses:
            errored = [c for c in self.checks if c.status == "error"]
            release = self.engine_release()
            return "incomplete", f"{len(errored)} check(s) errored with engine {release}: " + (
                "; ".join(f"{c.nodeid}: {c.message}" for c in errored[:3])
            )
        if "pass" not in statuses:
            return "incomplete", "no check ran"
        unreached = self.scope == "stack" and [f for f in self._coverage() if not f.reached_by]
        if unreached:
            # a certificate speaks for the model's features only where a check exercised them
            return "fail", unreached_reason(unreached, self.checks)
        return "pass", None

    def _coverage(self) -> list[FeatureCoverage]:
        return feature_coverage(self.model_info.features, self.checks)

    def report(self) -> Report:
        verdict, reason = self.verdict()
        engine_info, backend_info = self._infos.get("engine", {}), self._infos.get("backend", {})
        return Report(
            verdict=verdict,
            reason=reason,
            fix=self.fix() if verdict == "incomplete" else None,
            created=self._started.isoformat(timespec="seconds"),
            command=self.command,
            seed=self.seed,
            examples=self.spec.examples,
            depth=self.spec.depth.name,
            run_shape=self.spec.depth.run_shape(),
            scope=self.scope,
            stack=Stack(fingerprint(self.spec, self.model_info, engine_info, backend_info)),
            profile=ProfileInfo(
                name=self.profile.name,
                source=str(self.profile.source),
                thresholds=self.profile.thresholds,
                suites=self.profile.suites,
                min_pooled_tokens=self.profile.min_pooled_tokens,
                max_pooled_tokens=self.profile.max_pooled_tokens,
                provenance=self.profile.provenance or None,
                foreign=self.profile.foreign_to(self.model_info.sha256, device_info()),
            ),
            checks=self.checks,
            timing=self._timing(),
            rl=self.rl,
            coverage=self._coverage(),
        )

    def fix(self) -> str:
        """What to do about an incomplete run: the crashed component's own fix, else where the
        traceback of the fault that stopped it is."""
        if self.crash_fix:
            return self.crash_fix
        faulted = any(c.status == "error" and c.message.startswith(FAULT) for c in self.checks)
        if faulted and not (self.crash or self.interrupted):
            return (
                f'a {FAULT}: report it with its traceback, logged in results.jsonl (event "fault")'
            )
        return "rerun once the cause is fixed; a crashed or hung engine's log says why"

    def _timing(self) -> Timing:
        """Wall time of the run, the seconds the engines and backends spent starting and
        computing, and the harness's overhead: the rest of the wall time, per second of that."""
        compute = sum(self.timing.values())
        wall = time.perf_counter() - self._clock
        return Timing(
            wall_s=round(wall, 3),
            **{k: round(v, 3) for k, v in self.timing.items()},
            harness_overhead=round((wall - compute) / compute, 4) if compute else 0.0,
        )

    def write_report(self) -> Report:
        report = self.report()
        self.log(event="session_end", verdict=report.verdict, reason=report.reason)
        if self.report_dir is not None:
            path = self.report_dir / "report.json"
            path.write_text(json.dumps(report.to_json(), indent=1, default=str) + "\n")
        return report


#: ``info()`` keys that carry the release of the package an engine runs on
RELEASE_KEYS = ("version", "vllm", "sglang", "transformers")


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _hashable(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)
