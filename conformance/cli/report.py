"""``tim-conformance report DIR/report.json -o report.html``: render a report as HTML."""

from __future__ import annotations

import argparse
from pathlib import Path

from conformance.report import load_report, load_rl_curves, write_html

EPILOG = """examples:
  tim-conformance report reports/base/report.json              # -> reports/base/report.html
  tim-conformance report reports/base/report.json -o /tmp/page.html
"""


HELP = "render a report.json as one self-contained HTML page"
DESCRIPTION = (
    "Render a report.json (from certify or pytest --tim-report) as HTML: "
    "verdict, stack, per-suite tables, failing cases with replay commands, plots."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report", type=Path, help="the report.json to render")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="where to write the page (default: report.html next to report.json)",
    )


def run(args: argparse.Namespace) -> int:
    report = load_report(args.report)
    out = args.output or args.report.with_name("report.html")
    curves = load_rl_curves(args.report.parent, report)
    print(write_html(report, out, rl_curves=curves or []))
    return 0
