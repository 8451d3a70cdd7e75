"""Plot data from report.json's token samples, in pure Python (the report must not need torch).

Each function takes the per-token lists a check stores under ``samples`` (``lp_train``,
``lp_infer``, ``position``) and returns plain numbers. The mismatch quantities follow
objective-level-hacking §2: log r = lp_train − lp_infer, ρ = exp(log r).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from conformance.metric_table import BY_NAME, PROB_BIN_EDGES


@dataclass(frozen=True)
class TokenSamples:
    """Pooled token samples of one suite: parallel lists, one entry per valid token."""

    lp_train: list[float]
    lp_infer: list[float]
    position: list[int]

    def __len__(self) -> int:
        return len(self.lp_train)

    @property
    def log_ratio(self) -> list[float]:
        return [a - b for a, b in zip(self.lp_train, self.lp_infer, strict=True)]


@dataclass(frozen=True)
class BinSummary:
    """ρ over the tokens whose π_train lies in ``[lo, hi)``."""

    lo: float
    hi: float
    count: int
    mean: float
    p05: float
    p95: float
    min: float
    max: float


def fraction_of_bound(metric: str, value: float, bound: float) -> float:
    """How far ``value`` went towards ``bound``: its departure from the metric's ideal over the
    departure the bound allows, so 1 is at the bound whichever side it lies on (for a lower
    bound such as pcc ≥ 1 − 1e-6, a pcc of 1 − 5e-7 is 0.5). A value on the good side of the
    ideal is 0; NaN, and any departure from a bound at the ideal itself (a count held to 0), is
    infinite. A metric the table does not know is read as an upper bound with ideal 0.

    >>> fraction_of_bound("pcc", 0.75, 0.5), fraction_of_bound("abs_diff_max", 3.0, 2.0)
    (0.5, 1.5)
    """
    fact = BY_NAME.get(metric)
    ideal, side = (fact.ideal, fact.bound) if fact else (0.0, "max")
    if math.isnan(value):
        return math.inf
    departure = {"max": value - ideal, "min": ideal - value, "abs": abs(value - ideal)}[side]
    allowed = abs(bound - ideal)
    if departure <= 0:
        return 0.0
    return departure / allowed if allowed else math.inf


def pool_samples(samples: Sequence[dict], cap: int | None = None) -> TokenSamples:
    """Concatenate the ``samples`` dicts of several checks, dropping non-finite pairs.

    With ``cap``, an even stride over the checks keeps about ``cap`` tokens (whole checks,
    so each kept check's positions stay together). ``position`` defaults to the index within
    each check when a check did not record it.
    """
    total = sum(len(s.get("lp_train") or []) for s in samples)
    if cap is not None and total > cap:
        samples = samples[:: math.ceil(total / cap)]
    lp_train: list[float] = []
    lp_infer: list[float] = []
    position: list[int] = []
    for sample in samples:
        train, infer = sample.get("lp_train") or [], sample.get("lp_infer") or []
        pos = sample.get("position") or list(range(len(train)))
        for a, b, p in zip(train, infer, pos, strict=False):
            if _finite(a) and _finite(b):
                lp_train.append(float(a))
                lp_infer.append(float(b))
                position.append(int(p))
    return TokenSamples(lp_train, lp_infer, position)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation Σ(x−x̄)(y−ȳ) / √(Σ(x−x̄)² Σ(y−ȳ)²); None when a side is constant.

    The PCC of π_train and π_infer is objective-level-hacking's Fig. 3 annotation.
    """
    n = len(xs)
    if n < 2:
        return None
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def histogram(values: Sequence[float], bins: int) -> tuple[list[float], list[int]]:
    """Equal-width histogram over ``[min, max]``: ``bins + 1`` edges and ``bins`` counts.

    All-equal values give one bin of width 0 holding every value.
    """
    lo, hi = min(values), max(values)
    if lo == hi:
        return [lo, hi], [len(values)]
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    return [lo + i * width for i in range(bins + 1)], counts


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q``-quantile of an ascending, non-empty sequence."""
    pos = q * (len(sorted_values) - 1)
    i = int(pos)
    j = min(i + 1, len(sorted_values) - 1)
    return sorted_values[i] + (sorted_values[j] - sorted_values[i]) * (pos - i)


def rho_by_prob_bin(
    samples: TokenSamples, edges: Sequence[float] = PROB_BIN_EDGES
) -> list[BinSummary]:
    """ρ = exp(lp_train − lp_infer) summarised per π_train = exp(lp_train) bin.

    objective-level-hacking Fig. 7a: low-probability tokens spread further from ρ = 1. Bins
    are half-open ``[lo, hi)`` except the last, which includes 1.0; empty bins are left out.
    """
    groups: list[list[float]] = [[] for _ in range(len(edges) - 1)]
    for a, b in zip(samples.lp_train, samples.lp_infer, strict=True):
        p = math.exp(a)
        for k in range(len(groups)):
            if p < edges[k + 1] or k == len(groups) - 1:
                groups[k].append(math.exp(a - b))
                break
    out = []
    for k, rhos in enumerate(groups):
        if rhos:
            rhos.sort()
            out.append(
                BinSummary(
                    lo=edges[k],
                    hi=edges[k + 1],
                    count=len(rhos),
                    mean=math.fsum(rhos) / len(rhos),
                    p05=quantile(rhos, 0.05),
                    p95=quantile(rhos, 0.95),
                    min=rhos[0],
                    max=rhos[-1],
                )
            )
    return out


def abs_diff_by_position(samples: TokenSamples) -> tuple[list[int], list[float], list[float]]:
    """Per sequence position t: positions, mean |Δlp| and max |Δlp| over tokens at t."""
    by_pos: dict[int, list[float]] = {}
    for t, d in zip(samples.position, samples.log_ratio, strict=True):
        by_pos.setdefault(t, []).append(abs(d))
    positions = sorted(by_pos)
    means = [math.fsum(by_pos[t]) / len(by_pos[t]) for t in positions]
    maxes = [max(by_pos[t]) for t in positions]
    return positions, means, maxes


def downsample_indices(n: int, cap: int, keep: Sequence[float] | None = None) -> list[int]:
    """Deterministic subset of ``range(n)`` of at most ``cap`` indices, ascending.

    With ``keep`` (a score per index), the top quarter of the budget goes to the highest scores
    — the outliers a reader looks for — and the rest is an even stride over the remainder.
    """
    if n <= cap:
        return list(range(n))
    chosen: set[int] = set()
    if keep is not None:
        chosen.update(sorted(range(n), key=lambda i: keep[i], reverse=True)[: cap // 4])
    rest = [i for i in range(n) if i not in chosen]
    budget = cap - len(chosen)
    stride = len(rest) / budget
    chosen.update(rest[int(k * stride)] for k in range(budget))
    return sorted(chosen)


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)
