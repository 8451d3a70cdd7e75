"""report.json and its HTML page: the typed records (``schema``) and ``write_html(report, out)``,
which turns a report into one self-contained page (inline CSS and SVG, no script, no request to
any host).

Pure Python: importing this package never imports torch.
"""

from conformance.report.page import load_rl_curves, render_html, write_html
from conformance.report.schema import Report, as_report, load_report, parse_report

__all__ = [
    "Report",
    "as_report",
    "load_report",
    "load_rl_curves",
    "parse_report",
    "render_html",
    "write_html",
]
