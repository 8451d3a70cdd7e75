"""``tim-conformance certify``: run the conformance suites on a stack and give a verdict."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from conformance import env, releases
from conformance.backends import BACKENDS
from conformance.certificate import write_certificate
from conformance.cli import check
from conformance.engines import ENGINES
from conformance.errors import EngineCrashed, UsageError
from conformance.guard import sigterm_as_interrupt
from conformance.options import add_stack_options, check_output_folder, pyproject_table
from conformance.preflight import preflight
from conformance.report.summary import verdict_lines, verdict_word
from conformance.report_builder import report_cut_short
from conformance.rl.options import add_training_options, rl_smoke_args
from conformance.stack import StackSpec
from conformance.suites_location import suite_paths, suites_folder

if TYPE_CHECKING:
    import pytest

    from conformance.report.schema import Report

DEFAULT_SEED = 0

EPILOG = """exit status: 0 certified, 1 not certified, 2 usage/environment error or incomplete run

examples:
  tim-conformance certify
  tim-conformance certify --engine vllm --engine-dtype bfloat16 --backend-dtype float32
  tim-conformance certify --engine-dtype bfloat16 --profile fp32 --out reports/bf16
"""


HELP = "run the conformance suites on a stack and certify it"
DESCRIPTION = (
    "Run the conformance suites (pytest, in-process) on an engine + backend + "
    "model + dtype stack; write report.json, report.html and certificate.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    supported = releases.help_text(
        {
            "engine": {n: c.capabilities.releases for n, c in ENGINES.declared().items()},
            "backend": {n: c.RELEASES for n, c in BACKENDS.declared().items()},
        }
    )
    parser.epilog = EPILOG + supported + env.help_text(env.CERTIFY)
    add_stack_options(parser.add_argument, prefix="")
    parser.add_argument(
        "--seed", type=int, default=None, help=f"Hypothesis seed (default: {DEFAULT_SEED})"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="report folder, new or existing (default: reports/<timestamp>/)",
    )
    parser.add_argument(
        "--suites",
        type=Path,
        default=None,
        metavar="DIR",
        help="suites folder (default: the suites installed with tim-conformance)",
    )
    parser.add_argument(
        "--suite",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this suite (e.g. rollout_parity; repeatable): for chasing one failure, "
        "not for a certificate of the whole stack (default: every suite)",
    )
    parser.add_argument(
        "--rl-smoke",
        action="store_true",
        help="also run a short RL smoke run on a copy of the stack (a few minutes), under the "
        "training options below",
    )
    add_training_options(parser.add_argument, prefix="")  # the --rl-smoke run's training regime
    parser.add_argument(
        "--check",
        type=Path,
        action=_CheckAction,
        metavar="CERTIFICATE",
        help="deprecated spelling of `tim-conformance check CERTIFICATE`, with the same stack "
        "options (default: run the suites)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show pytest's whole output (each failure's traceback) as the suites run (default: "
        "a progress line and the verdict; pytest's output goes to pytest.log in the report "
        "folder either way)",
    )


def run(args: argparse.Namespace) -> int:
    given = vars(args)
    spec = StackSpec.from_options(given, pyproject_table(Path.cwd()))
    out = args.out or Path("reports") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    seed = DEFAULT_SEED if args.seed is None else args.seed
    # what only a run reads, each refused in one line before anything starts: a calibration or
    # an engine start is not spent on a run that would stop at them
    extra = rl_smoke_args(given, rl_smoke=args.rl_smoke)
    check_output_folder(out)
    suites = suite_paths(args.suites or suites_folder(), args.suite)
    stage, report = "preflight", None
    with sigterm_as_interrupt() as signals:
        try:
            # may calibrate the model's own profile first: minutes, where a run gets cut short
            spec = preflight(spec)
            stage = "startup"
            report = _run_suites(spec, suites, out, seed, extra, verbose=args.verbose)
        except KeyboardInterrupt:
            # in the preflight, or as pytest started (importing it, reading its configuration:
            # the plugin reports an interrupt only from its session on): no report yet
            pass
    shown = report is not None and args.verbose
    if report is None:
        doing, fix = _BEFORE_SUITES[stage]
        taken = signals[-1] if signals else "Ctrl-C"
        report = report_cut_short(
            spec,
            f"interrupted by {taken} before the suites ran ({doing})",
            fix,
            seed=seed,
            command=_command(),
            report_dir=out,
        )
    return _conclude(report, out, shown=shown)


def _check(args: argparse.Namespace) -> int:
    """``certify --check CERTIFICATE``: the deprecated spelling of ``tim-conformance check``
    (the run's own options it is given, which start nothing, are ignored, as they were)."""
    releases.warn(
        "`certify --check CERTIFICATE` is deprecated: use `tim-conformance check CERTIFICATE`, "
        "with the same stack options"
    )
    return check.run(args)


class _CheckAction(argparse.Action):
    """``--check CERTIFICATE``: check the certificate instead of running (:func:`_check`)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        namespace.certificate = values
        namespace.func = _check


#: what a certify cut short before its suites was doing, and what to do about it
_BEFORE_SUITES = {
    "preflight": (
        "checking the stack, or calibrating the model's own profile: a calibration cut short "
        "is not cached",
        "rerun certify and let its calibration finish (minutes, once: it is cached), or pass "
        "--profile NAME|FILE",
    ),
    "startup": ("starting pytest", "rerun certify"),
}


def _command() -> str:
    return shlex.join(["tim-conformance", *sys.argv[1:]])


#: pytest's whole output in the report folder (tracebacks, Hypothesis's falsifying examples)
PYTEST_LOG = "pytest.log"
#: what a run writes in its report folder as its outcome
_RUN_FILES = ("report.json", "report.html", "certificate.json")


def _run_suites(
    spec: StackSpec,
    suites: list[Path],
    out: Path,
    seed: int,
    extra: list[str],
    *,
    verbose: bool,
) -> Report | None:
    """The report of the suites run on ``spec`` into ``out``, as the harness wrote it; None
    where an interrupt as pytest started left none (pytest's INTERRUPTED: before the plugin's
    session existed). The plugin takes ``spec`` as it is, built and preflighted once here, and
    hands the report back (:class:`~conformance.plugin.PreparedStack`). pytest's output goes
    to ``out``/:data:`PYTEST_LOG`, and with ``verbose`` to the terminal too; without, the
    terminal gets one progress line."""
    import pytest

    from conformance.plugin import PreparedStack

    folder = suites[0] if suites[0].is_dir() else suites[0].parent
    args = [
        *map(str, suites),
        *extra,
        "--tim-report",
        str(out),
        f"--hypothesis-seed={seed}",
        "-q",
        "-p",
        "no:cacheprovider",
        # no benchmark here: pytest-benchmark, where installed, would leave .benchmarks/ in
        # the user's folder
        "-p",
        "no:benchmark",
        # certify imported the harness (and torch, transformers) before pytest started, so
        # pytest cannot rewrite the asserts of the plugins installed with them (the harness
        # itself, from a wheel); the suites' own asserts are rewritten all the same
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        f"--rootdir={folder.parent}",
    ]
    try:
        out.mkdir(parents=True, exist_ok=True)
        # what an earlier run left in the folder is not this run's: its certificate must not
        # stand beside a run that stopped before writing its own
        for earlier in _RUN_FILES:
            (out / earlier).unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot write the report folder {out}: {exc.strerror}", "pass --out a writable folder"
        ) from None
    log = out / PYTEST_LOG
    print(
        f"tim-conformance: certifying {spec.engine} vs {spec.backend} -> {out} (pytest's "
        f"output: {log})",
        flush=True,
    )
    prepared = PreparedStack(spec, _command())
    with _output_to(log, echo=verbose) as terminal:
        plugins = [prepared, *([] if verbose else [_Progress(terminal)])]
        code = int(pytest.main(args, plugins=plugins))
    if prepared.report is None and code != pytest.ExitCode.INTERRUPTED:
        said = _last_line(log)
        raise UsageError(
            f"the suites did not run (pytest exit {code}{': ' + said if said else ''})",
            f"see {log}",
        )
    return prepared.report


@contextmanager
def _output_to(log: Path, *, echo: bool) -> Iterator[Callable[[str], None]]:
    """File descriptors 1 and 2 — pytest's output, and whatever the engines and their servers
    print — into ``log``, and with ``echo`` to the terminal as well; yields a writer to the
    terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    terminal, errors = os.dup(1), os.dup(2)
    with log.open("wb") as file:
        copier = None
        if echo:
            read, write = os.pipe()

            def copy() -> None:
                while chunk := os.read(read, 1 << 16):
                    file.write(chunk)
                    file.flush()
                    os.write(terminal, chunk)

            copier = threading.Thread(target=copy, daemon=True)
            copier.start()
            target = write
        else:
            target = file.fileno()
        os.dup2(target, 1)
        os.dup2(target, 2)

        def say(text: str) -> None:
            os.write(terminal, text.encode())

        try:
            yield say
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(terminal, 1)
            os.dup2(errors, 2)
            if copier is not None:
                os.close(write)
                # a server the run started that still holds the pipe must not hold certify
                copier.join(timeout=10)
                os.close(read)
            os.close(terminal)
            os.close(errors)


class _Progress:
    """pytest plugin: one character per test on the terminal as it ends (pytest's own ``-q``
    marks: ``.`` pass, ``F`` fail, ``E`` error, ``s`` skip), on one line."""

    MARKS: ClassVar[dict[str, str]] = {"passed": ".", "failed": "F", "skipped": "s"}

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.started = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or not report.passed:
            if not self.started:
                self.write("tim-conformance: running ")
                self.started = True
            failed_outside = report.failed and report.when != "call"
            self.write("E" if failed_outside else self.MARKS[report.outcome])

    def pytest_sessionfinish(self) -> None:
        if self.started:
            self.write("\n")


def _last_line(path: Path) -> str:
    """The last non-blank line of ``path`` (pytest's own error, where it stopped); ``""``
    where there is none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _conclude(report: Report, out: Path, *, shown: bool = False) -> int:
    """Write the certificate of ``report`` and say the verdict: its table (unless
    pytest's output, on the terminal, ``shown`` it), then one line; the exit code."""
    certificate = write_certificate(out / "report.json", out / "certificate.json")
    if not shown:
        for line in verdict_lines(report, out):
            print(line)
    print(f"tim-conformance: report {out / 'report.html'}, certificate {out / 'certificate.json'}")
    if report.verdict == "incomplete":
        raise EngineCrashed(
            f"run incomplete: {report.reason}; report kept in {out / 'report.json'}, "
            f"log in {out / 'results.jsonl'}",
            report.fix or "rerun certify once the cause is fixed",
        )
    if report.verdict == "pass" and certificate["scope"] == "suites":
        # a pass of some properties is no certificate of the stack
        print(
            f"tim-conformance: verdict PASSED on suite(s) {', '.join(certificate['suites'])} "
            "only — not a certificate of the stack (certificate.json: certified false; run "
            "every suite to certify it)"
        )
        return 0
    print(f"tim-conformance: verdict {verdict_word(report)}")
    return 0 if report.verdict == "pass" else 1
