"""HTML building blocks with escaping by default: plain ``str`` is data, ``Markup`` is trusted.

Every value that came from a report (prompts, paths, messages, metric names, stack values) is
a plain ``str`` (or number) and is escaped on the way out; only markup this package built
itself is wrapped in ``Markup``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from importlib import resources


class Markup(str):
    """A string of HTML this package built; passed through unescaped."""


def esc(value: object) -> str:
    """HTML-escape ``value`` (quotes too, so it is safe inside attributes); Markup passes."""
    if isinstance(value, Markup):
        return value
    return html.escape(value if isinstance(value, str) else as_text(value), quote=True)


def tag(name: str, content: object = "", **attrs: object) -> Markup:
    """``<name attrs>content</name>`` with escaped attributes and content (``cls`` → class)."""
    rendered = "".join(
        f' {"class" if key == "cls" else key.replace("_", "-")}="{esc(val)}"'
        for key, val in attrs.items()
        if val is not None
    )
    return Markup(f"<{name}{rendered}>{esc(content)}</{name}>")


def join(parts: Iterable[object]) -> Markup:
    return Markup("".join(esc(p) for p in parts))


def table(
    headers: Sequence[object], rows: Iterable[Sequence[object]], *, cls: str | None = None
) -> Markup:
    """A ``<table>``; cells are escaped unless they are Markup."""
    head = join(tag("th", h) for h in headers)
    body = join(Markup(f"<tr>{join(tag('td', c) for c in row)}</tr>") for row in rows)
    return tag("table", Markup(f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody>"), cls=cls)


def code_block(text: str) -> Markup:
    """A command or data to copy: monospace, wraps, selectable."""
    return tag("pre", tag("code", text), cls="copy")


def page(title: str, body: Markup) -> str:
    """A self-contained document: inline CSS, a CSP that forbids every script and request."""
    css = resources.files("conformance.report").joinpath("report.css").read_text("utf-8")
    # The CSP is defence in depth: escaping is what keeps data inert, and is tested without it.
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{css}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def as_text(value: object) -> str:
    """Display form of a data value: 6 significant digits for floats, JSON for containers."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict | list):
        # the characters themselves: a page shows "–", never its JSON escape
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def number(value: float) -> str:
    """6 significant digits; values within 1e-3 of 1 as ``1 − d`` so that 0.999999999932 (a pcc
    bound) does not print as 1."""
    offset = value - 1.0
    if 0 < abs(offset) < 1e-3:
        return f"1 {'+' if offset > 0 else '−'} {abs(offset):.2g}"
    return f"{value + 0.0:.6g}"  # + 0.0 turns -0.0 into 0
