"""The report's pictures: token-level mismatch plots per suite and the RL smoke run's curves.

Each function returns one inline ``<svg>`` (as Markup). Points are down-sampled
deterministically to ``MAX_POINTS`` so a report of any size stays small and fast; the
statistics printed on the plots (PCC, counts, bins) use every token they are given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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

#: most points one plot draws
MAX_POINTS = 1500
HIST_BINS = 40

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


def token_plots(samples: TokenSamples) -> list[Markup]:
    """Fig. 3 scatter, log-ratio histogram, Fig. 7 ρ by π_train bin, |Δlp| by position."""
    return [
        prob_scatter(samples),
        log_ratio_histogram(samples),
        rho_bins_plot(samples),
        position_plot(samples),
    ]


def prob_scatter(samples: TokenSamples) -> Markup:
    """π_train vs π_infer with y = x and the PCC (objective-level-hacking Fig. 3)."""
    p_train = [math.exp(v) for v in samples.lp_train]
    p_infer = [math.exp(v) for v in samples.lp_infer]
    frame = Frame("π_train vs π_infer", (0.0, 1.0), (0.0, 1.0), "π_train", "π_infer")
    frame.segment(0, 0, 1, 1, "ref")
    keep = downsample_indices(len(p_train), MAX_POINTS, [abs(d) for d in samples.log_ratio])
    frame.points([p_train[i] for i in keep], [p_infer[i] for i in keep])
    pcc = pearson(p_train, p_infer)
    shown = f" · {len(keep)} of {len(p_train)} shown" if len(keep) < len(p_train) else ""
    frame.note(("PCC = n/a" if pcc is None else f"PCC = {number(pcc)}") + shown)
    return Markup(frame.render())


def log_ratio_histogram(samples: TokenSamples) -> Markup:
    """Distribution of log r = lp_train − lp_infer over all sampled tokens."""
    edges, counts = histogram(samples.log_ratio, HIST_BINS)
    x_range = padded(edges[0], edges[-1])
    frame = Frame("log ratio histogram", x_range, (0.0, max(counts) * 1.08), "log r", "tokens")
    if len(counts) == 1:
        frame.rect(edges[0] - (x_range[1] - x_range[0]) / 100, edges[0], 0, counts[0])
        frame.note(f"all {counts[0]} tokens at log r = {fmt(edges[0])}")
    else:
        for k, c in enumerate(counts):
            if c:
                frame.rect(edges[k], edges[k + 1], 0, c)
    if x_range[0] <= 0 <= x_range[1]:
        frame.segment(0, 0, 0, max(counts) * 1.08, "ref")
    return Markup(frame.render())


def rho_bins_plot(samples: TokenSamples) -> Markup:
    """Mean ρ per π_train bin with its 5–95 % band and extremes (objective-level-hacking Fig. 7)."""
    bins = rho_by_prob_bin(samples)
    y_lo, y_hi = padded(min(min(b.min for b in bins), 1.0), max(max(b.max for b in bins), 1.0))
    frame = Frame("ρ by π_train bin", (-0.5, len(bins) - 0.5), (y_lo, y_hi), "π_train bin", "ρ")
    frame.segment(-0.5, 1, len(bins) - 0.5, 1, "ref")
    for k, b in enumerate(bins):
        frame.segment(k, b.min, k, b.max, "whisker")
        frame.rect(k - 0.22, k + 0.22, b.p05, b.p95, "band")
        frame.segment(k - 0.3, b.mean, k + 0.3, b.mean, "mean")
    labels = [(k, f"{fmt(b.lo)}–{fmt(b.hi)}\nn={b.count}") for k, b in enumerate(bins)]
    return Markup(frame.render(x_ticks=labels))


def position_plot(samples: TokenSamples) -> Markup:
    """Mean and max |Δlp| at each sequence position: where along a rollout mismatch builds up."""
    positions, means, maxes = abs_diff_by_position(samples)
    x_range = padded(positions[0], positions[-1])
    frame = Frame(
        "|Δlp| by position", x_range, (0.0, max(maxes) * 1.08 or 1.0), "position", "|Δlp|"
    )
    keep = downsample_indices(len(positions), MAX_POINTS)
    frame.polyline([positions[i] for i in keep], [maxes[i] for i in keep], "ln max")
    frame.polyline([positions[i] for i in keep], [means[i] for i in keep], "ln")
    frame.legend([("mean", "ln"), ("max", "ln max")])
    return Markup(frame.render())


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
