"""``tim-conformance check``: a launcher's gate, whether a certificate certifies the stack it is
about to start."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conformance import env
from conformance.certificate import (
    certified_values,
    compare_stacks,
    compare_values,
    judge_certificate,
    load_certificate,
)
from conformance.guard import sigterm_as_interrupt
from conformance.options import JUDGED_OPTIONS, add_stack_options, pyproject_table
from conformance.preflight import preflight
from conformance.stack import StackSpec
from conformance.started_stack import StartedStack

EPILOG = """exit status: 0 certified for this launch, 1 not certified for it (one line per
reason), 2 usage error (a file that is no certificate, a stack option that is refused)

examples:
  tim-conformance check reports/base/certificate.json
  tim-conformance check reports/base/certificate.json --engine vllm --engine-dtype bfloat16 \\
      --max-new-tokens 4096 --group-size 16
"""

HELP = "exit 0 only if a certificate certifies the stack a launch is about to start"
DESCRIPTION = (
    "Judge CERTIFICATE (certify's certificate.json) for a launch, running no suite: exit 0 only "
    "if it certifies the stack (a full run's pass), was not edited (its fingerprint, the "
    f"report.json beside it, its signature where {env.CERT_KEY.name} is set) and names the "
    "stack the launch starts. With no stack option that is the stack the certificate names; "
    "with some, the stack they give, started and fingerprinted, and the values they name of "
    f"{', '.join('--' + o.name for o in JUDGED_OPTIONS)} must be the certified ones."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG + env.help_text(env.CERTIFY)
    parser.add_argument(
        "certificate", type=Path, metavar="CERTIFICATE", help="certify's certificate.json"
    )
    add_stack_options(parser.add_argument, prefix="")


def run(args: argparse.Namespace) -> int:
    certificate = load_certificate(args.certificate)
    recorded = certified_values(certificate)
    # judged on its own before its values build a stack: one that certifies nothing, or was
    # edited, names no stack to build, let alone start
    standing = judge_certificate(certificate, path=args.certificate)
    if not standing.certifies:
        print(*standing.lines, sep="\n")
        return 1
    given = vars(args)
    spec = StackSpec.from_options(given, pyproject_table(Path.cwd()), recorded=recorded)
    # a SIGTERM closes what started (an engine's server) as Ctrl-C does
    with sigterm_as_interrupt():
        # no measurement is judged, so no profile is calibrated
        spec = preflight(spec, judged=False)
        # the stack as it starts now, against the one the certificate certified
        with _stdout_to_stderr():
            started = StartedStack.fingerprint_of(spec)
    verdict = standing.with_stack(
        compare_stacks(certificate, started), compare_values(certificate, spec, started)
    )
    print(*verdict.lines, sep="\n")
    return 0 if verdict.certifies else 1


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2: what an engine prints as it starts (vLLM logs to stdout) goes
    to the error output, so that the output is the verdict alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
