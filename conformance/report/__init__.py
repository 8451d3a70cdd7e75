"""The HTML conformance report: ``write_html(report, out)`` turns a report.json dict into one
self-contained page (inline CSS and SVG, no script, no request to any host).

Pure Python: importing this package never imports torch.
"""

from conformance.report.page import load_rl_curves, render_html, write_html
from conformance.report.schema import load_report

__all__ = ["load_report", "load_rl_curves", "render_html", "write_html"]
