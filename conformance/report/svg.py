"""Inline SVG charts as strings: a frame with nice ticks, and the few marks the report draws.

Styling lives in report.css (classes ``ax``, ``grid``, ``pt``, ``ref``, ``bar``, ``ln``, ...);
every text that reaches the SVG goes through ``esc``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from conformance.report.html import esc

WIDTH, HEIGHT = 300, 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 50, 10, 26, 46


def fmt(v: float, step: float | None = None) -> str:
    """Compact label: 3 significant digits, or as many as tell ticks ``step`` apart (ρ ticks
    around 1 a few 1e-7 apart must not all read "1")."""
    if v == 0:
        return "0"
    digits = 3
    if step:
        digits = max(3, min(15, math.ceil(math.log10(abs(v) / step)) + 1))
    return f"{v:.{digits}g}".replace("e-0", "e-").replace("e+0", "e")


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering ``[lo, hi]``."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    k = 0
    while first + k * step <= hi + step * 1e-9:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks


def padded(lo: float, hi: float) -> tuple[float, float]:
    """A data range with 4 % headroom, widened around a single value."""
    if hi == lo:
        span = abs(lo) * 0.1 or 1.0
        return lo - span, hi + span
    pad = (hi - lo) * 0.04
    return lo - pad, hi + pad


def log_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    """Powers of ten covering ``[lo, hi]`` (both > 0), every other one or sparser past
    ``count`` of them."""
    first, last = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    step = max(1, math.ceil((last - first + 1) / count))
    return [10.0**k for k in range(first, last + 1, step) if lo <= 10.0**k <= hi * (1 + 1e-9)]


@dataclass
class Frame:
    """Axes mapping data coordinates to a ``size`` SVG (``WIDTH × HEIGHT`` by default), with
    marks added in order; a ``log_x``/``log_y`` axis maps log10 of its values (all > 0)."""

    title: str
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    x_label: str = ""
    y_label: str = ""
    marks: list[str] = field(default_factory=list)
    log_x: bool = False
    log_y: bool = False
    size: tuple[int, int] = (WIDTH, HEIGHT)
    #: left, right, top, bottom
    margin: tuple[int, int, int, int] = (MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM)

    @property
    def left(self) -> int:
        return self.margin[0]

    @property
    def right(self) -> int:
        return self.size[0] - self.margin[1]

    @property
    def top(self) -> int:
        return self.margin[2]

    @property
    def bottom(self) -> int:
        return self.size[1] - self.margin[3]

    def x(self, v: float) -> float:
        return self.left + _share(v, self.x_range, self.log_x) * (self.right - self.left)

    def y(self, v: float) -> float:
        return self.bottom - _share(v, self.y_range, self.log_y) * (self.bottom - self.top)

    def points(self, xs: Sequence[float], ys: Sequence[float], cls: str = "pt") -> None:
        # one path of zero-length round-capped segments: a tenth of the bytes of <circle>s
        d = "".join(f"M{self.x(a):.1f} {self.y(b):.1f}h0" for a, b in zip(xs, ys, strict=True))
        self.marks.append(f'<path class="{cls}" d="{d}"/>')

    def polyline(self, xs: Sequence[float], ys: Sequence[float], cls: str = "ln") -> None:
        pts = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in zip(xs, ys, strict=True))
        self.marks.append(f'<polyline class="{cls}" points="{pts}"/>')

    def segment(self, x0: float, y0: float, x1: float, y1: float, cls: str = "ref") -> None:
        self.marks.append(
            f'<line class="{cls}" x1="{self.x(x0):.1f}" y1="{self.y(y0):.1f}" '
            f'x2="{self.x(x1):.1f}" y2="{self.y(y1):.1f}"/>'
        )

    def rect(self, x0: float, x1: float, y0: float, y1: float, cls: str = "bar") -> None:
        left, right = sorted((self.x(x0), self.x(x1)))
        top, bottom = sorted((self.y(y0), self.y(y1)))
        self.marks.append(
            f'<rect class="{cls}" x="{left:.1f}" y="{top:.1f}" '
            f'width="{max(right - left, 0.8):.1f}" height="{max(bottom - top, 0.8):.1f}"/>'
        )

    def vline(self, v: float, label: str, cls: str) -> None:
        """A full-height marker at x = v with a label at its top (RL alarm/collapse steps, a
        bound)."""
        lo, hi = self.y_range
        self.segment(v, lo, v, hi, cls)
        x = self.x(v)
        # near the right edge the label reads leftwards from the line, inside the frame
        at = f'x="{x - 3:.1f}" text-anchor="end"' if x > self.right - 70 else f'x="{x + 3:.1f}"'
        self.marks.append(f'<text class="mk {cls}" {at} y="{self.top + 10}">{esc(label)}</text>')

    def hline(self, v: float, label: str, cls: str = "ref") -> None:
        """A full-width marker at y = v with a label above its left end (a bound; the
        legend keeps the top right)."""
        lo, hi = self.x_range
        self.segment(lo, v, hi, v, cls)
        self.marks.append(
            f'<text class="mk {cls}" x="{self.left + 3}" y="{self.y(v) - 3:.1f}">'
            f"{esc(label)}</text>"
        )

    def label(
        self, x: float, y: float, text: str, cls: str = "note", anchor: str = "start"
    ) -> None:
        """``text`` at pixel (x, y), vertically centred on y (a row's label beside the axes)."""
        self.marks.append(
            f'<text class="{cls}" x="{x:.1f}" y="{y + 3.5:.1f}" text-anchor="{anchor}">'
            f"{esc(text)}</text>"
        )

    def open_group(self, cls: str, title: str, **data: str) -> None:
        """Start a group of marks (one chart row) with a tooltip and ``data-*`` attributes;
        :meth:`close_group` ends it."""
        attrs = "".join(f' data-{key}="{esc(value)}"' for key, value in data.items())
        self.marks.append(f'<g class="{cls}"{attrs}><title>{esc(title)}</title>')

    def close_group(self) -> None:
        self.marks.append("</g>")

    def note(self, text: str, line: int = 0) -> None:
        """Annotation in the top-left corner of the plot area (Fig. 3 puts the PCC there);
        ``line`` stacks several."""
        self.marks.append(
            f'<text class="note" x="{self.left + 6}" y="{self.top + 14 + 13 * line}">'
            f"{esc(text)}</text>"
        )

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """(label, line class) entries in the top-right corner of the plot area."""
        right = self.right - 8
        for k, (label, cls) in enumerate(items):
            y = self.top + 10 + 13 * k
            self.marks.append(
                f'<line class="{cls}" x1="{right - 16}" y1="{y - 3}" x2="{right}" y2="{y - 3}"/>'
                f'<text class="note" x="{right - 20}" y="{y}" text-anchor="end">{esc(label)}</text>'
            )

    def render(
        self,
        x_ticks: Sequence[tuple[float, str]] | None = None,
        y_ticks: Sequence[tuple[float, str]] | None = None,
        cls: str = "chart",
    ) -> str:
        """The whole ``<svg>``; ``x_ticks``/``y_ticks`` replace the numeric ticks with (value,
        label) pairs (an empty list draws none)."""
        if x_ticks is None:
            x_ticks = _labelled(_ticks(self.x_range, self.log_x))
        if y_ticks is None:
            y_ticks = _labelled(_ticks(self.y_range, self.log_y))
        bottom, left, right = self.bottom, self.left, self.right
        width, height = self.size
        parts = [
            f'<svg class="{cls}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="{esc(self.title)}"><title>{esc(self.title)}</title>',
            f'<text class="ttl" x="{left}" y="14">{esc(self.title)}</text>',
        ]
        for v, label in y_ticks:
            y = self.y(v)
            parts.append(
                f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" '
                f'y2="{y:.1f}"/><text class="tk" x="{left - 4}" y="{y + 3:.1f}" '
                f'text-anchor="end">{esc(label)}</text>'
            )
        for v, label in x_ticks:
            x = self.x(v)
            parts.append(
                f'<line class="ax" x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}"/>'
                f'<text class="tk" x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
                f"{_lines(label, x)}</text>"
            )
        parts.append(f'<path class="ax" d="M{left} {self.top}V{bottom}H{right}"/>')
        parts.extend(self.marks)
        parts.append(
            f'<text class="lbl" x="{(left + right) / 2:.0f}" y="{height - 6}" '
            f'text-anchor="middle">{esc(self.x_label)}</text>'
            f'<text class="lbl" transform="translate(12 {(self.top + bottom) / 2:.0f}) '
            f'rotate(-90)" text-anchor="middle">{esc(self.y_label)}</text></svg>'
        )
        return "".join(parts)


def _share(v: float, span: tuple[float, float], log: bool) -> float:
    """Where ``v`` lies along ``span``, 0 at its start and 1 at its end."""
    lo, hi = span
    if log:
        return (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    return (v - lo) / (hi - lo)


def _ticks(span: tuple[float, float], log: bool) -> list[float]:
    return log_ticks(*span) if log else nice_ticks(*span)


def _labelled(ticks: list[float]) -> list[tuple[float, str]]:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else None
    return [(t, fmt(t, step)) for t in ticks]


def _lines(label: str, x: float) -> str:
    """A tick label; each ``\n`` starts a new line below."""
    first, *rest = label.split("\n")
    return esc(first) + "".join(f'<tspan x="{x:.1f}" dy="11">{esc(line)}</tspan>' for line in rest)
