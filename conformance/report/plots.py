"""The report's pictures: token-level mismatch plots per suite and the RL smoke run's curves.

Each function returns one inline ``<svg>`` (as Markup). Points are down-sampled
deterministically to ``MAX_POINTS`` so a report of any size stays small and fast; the
statistics printed on the plots (PCC, counts, bins) use every token they are given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conformance.metric_table import BY_NAME
from conformance.report.html import Markup, number
from conformance.report.stats import (
    TokenSamples,
    abs_diff_by_position,
    downsample_indices,
    histogram,
    pearson,
    rho_by_prob_bin,
)
from conformance.report.svg import Frame, fmt, padded

if TYPE_CHECKING:
    from conformance.report.bounds import Closeness

#: most points one plot draws
MAX_POINTS = 1500
HIST_BINS = 40
#: the scatter's π difference below which every point sits within a pixel of y = x
SCATTER_RESOLUTION = 1 / 200
#: a bound is drawn when the data reaches this share of the way to it (else it is named)
BOUND_IN_VIEW = 0.05
#: rows of the fraction-of-bound chart that carry their labels; more are drawn thin
CLOSENESS_LABELS = 80
CLOSENESS_WIDTH = 1100

#: RL curves drawn, in display order, with their titles. A key is read from the row itself or
#: from a nested dict in it (the smoke run logs ``mismatch: {rho_std, pcc, ...}``); the rest of
#: rl.jsonl stays in the file.
RL_CURVES = {
    "reward": "reward",
    "rho_std": "mismatch (std ρ)",
    "entropy": "entropy",
    "grad_norm": "grad norm",
    "response_length": "response length",
    "accuracy": "accuracy",
    "pcc": "PCC π_train vs π_infer",
    "rho_outside_frac": "fraction of ρ outside the clip",
    "J": "J (objective surrogate, Eq. 23)",
    "lr": "learning rate",
}


@dataclass(frozen=True)
class TokenBounds:
    """The per-token bounds a suite's plots draw: the loosest over its checks (those a token
    must break to fail a check; a suite's checks share them unless a floor raised one)."""

    abs_diff_max: float | None = None
    rho_max: float | None = None
    rho_min: float | None = None

    @classmethod
    def of(cls, thresholds: Sequence[Mapping[str, float]]) -> TokenBounds:
        def loosest(name: str, pick: Callable[..., float]) -> float | None:
            found = [t[name] for t in thresholds if name in t]
            return pick(found) if found else None

        return cls(loosest("abs_diff_max", max), loosest("rho_max", max), loosest("rho_min", min))


def token_plots(
    samples: TokenSamples, bounds: TokenBounds = TokenBounds()
) -> tuple[list[Markup], list[str]]:
    """Fig. 3 scatter, |log ρ| histogram, Fig. 7 ρ by π_train bin, |Δlp| by position, each with
    its bound; and why any plot or bound was left out (a scatter whose every point sits on
    y = x tells nothing: the log-scale plots show those tokens)."""
    charts, left_out = [], []
    for plot in (prob_scatter, abs_log_ratio_histogram, rho_bins_plot, position_plot):
        chart, why = plot(samples, bounds)
        charts += [chart] if chart is not None else []
        left_out += [why] if why else []
    return charts, left_out


def prob_scatter(samples: TokenSamples, bounds: TokenBounds) -> tuple[Markup | None, str]:
    """π_train vs π_infer with y = x and the PCC (objective-level-hacking Fig. 3); where no
    point lies a pixel off y = x (``SCATTER_RESOLUTION`` of the axis), why it is not drawn."""
    p_train = [math.exp(v) for v in samples.lp_train]
    p_infer = [math.exp(v) for v in samples.lp_infer]
    pcc = pearson(p_train, p_infer)
    pcc_text = "PCC = n/a" if pcc is None else f"PCC = {number(pcc)}"
    furthest = max(abs(a - b) for a, b in zip(p_train, p_infer, strict=True))
    if furthest < SCATTER_RESOLUTION:
        return None, (
            f"π_train vs π_infer not drawn: every token within {fmt(furthest)} of y = x, "
            f"under a pixel ({pcc_text})"
        )
    frame = Frame("π_train vs π_infer", (0.0, 1.0), (0.0, 1.0), "π_train", "π_infer")
    frame.segment(0, 0, 1, 1, "diag")
    keep = downsample_indices(len(p_train), MAX_POINTS, [abs(d) for d in samples.log_ratio])
    frame.points([p_train[i] for i in keep], [p_infer[i] for i in keep])
    shown = f" · {len(keep)} of {len(p_train)} shown" if len(keep) < len(p_train) else ""
    frame.note(pcc_text + shown)
    return Markup(frame.render()), ""


def abs_log_ratio_histogram(samples: TokenSamples, bounds: TokenBounds) -> tuple[Markup, str]:
    """Distribution of |log ρ| = |lp_train − lp_infer| over the sampled tokens, in log-spaced
    bins (fp32 and bf16 mismatch both read on one axis), with the per-token bound
    ``abs_diff_max``; tokens at exactly 0 counted in a note."""
    magnitudes = [abs(v) for v in samples.log_ratio]
    positive = [v for v in magnitudes if v > 0]
    exact = len(magnitudes) - len(positive)
    bound = bounds.abs_diff_max if bounds.abs_diff_max else None
    if not positive:
        frame = Frame("|log ρ| histogram", (0.0, 1.0), (0.0, 1.0), "|log ρ|", "tokens")
        frame.note(f"all {exact} tokens at log ρ = 0 exactly")
        return Markup(frame.render(x_ticks=[], y_ticks=[])), ""
    edges, counts = histogram([math.log10(v) for v in positive], HIST_BINS)
    lo, hi = 10 ** edges[0], 10 ** edges[-1]
    if len(counts) == 1:  # one value: a bar a tenth of a decade wide around it
        lo, hi = lo / 10**0.05, hi * 10**0.05
        edges = [math.log10(lo), math.log10(hi)]
    x_range = (lo / 2, max(hi, bound or hi) * 2)
    frame = Frame(
        "|log ρ| histogram", x_range, (0.0, max(counts) * 1.15), "|log ρ| (log scale)", "tokens",
        log_x=True,
    )  # fmt: skip
    for k, c in enumerate(counts):
        if c:
            frame.rect(10 ** edges[k], 10 ** edges[k + 1], 0, c)
    if bound is not None:
        frame.vline(bound, f"bound {fmt(bound)}", "ref")
    if exact:
        frame.note(f"+ {exact} tokens at 0 exactly", line=1)
    return Markup(frame.render()), ""


def rho_bins_plot(samples: TokenSamples, bounds: TokenBounds) -> tuple[Markup, str]:
    """Mean ρ per π_train bin with its 5–95 % band and extremes (objective-level-hacking Fig. 7),
    with the bounds on max and min ρ where the data comes within ``BOUND_IN_VIEW`` of them;
    farther off, drawing them would flatten the data to a line, so the note says how far."""
    bins = rho_by_prob_bin(samples)
    y_lo, y_hi = min(min(b.min for b in bins), 1.0), max(max(b.max for b in bins), 1.0)
    drawn, far = [], []
    for bound, reach in ((bounds.rho_max, y_hi - 1), (bounds.rho_min, 1 - y_lo)):
        if bound is None:
            continue
        if reach >= BOUND_IN_VIEW * abs(bound - 1):
            drawn.append(bound)
        else:
            further = fmt(abs(bound - 1) / reach) if reach else "∞"
            far.append(f"{number(bound)} ({further}× further)")
    y_lo, y_hi = padded(min([y_lo, *drawn]), max([y_hi, *drawn]))
    frame = Frame("ρ by π_train bin", (-0.5, len(bins) - 0.5), (y_lo, y_hi), "π_train bin", "ρ")
    frame.segment(-0.5, 1, len(bins) - 0.5, 1, "diag")
    for k, b in enumerate(bins):
        frame.segment(k, b.min, k, b.max, "whisker")
        frame.rect(k - 0.22, k + 0.22, b.p05, b.p95, "band")
        frame.segment(k - 0.3, b.mean, k + 0.3, b.mean, "mean")
    for bound in drawn:
        frame.hline(bound, f"bound {fmt(bound)}")
    labels = [(k, f"{fmt(b.lo)}–{fmt(b.hi)}\nn={b.count}") for k, b in enumerate(bins)]
    why = f"ρ's bounds {', '.join(far)} than the furthest ρ: not drawn" if far else ""
    return Markup(frame.render(x_ticks=labels)), why


def position_plot(samples: TokenSamples, bounds: TokenBounds) -> tuple[Markup, str]:
    """Mean and max |Δlp| at each sequence position, on a log axis with the per-token bound:
    where along a rollout mismatch builds up, and how far below the bound it stays."""
    positions, means, maxes = abs_diff_by_position(samples)
    x_range = padded(positions[0], positions[-1])
    positive = [v for v in means + maxes if v > 0]
    bound = bounds.abs_diff_max if bounds.abs_diff_max else None
    title = "|Δlp| by position"
    if not positive:
        frame = Frame(title, x_range, (0.0, 1.0), "position", "|Δlp|")
        frame.note("every token's |Δlp| is 0")
        return Markup(frame.render(y_ticks=[])), ""
    floor = min(positive) / 2  # a position whose tokens all agree exactly sits on the floor
    top = max(max(maxes), bound or 0.0) * 2
    frame = Frame(title, x_range, (floor, top), "position", "|Δlp| (log scale)", log_y=True)
    keep = downsample_indices(len(positions), MAX_POINTS)
    xs = [positions[i] for i in keep]
    frame.polyline(xs, [max(maxes[i], floor) for i in keep], "ln max")
    frame.polyline(xs, [max(means[i], floor) for i in keep], "ln")
    if bound is not None:
        frame.hline(bound, f"bound {fmt(bound)}")
    frame.legend([("mean", "ln"), ("max", "ln max")])
    return Markup(frame.render()), ""


def closeness_chart(rows: Sequence[Closeness]) -> Markup:
    """One row per judged check, closest to its bound first: a bar to its worst metric's
    fraction of the bound on a log axis, the bound drawn at 1, the metric and value beside it.
    Past ``CLOSENESS_LABELS`` rows the rest are thin unlabelled rows (their titles name them)."""
    ordered = sorted(rows, key=lambda r: -r.fraction)
    finite = [r.fraction for r in ordered if 0 < r.fraction < math.inf]
    lo = min(min(finite, default=0.1), 0.1) / 3
    hi = max(max(finite, default=1.0), 1.0) * 3
    labelled = len(ordered) <= CLOSENESS_LABELS
    step = 15 if labelled else max(2, 15 * CLOSENESS_LABELS // len(ordered))
    height = 40 + 46 + step * len(ordered)
    frame = Frame(
        f"worst metric as a fraction of its bound, {len(ordered)} judged checks",
        (lo, hi), (len(ordered) - 0.5, -0.5), "fraction of the bound (log scale)",
        log_x=True, size=(CLOSENESS_WIDTH, height), margin=(380, 250, 40, 46),
    )  # fmt: skip
    for k, row in enumerate(ordered):
        where = min(max(row.fraction, lo), hi)
        failed = row.check.judgement == "fail"
        sign = BY_NAME[row.metric].sign() if row.metric in BY_NAME else "≤"
        said = f"{row.metric} {_near_one(row.value)}, bound {sign} {_near_one(row.bound)}"
        fraction = fraction_text(row.fraction)
        frame.open_group(
            f"fb {'fail' if failed else 'pass'}",
            f"{row.check.suite} › {row.check.name}: {said} → {fraction} of the bound",
            check=row.check.nodeid,
        )
        frame.segment(lo, k, where, k, "fbar")
        frame.points([where], [k], "fdot")
        if labelled:
            frame.label(frame.left - 6, frame.y(k), _short(row.check.name), "tk", "end")
            frame.label(frame.right + 6, frame.y(k), f"{fraction} · {said}", "tk")
        frame.close_group()
    frame.vline(1.0, "bound", "ref")
    return Markup(frame.render(y_ticks=[], cls="chart wide"))


def fraction_text(fraction: float) -> str:
    """A fraction of a bound as the chart and tables print it (∞: past a bound of 0, or NaN)."""
    return "∞" if fraction == math.inf else fmt(fraction)


def _near_one(value: float) -> str:
    """3 significant digits, or ``1 − d`` near 1 (a pcc or ρ bound), as a chart label."""
    return number(value) if 0 < abs(value - 1) < 1e-3 else fmt(value)


def _short(name: str, width: int = 62) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def rl_plots(
    curves: Sequence[Mapping[str, object]], markers: Sequence[tuple[float, str, str]]
) -> list[Markup]:
    """One small chart per ``RL_CURVES`` key present in the RL log, vs ``step``, with
    (step, label, class) markers — the mismatch alarm and the collapse step."""
    charts = []
    for key, title in RL_CURVES.items():
        pts = [
            (float(row.get("step", i)), value)
            for i, row in enumerate(curves)
            if (value := rl_value(row, key)) is not None
        ]
        if not pts:
            continue
        keep = downsample_indices(len(pts), MAX_POINTS)
        xs, ys = [pts[i][0] for i in keep], [pts[i][1] for i in keep]
        steps = [s for s, _, _ in markers]
        frame = Frame(
            title,
            padded(min(xs + steps), max(xs + steps)),
            padded(min(ys), max(ys)),
            "step",
        )
        frame.polyline(xs, ys)
        for step, label, cls in markers:
            frame.vline(step, label, cls)
        charts.append(Markup(frame.render()))
    return charts


def rl_value(row: Mapping[str, object], key: str) -> float | None:
    """``row[key]``, or ``row[group][key]`` for a nested dict group; None when not a number."""
    candidates = [row.get(key)] + [g.get(key) for g in row.values() if isinstance(g, Mapping)]
    return next((float(v) for v in candidates if _number(v)), None)  # type: ignore[arg-type]


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
