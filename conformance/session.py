"""One conformance session: the stack under test (started once), the recorder that streams
every measurement to ``results.jsonl``, and the report written to ``report.json``.

Each job has its own object: :class:`~conformance.started_stack.StartedStack` starts and closes
the engines and backends, :class:`~conformance.session_audit.SessionAudit` holds their samples to
the support property, :class:`~conformance.report_builder.ReportBuilder` turns finished checks
into the report. The session joins them and gives the suites one handle (the ``tim`` fixture).
"""

from __future__ import annotations

import random
import shlex
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.profiles import load_profile
from conformance.recorder import CheckRecord, Recorder
from conformance.report_builder import ReportBuilder
from conformance.results_log import ResultsLog
from conformance.session_audit import SessionAudit
from conformance.stack import StackSpec
from conformance.started_stack import StartedStack, format_traceback

if TYPE_CHECKING:
    from conformance.backends import Backend
    from conformance.engines import Engine
    from conformance.models import ModelInfo
    from conformance.shared_answers import SharedAnswers


class HarnessSession:
    """One run: its spec, seed and profile, its stack (:attr:`stack`), the recorder the suites
    measure through, and the report (:attr:`report`).

    ``rootdir`` is the folder pytest's node ids are relative to (None: the one the run started
    in); ``report_dir``, where ``results.jsonl`` streams and ``report.json`` is written.
    """

    def __init__(
        self,
        spec: StackSpec,
        *,
        seed: int,
        report_dir: Path | None,
        command: str,
        rootdir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.seed = seed
        self.report_dir = report_dir
        #: appends an event to ``results.jsonl`` (nowhere when the run has no report folder)
        self.log = ResultsLog(report_dir)
        self._rootdir = rootdir
        self._started_in = Path.cwd()
        self.profile = load_profile(spec.profile)
        self.recorder = Recorder(
            self.profile,
            log=self.log,
            replay=self.replay_command,
            # the report's builder is made below, once the stack it reports on is
            example_ended=lambda record: self.report.example_ended(record),
        )
        audit = SessionAudit(self.recorder, self.profile, backend=lambda: self.stack.backend)
        self.stack = StartedStack(spec, log=self.log, current_check=self._nodeid, audit=audit)
        self.report = ReportBuilder(
            self.stack,
            self.profile,
            seed=seed,
            command=command,
            report_dir=report_dir,
            log=self.log,
            replay=self.replay_command,
        )

    # -- the stack, as the suites ask for it ------------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        return self.stack.model_info

    @property
    def engine(self) -> Engine:
        """The engine under test, started on first use."""
        return self.stack.engine

    @property
    def backend(self) -> Backend:
        return self.stack.backend

    @property
    def shared_engine(self) -> SharedAnswers:
        return self.stack.shared_engine

    def engine_variant(self, **option_changes: str) -> Engine:
        return self.stack.engine_variant(**option_changes)

    def backend_variant(self, **changes: Any) -> Backend:
        return self.stack.backend_variant(**changes)

    def engine_for(self, model: Path, **option_changes: str) -> AbstractContextManager[Engine]:
        return self.stack.engine_for(model, **option_changes)

    def close(self) -> None:
        self.stack.close()

    # -- recording -----------------------------------------------------------------------
    def log_fault(self, nodeid: str, exc: BaseException) -> None:
        """Keep the traceback of an exception a check raised for the log, not the terminal."""
        self.log(event="fault", nodeid=nodeid, traceback=format_traceback(exc))

    @contextmanager
    def check(self, suite: str, name: str, nodeid: str) -> Iterator[CheckRecord]:
        """The record of the check ``nodeid`` while it runs (the recorder points at it)."""
        record = CheckRecord(suite=suite, name=name, nodeid=nodeid, started=time.perf_counter())
        with self.recorder.checking(record):
            yield record

    def _nodeid(self) -> str | None:
        current = self.recorder.current
        return current.nodeid if current is not None else None

    def replay_command(self, nodeid: str) -> str:
        """The pytest command that reruns ``nodeid`` on this stack and seed, from the folder
        the run started in."""
        target = nodeid
        if self._rootdir is not None:
            # node ids are relative to pytest's rootdir, which certify sets to the suites'
            # parent: the clone's root, or the installed package's folder (a wheel's suites),
            # which a user's pytest does not start in
            file, sep, rest = nodeid.partition("::")
            path = self._rootdir / file
            if path.is_relative_to(self._started_in):
                path = path.relative_to(self._started_in)
            target = f"{path.as_posix()}{sep}{rest}"
        args = ["pytest", target, *self.spec.pytest_args(), f"--hypothesis-seed={self.seed}"]
        return shlex.join(args)


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)
