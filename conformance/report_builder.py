"""A run's report: each finished check's entry, the verdict, and ``report.json``."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from conformance.host import device_info
from conformance.outcome import FAULT, Outcome
from conformance.profiles import load_profile
from conformance.report import write_html
from conformance.report.coverage import feature_coverage, unreached_reason
from conformance.report.schema import (
    Check,
    FeatureCoverage,
    ProfileInfo,
    Report,
    Shrink,
    Timing,
    Violation,
)
from conformance.results_log import ResultsLog
from conformance.started_stack import StartedStack

if TYPE_CHECKING:
    from conformance.metric_table import Breach
    from conformance.profiles import Profile
    from conformance.recorder import CheckRecord
    from conformance.stack import StackSpec


#: seconds between two writes of the report as the run stands (:meth:`ReportBuilder.write`'s
#: stand-in while it runs): a process killed outright loses at most the checks of the last ones
PROGRESS_SECONDS = 5.0
#: what that stand-in says, which only a process that never reached its verdict leaves behind
UNFINISHED = (
    "the run ended before its verdict: the harness process was killed or crashed (a native "
    "crash in an in-process engine or backend, or out of memory)"
)
UNFINISHED_FIX = (
    "rerun; if it dies again, the signal is in the terminal or the system log (dmesg), and "
    "results.jsonl says how far it got (render this report: tim-conformance report report.json)"
)


class ReportBuilder:
    """Builds the report of a run on ``stack`` judged by ``profile``: the checks as they
    finish, and what cut the run short; ``log`` hears of each check and of the verdict, and
    ``replay`` gives the command that reruns a check. While the run goes on, report.json holds
    the checks finished so far under an incomplete verdict, so that a process killed outright
    (SIGKILL, a segfault in an in-process engine) still leaves what it measured."""

    def __init__(
        self,
        stack: StartedStack,
        profile: Profile,
        *,
        seed: int,
        command: str,
        report_dir: Path | None,
        log: Callable[..., None],
        replay: Callable[[str], str],
    ) -> None:
        self._stack = stack
        self._spec = stack.spec
        self._profile = profile
        self._seed = seed
        self._command = command
        self._report_dir = report_dir
        self._log = log
        self._replay = replay
        self._checks: list[Check] = []
        self._interrupted: str | None = None
        self._interrupted_fix: str | None = None
        self._scope: Literal["stack", "suites"] = "stack"
        self._rl: dict[str, Any] | None = None
        self._started = dt.datetime.now(dt.UTC)
        self._clock = time.perf_counter()
        self._progress_written: float | None = None

    # -- what the run tells it -----------------------------------------------------------
    @property
    def interrupted(self) -> str | None:
        """Why the run was cut short (a signal, Ctrl-C), if it was."""
        return self._interrupted

    def note_interrupted(self, reason: str, *, fix: str | None = None) -> None:
        """The run was cut short for ``reason`` (the first reason given stands); ``fix`` says
        what to do about it, where the crashed component's own fix does not."""
        if self._interrupted is None:
            self._interrupted, self._interrupted_fix = reason, fix

    def record_scope(self, scope: Literal["stack", "suites"]) -> None:
        """What a pass certifies: the whole ``stack``, or only the ``suites`` that ran."""
        self._scope = scope

    def record_rl(self, summary: dict[str, Any]) -> None:
        """The RL smoke run's summary, with ``curves_path`` relative to the report folder."""
        self._rl = summary

    def finish_check(
        self, record: CheckRecord, outcome: Outcome, exc: BaseException | None
    ) -> Check:
        """Turn a finished check into its report entry. A failed check records the case of the
        failure it names (Hypothesis's final, shrunk example), else its worst example."""
        found = getattr(outcome.primary, "breach", None) if outcome.status == "fail" else None
        check = self._entry(record, outcome, exc, found, samples=True)
        self._checks.append(check)
        self._log(event="check", **{k: v for k, v in check.to_json().items() if k != "samples"})
        self._write_progress()
        return check

    def example_ended(self, record: CheckRecord) -> None:
        """An example of the running check ended: report.json as the run stands holds that
        check too (:meth:`_write_progress`)."""
        self._write_progress(running=record)

    def _running_entry(self, record: CheckRecord) -> Check:
        """The entry of the check still running: what its examples measured so far, the bounds
        that already broke, and the failure an example raised with its case (not yet shrunk,
        and not yet judged: a check may rerun a failed example and pass), ``interrupted``."""
        failed = f"; an example failed: {record.failed_with}" if record.failed_with else ""
        message = (
            f"running when the run ended, after {record.examples_run} measured example(s){failed}"
        )
        return self._entry(
            record, Outcome("interrupted", message), None, record.breach, samples=False
        )

    def _entry(
        self,
        record: CheckRecord,
        outcome: Outcome,
        exc: BaseException | None,
        found: Breach | None,
        *,
        samples: bool,
    ) -> Check:
        """``record``'s report entry as ``outcome`` ends it, ``found`` the property's own
        finding (:meth:`_breaches`); with ``samples``, the token points the page plots."""
        profile = self._profile
        metrics, tokens = record.pooled(), record.tokens()
        bounds = profile.bounds(record.suite, tokens, metrics)
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
        shrink = record.shrink(self._spec.shrink_seconds) if failure is not None else None
        return Check(
            suite=record.suite,
            name=record.name,
            nodeid=record.nodeid,
            status=outcome.status,
            message=outcome.message or "; ".join(filter(None, uncovered)),
            metrics=metrics,
            tokens=tokens,
            thresholds={k: v for k, v in bounds.items() if k in metrics},
            violations=[Violation.of(b) for b in self._breaches(record, found, metrics, tokens)],
            not_judged=profile.unjudged(metrics, tokens=tokens, suite=record.suite),
            worst_case={**case, "replay": self._replay(record.nodeid)} if case else None,
            worst_case_metrics=named.metrics if named else None,
            worst_case_example=named.number if case else None,
            shrink=Shrink(**shrink) if shrink else None,
            samples=record.samples() if samples else None,
            examples_run=record.examples_run,
            seconds=round(time.perf_counter() - record.started, 3),
            context=record.context,
            reached=record.reached,
        )

    def _breaches(
        self,
        record: CheckRecord,
        found: Breach | None,
        metrics: dict[str, float],
        tokens: int | None,
    ) -> list[Breach]:
        """The check's violations: the profile's bounds its pooled metrics broke, and the
        property's own finding ``found`` (``Recorder.fail``'s breach), first where it is one."""
        bounds = self._profile.check(metrics, tokens=tokens, suite=record.suite) if metrics else []
        if found is None or any(b.metric == found.metric for b in bounds):
            return bounds
        return [found, *bounds]

    def _unjudged_pool(self, tokens: int) -> str:
        """What a check says when its pool was too small for the profile's pooled bounds."""
        why = self._profile.small_pool(tokens) if tokens else ""
        return f"pooled bounds not judged: {why} (run more examples to judge them)" if why else ""

    # -- the summary ---------------------------------------------------------------------
    def _verdict(self, checks: list[Check], *, running: bool) -> tuple[str, str | None]:
        """``fail`` when any property was violated — even if the run was then cut short, since
        the stack is known to be broken; else ``incomplete`` when the run could not finish
        (the stack crashed or hung, a check errored, the run was interrupted, or, ``running``,
        it has not finished yet); else ``pass``."""
        statuses = [c.status for c in checks]
        unfinished = self._stack.crash or self._interrupted or (UNFINISHED if running else None)
        if "fail" in statuses:
            return "fail", f"and the run did not finish: {unfinished}" if unfinished else None
        if unfinished:
            measured = sum(1 for c in checks if c.metrics)
            return "incomplete", f"{unfinished} ({measured} checks measured)"
        if "error" in statuses:
            errored = [c for c in checks if c.status == "error"]
            release = self._stack.engine_release()
            return "incomplete", f"{len(errored)} check(s) errored with engine {release}: " + (
                "; ".join(f"{c.nodeid}: {c.message}" for c in errored[:3])
            )
        if "pass" not in statuses:
            return "incomplete", "no check ran"
        unreached = self._scope == "stack" and [
            f for f in self._coverage(checks) if not f.reached_by
        ]
        if unreached:
            # a certificate speaks for the model's features only where a check exercised them
            return "fail", unreached_reason(unreached, checks)
        return "pass", None

    def _coverage(self, checks: list[Check]) -> list[FeatureCoverage]:
        return feature_coverage(self._stack.model_info.features, checks)

    def _fix(self, checks: list[Check], *, running: bool) -> str:
        """What to do about an incomplete run: the crashed component's own fix or the one the
        interruption came with, else where the traceback of the fault that stopped it is."""
        given = self._stack.crash_fix or self._interrupted_fix
        if given:
            return given
        if running:
            return UNFINISHED_FIX
        faulted = any(c.status == "error" and c.message.startswith(FAULT) for c in checks)
        if faulted and not (self._stack.crash or self._interrupted):
            return (
                f'a {FAULT}: report it with its traceback, logged in results.jsonl (event "fault")'
            )
        return "rerun once the cause is fixed; a crashed or hung engine's log says why"

    def report(self) -> Report:
        """The run's report."""
        return self._report(list(self._checks), running=False)

    def _report(self, checks: list[Check], *, running: bool) -> Report:
        """The report of ``checks``; ``running``: as the run stands while it goes on."""
        verdict, reason = self._verdict(checks, running=running)
        profile, model = self._profile, self._stack.model_info
        return Report(
            verdict=verdict,
            reason=reason,
            fix=self._fix(checks, running=running) if verdict == "incomplete" else None,
            created=self._started.isoformat(timespec="seconds"),
            command=self._command,
            seed=self._seed,
            examples=self._spec.examples,
            depth=self._spec.depth.name,
            run_shape=self._spec.depth.run_shape(),
            scope=self._scope,
            spec=self._spec.option_values(),
            stack=self._stack.fingerprint(),
            profile=ProfileInfo.of(profile, profile.foreign_to(model.sha256, device_info())),
            checks=checks,
            timing=self._timing(),
            rl=self._rl,
            coverage=self._coverage(checks),
        )

    def _timing(self) -> Timing:
        """Wall time of the run, the seconds the engines and backends spent starting and
        computing, and the harness's overhead: the rest of the wall time, per second of that."""
        timing = self._stack.timing
        compute = sum(timing.values())
        wall = time.perf_counter() - self._clock
        return Timing(
            wall_s=round(wall, 3),
            **{k: round(v, 3) for k, v in timing.items()},
            harness_overhead=round((wall - compute) / compute, 4) if compute else 0.0,
        )

    def _write_progress(self, running: CheckRecord | None = None) -> None:
        """report.json as the run stands, the ``running`` check's entry as it stands included,
        at most every :data:`PROGRESS_SECONDS` (without the checks' samples, which only the
        page's plots draw): :meth:`write` replaces it."""
        now = time.perf_counter()
        if self._report_dir is None or (
            self._progress_written is not None and now - self._progress_written < PROGRESS_SECONDS
        ):
            return
        self._progress_written = now
        current = [self._running_entry(running)] if running is not None else []
        data = self._report([*self._checks, *current], running=True).to_json()
        for check in data["checks"]:
            check.pop("samples", None)
        # a stand-in only: a report folder that takes no file fails the run's own write, which
        # says so; it must not fail the example that happened to end here
        with contextlib.suppress(OSError):
            _replace_json(self._report_dir / "report.json", data)

    def write(self) -> Report:
        """The report, logged as the run's end and written to ``report.json`` and
        ``report.html`` in the report folder, if the run has one."""
        report = self.report()
        self._log(event="session_end", verdict=report.verdict, reason=report.reason)
        if self._report_dir is not None:
            _replace_json(self._report_dir / "report.json", report.to_json())
            write_html(report, self._report_dir / "report.html")
        return report


def _replace_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed over it), so that
    a process killed while writing leaves the previous report, never half of one."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=1, default=str) + "\n")
    partial.replace(path)


def report_cut_short(
    spec: StackSpec, reason: str, fix: str, *, seed: int, command: str, report_dir: Path
) -> Report:
    """The report, written into ``report_dir``, of a run cut short for ``reason`` before its
    suites: incomplete, no check ran, nothing of ``spec``'s stack started."""
    builder = ReportBuilder(
        StartedStack(spec),
        load_profile(spec.profile),
        seed=seed,
        command=command,
        report_dir=report_dir,
        log=ResultsLog(report_dir),
        replay=lambda nodeid: nodeid,  # no check ran
    )
    builder.note_interrupted(reason, fix=fix)
    return builder.write()
