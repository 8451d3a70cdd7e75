"""``tim-conformance gate BASELINE.json CANDIDATE.json``: the parity gate for stack changes.

Exit 0 when the candidate is within the profile and no metric regressed beyond its factor,
1 when it is not, 2 when the reports cannot be compared (or the input is bad).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from conformance import releases
from conformance.gate import DEFAULT_FACTOR, compare, parse_factors, ratio_note, write_gate_html
from conformance.profiles import load_profile
from conformance.report import load_report

EPILOG = """examples:
  tim-conformance gate reports/base/report.json reports/new/report.json
  tim-conformance gate base.json new.json --max-regression abs_diff_max=2 --html gate.html
  tim-conformance gate base.json new.json --profile bf16   # hold the candidate to bf16
"""


HELP = "compare a candidate report.json against a baseline (exit 0 pass, 1 fail, 2 n/a)"
DESCRIPTION = (
    "Compare two report.json files made on the same suites, model, seed and "
    "example count. Fails (exit 1) when the candidate breaks the profile or any metric "
    "regressed beyond its allowed factor; exit 2 when the two are not comparable."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", type=Path, help="report.json of the accepted stack")
    parser.add_argument("candidate", type=Path, help="report.json of the changed stack")
    parser.add_argument(
        "--profile",
        help="hold the candidate to this profile (name or TOML path) instead of its own "
        "(default: the candidate's own)",
    )
    parser.add_argument(
        "--max-regression",
        action="append",
        default=[],
        metavar="METRIC=FACTOR",
        help=f"allowed growth of a metric's distance from ideal (default ×{DEFAULT_FACTOR:g}); "
        "repeatable",
    )
    parser.add_argument(
        "--html", type=Path, metavar="OUT", help="also write an HTML diff report (default: none)"
    )


def run(args: argparse.Namespace) -> int:
    factors = parse_factors(args.max_regression)
    profile = load_profile(args.profile) if args.profile else None
    if profile is not None:
        for line in profile.ignored:
            releases.warn(line)
    result = compare(
        load_report(args.baseline),
        load_report(args.candidate),
        profile=profile,
        max_regression=factors,
    )
    if result.rows:
        print(result.text_table())
        print(ratio_note(result.floor))
    for line in result.violations:
        print(f"outside profile: {line}")
    if args.html:
        print(f"wrote {write_gate_html(result, args.html)}")
    print(("gate: PASS — " if result.exit_code == 0 else "gate: FAIL — ") + result.reason)
    return result.exit_code
