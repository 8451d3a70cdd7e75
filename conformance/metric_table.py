"""Every fact about every metric (the mismatch metrics and the properties' own findings), in
one table that every module reads.

A metric's name, its ideal value, which side of a threshold is a violation, whether it bounds a
single example (so Hypothesis can shrink a violation to a minimal reproducer) or a test's pooled
tokens (averages, spreads and correlations describe a population: one token's ρ is not a mean ρ),
whether the terminal summary shows it, and where it comes from. Torch-free, so the report, the
gate and the certificate read it without importing torch. The formulas are in
:func:`conformance.metrics.mismatch_metrics`.

Bounds:

- ``max``: violated when ``value > threshold`` (|Δlp|, k2, k3, …);
- ``min``: violated when ``value < threshold`` (PCC, exact-match rate, min ρ);
- ``abs``: two-sided around the ideal, violated when ``|value − ideal| > |threshold − ideal|``
  (signed metrics: mean ρ, k1 and χ² are as wrong below their ideal as above it).

NaN violates every bound. The *worst* of several values of one metric is the one furthest from
its ideal (NaN worst of all): the report, the certificate and the gate all use that one rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

Bound = Literal["max", "min", "abs"]
Scope = Literal["example", "pooled"]

#: π_train bin edges for ρ by probability: finer at low probability, where objective-level
#: hacking §5.3 / Fig. 7 finds ρ most dispersed (its token-weight distortion targets π < 0.1)
PROB_BIN_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1.0)


@dataclass(frozen=True)
class Metric:
    """One metric's facts. ``source`` names who uses it."""

    name: str
    ideal: float
    bound: Bound
    scope: Scope
    meaning: str
    source: str
    #: shown in the terminal verdict table
    headline: bool = False
    #: grows with sequence length, so no one threshold fits 4 and 4,000 tokens: the shipped
    #: profiles bound its ``_per_sqrt_len`` counterpart and only record this one
    grows_with_length: bool = False
    #: computed on ρ = e^{log r} itself, or on one token's probabilities: one token off by nats
    #: moves it by orders of magnitude, or across the whole of [0, 1], so on an MoE model whose
    #: routes flip no calibration bounds it (``calibrate`` leaves it out there)
    exp_scale: bool = False
    #: a sum over the pool scaled by 1/√n: noise keeps it level, but the reference stack's own
    #: small systematic bias grows it as √n, so a profile's bound holds up to the largest pool
    #: it was calibrated on and grows as √(n / that pool) past it (``Profile.bounds``)
    pool_scaled: bool = False
    #: what computes it: ``mismatch`` (``conformance.metrics.mismatch_metrics``, every stack) or
    #: ``routing`` (``conformance.routing.routing_metrics``, MoE stacks reporting routes);
    #: ``property``: a property's own finding, bounded by the suite that measures it (a count
    #: that must stay 0, a p-value above the test's share of the run's false alarms), never by
    #: a profile
    family: Literal["mismatch", "routing", "property"] = "mismatch"
    #: a pooled mean of a quantity that moves this many times as far as log ρ near ρ = 1
    #: (ρ − 1 ≈ log ρ, ρ² − 1 ≈ 2 log ρ): over n tokens whose log ρ spreads by σ it strays from
    #: its ideal by ≈ slope·σ/√n to either side, so a profile's bound on it is at least a few
    #: of those standard errors (``Profile.bounds``)
    noise_slope: float | None = None
    #: averaged over one side of the routing split alone, the tokens whose routes ``flipped``
    #: in some MoE layer or ``kept`` in every one: a profile judges it by that side's own
    #: number of tokens (:func:`tokens_averaged`)
    part: Literal["flipped", "kept"] | None = None
    #: the per-token metric it equals over sequences of one token: a |Σ log ρ|/√T is its one
    #: token's |log ρ| when T = 1, and the suites draw rollouts from one token up while a
    #: calibration's are 32 or more, over which one token far off is diluted; so a profile's
    #: bound on it is at least that metric's (``Profile.bounds``)
    one_token: str | None = None

    def deviation(self, value: float) -> float:
        """Distance from the ideal value (NaN stays NaN)."""
        return abs(value - self.ideal)

    def violates(self, value: float, threshold: float) -> bool:
        """Whether ``value`` is on the wrong side of ``threshold``; NaN always is."""
        if math.isnan(value):
            return True
        if self.bound == "max":
            return value > threshold
        if self.bound == "min":
            return value < threshold
        return self.deviation(value) > self.deviation(threshold)

    def relation(self, value: float, threshold: float) -> str:
        """How a violation reads: ``"0.2 > 0.1"``, ``"0.9 < 0.99"``, ``"|0.9 − 1| > 0.01"``."""
        if self.bound == "abs":
            return (
                f"|{value:.4g} − {self.ideal:g}| > {self.deviation(threshold):.4g}"
                if self.ideal
                else f"|{value:.4g}| > {self.deviation(threshold):.4g}"
            )
        return f"{value:.4g} {'>' if self.bound == 'max' else '<'} {threshold:.4g}"

    def sign(self) -> str:
        """The allowed side of a threshold, as a report writes it."""
        return {"max": "≤", "min": "≥", "abs": "±"}[self.bound]


METRICS: tuple[Metric, ...] = (
    Metric("nonfinite_tokens", 0.0, "max", "example",
           "valid tokens whose log-probability is NaN or ±inf on either side (excluded from "
           "every other metric)", "tim-conformance"),
    Metric("abs_diff_mean", 0.0, "max", "pooled", "mean |log ρ|", "slime, SkyRL",
           headline=True),
    Metric("abs_diff_p99", 0.0, "max", "pooled", "99th percentile of |log ρ|", "slime"),
    Metric("abs_diff_max", 0.0, "max", "example", "max |log ρ|", "slime, SkyRL",
           headline=True),
    Metric("prob_diff_mean", 0.0, "max", "pooled", "mean |π_train − π_infer|", "verl"),
    Metric("prob_diff_max", 0.0, "max", "example", "max |π_train − π_infer|", "verl",
           exp_scale=True),
    Metric("rho_mean", 1.0, "abs", "pooled", "mean ρ", "objective-level hacking App. B.1",
           exp_scale=True, noise_slope=1.0),
    Metric("rho_std", 0.0, "max", "pooled", "std of ρ: the mismatch",
           "objective-level hacking §2", headline=True, exp_scale=True),
    Metric("rho_max", 1.0, "max", "example", "max ρ", "objective-level hacking App. B.1",
           exp_scale=True),
    Metric("rho_min", 1.0, "min", "example", "min ρ", "objective-level hacking App. B.1",
           exp_scale=True),
    Metric("pcc", 1.0, "min", "pooled", "Pearson correlation of π_train and π_infer",
           "objective-level hacking §4.2", headline=True),
    Metric("log_ppl_abs_diff", 0.0, "max", "pooled",
           "mean over sequences of |Σ_t log ρ|", "lr-scheduling Eq. 8",
           grows_with_length=True),
    Metric("log_ppl_abs_diff_per_sqrt_len", 0.0, "max", "pooled",
           "mean over sequences of |Σ_t log ρ| / √T: length-free for independent per-token "
           "noise, growing as √T under a per-token bias", "lr-scheduling Eq. 8, scaled",
           one_token="abs_diff_mean"),
    Metric("k1", 0.0, "abs", "pooled", "mean −log ρ (KL estimator)", "verl rollout_corr",
           noise_slope=1.0),
    Metric("log_ratio_sum_per_sqrt_tokens", 0.0, "max", "pooled",
           "|Σ log ρ| / √n over the n pooled tokens (|k1|·√n): ≈ σ·|z| for unbiased per-token "
           "noise at any pool size, b·√n under a per-token bias b, so a large pool sees a bias "
           "far inside k1's bound", "tim-conformance: k1 as a z-statistic", pool_scaled=True),
    Metric("k2", 0.0, "max", "pooled", "mean ½(log ρ)² (KL estimator)", "verl rollout_corr"),
    Metric("k3", 0.0, "max", "pooled", "mean ρ − 1 − log ρ (KL estimator)",
           "verl rollout_corr, SGLang", headline=True, exp_scale=True),
    Metric("chi2_token", 0.0, "abs", "pooled", "E[ρ²] − 1", "verl", exp_scale=True,
           noise_slope=2.0),
    Metric("token_mult_prob_error", 1.0, "max", "pooled", "mean exp(|log ρ|)",
           "NeMo-RL, Megatron", exp_scale=True),
    Metric("exact_match_rate", 1.0, "min", "pooled",
           "fraction of tokens with lp_train == lp_infer bitwise", "VeXact, slime"),
    Metric("seq_log_ratio_abs_max", 0.0, "max", "example",
           "max over sequences of |Σ_t log ρ|", "tim-explainer", grows_with_length=True),
    Metric("seq_log_ratio_per_sqrt_len_max", 0.0, "max", "example",
           "max over sequences of |Σ_t log ρ| / √T: one bound that holds at every length",
           "tim-explainer, scaled", one_token="abs_diff_max"),
    # MoE stacks where both sides report routes (conformance.routing.routing_metrics)
    Metric("route_agreement", 1.0, "min", "pooled",
           "fraction of (token, MoE layer) whose top-k expert sets agree", "R3 §2.2",
           family="routing"),
    Metric("route_flip_tokens", 0.0, "max", "pooled",
           "fraction of tokens routed differently in at least one MoE layer", "R3 §2.2",
           family="routing"),
    Metric("abs_diff_mean_route_kept", 0.0, "max", "pooled",
           "mean |log ρ| over tokens routed alike in every layer", "R3, Miles #2722",
           family="routing", part="kept"),
    Metric("abs_diff_mean_route_flipped", 0.0, "max", "pooled",
           "mean |log ρ| over tokens with a routing flip", "R3, Miles #2722",
           family="routing", part="flipped"),
    # the properties' own findings (conformance.recorder.Recorder.fail's ``breach``)
    Metric("out_of_support_tokens", 0.0, "max", "example",
           "sampled tokens outside the stated sampler's support: processed probability 0, "
           "ρ infinite (conformance.support_audit)", "transformers#23088, NeMo-RL#237",
           family="property"),
    Metric("improbable_identical_children", 0.0, "max", "example",
           "pairs of a request's n children identical on a sequence independent draws repeat "
           "less often than the test's false-alarm share (suites/test_group_sampling.py)",
           "tt-metal#53077", family="property"),
    Metric("sampler_p_value", 1.0, "min", "example",
           "p-value that the sampled tokens follow the spec's distribution: their randomized "
           "PIT's uniformity and the top token's share (conformance.sampler_stats)",
           "tim-conformance", family="property"),
    Metric("sampler_logp_p_value", 1.0, "min", "example",
           "two-sided p-value of the sampled tokens' summed log-probabilities under the spec's "
           "distribution against their mean and spread there: a sampler sharper or flatter than "
           "stated inside the support (conformance.sampler_stats.logp_score)",
           "transformers#47932", family="property"),
    Metric("rollouts_changed_on_rerun", 0.0, "max", "example",
           "seeded rollouts whose tokens changed when the same request ran again (again, "
           "alone, or after a preemption)", "vllm#19940", family="property"),
    Metric("rollouts_past_stop", 0.0, "max", "example",
           "rollouts whose text runs on past one of their stop strings", "tim-conformance",
           family="property"),
    Metric("rho_std_over_floor", 1.0, "min", "example",
           "measured std ρ over the simulated rounding floor of the run's precision: far below "
           "1 the measurement is broken (conformance.floor)", "tim-conformance",
           family="property"),
    Metric("malformed_answers", 0.0, "max", "example",
           "engine or backend answers not in the shape their protocol promises (a result per "
           "input, a log-prob per token, an ending as finish_reason says; conformance.guard)",
           "sglang#20724", family="property"),
    Metric("top_logprobs_abs_diff_max", 0.0, "max", "example",
           "max |Δ| of a request's reported top-k log-probs against the backend's",
           "vllm#51789", family="property"),
)  # fmt: skip


class Breach(NamedTuple):
    """One metric on the wrong side of its threshold: as :meth:`conformance.profiles.Profile.check`
    finds it, or as a property names its own finding (``Recorder.fail``). The report records it
    as ``conformance.report.schema.Violation``."""

    metric: str
    value: float
    threshold: float
    bound: Bound

    def __str__(self) -> str:
        return f"{self.metric} = {metric(self.metric).relation(self.value, self.threshold)}"


def breach(name: str, value: float, threshold: float) -> Breach:
    """``name``'s value on the wrong side of ``threshold``, with the table's bound."""
    return Breach(name, float(value), float(threshold), metric(name).bound)


BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
#: every metric name, in report order
METRIC_NAMES: tuple[str, ...] = tuple(BY_NAME)
#: the metrics ``mismatch_metrics`` computes for every stack, in report order
MISMATCH_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.family == "mismatch")
#: the metrics bounded on every example (the others on a test's pooled tokens)
EXAMPLE_METRICS = frozenset(m.name for m in METRICS if m.scope == "example")
HEADLINE_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.headline)


def metric(name: str) -> Metric:
    """The facts of ``name``; ``KeyError`` names the known metrics."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}") from None


def tokens_averaged(name: str, metrics: Mapping[str, float], tokens: int) -> int:
    """How many of a pool's ``tokens`` the metric ``name`` averages: all of them, or for a
    mean over one side of the routing split (``Metric.part``) that side's, from the pool's
    flipped share ``route_flip_tokens`` (all of them where that was not measured).

    >>> tokens_averaged("abs_diff_mean_route_flipped", {"route_flip_tokens": 0.25}, 12)
    3
    """
    part = metric(name).part
    share = metrics.get("route_flip_tokens")
    if part is None or share is None or not math.isfinite(share):
        return tokens
    flipped = round(share * tokens)
    return flipped if part == "flipped" else tokens - flipped


def worst(name: str, values: Iterable[object]) -> float | None:
    """Of the numbers among ``values``, the one furthest from the metric's ideal; NaN beats
    every number (a NaN metric means the measurement broke). ``None`` when there is none.

    >>> worst("rho_mean", [1.01, 0.97, 1.02])
    0.97
    """
    fact = metric(name)
    best: float | None = None
    for value in values:
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        v = float(value)
        if math.isnan(v):
            return v
        if best is None or fact.deviation(v) > fact.deviation(best):
            best = v
    return best


def worst_metrics(metric_dicts: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Per known metric present in any of ``metric_dicts``, its worst value, in report order."""
    values: dict[str, list[object]] = {}
    for metrics in metric_dicts:
        for name, value in metrics.items():
            if name in BY_NAME:
                values.setdefault(name, []).append(value)
    result = {name: worst(name, values[name]) for name in METRIC_NAMES if name in values}
    return {name: value for name, value in result.items() if value is not None}


#: sampler fidelity (``suites/test_sampler_fidelity.py``): the false alarms per certify run its
#: fidelity tests may raise together on a sound engine; each of a run's tests is held to this
#: share of it (Bonferroni), so a run alarms on a sound engine at most once in 1,000
SAMPLER_FALSE_ALARMS_PER_RUN = 1e-3
#: equal bins of the fidelity test's χ² (``conformance.sampler_stats``): ~100 tokens
#: expected per bin at the suite's 2,048 tokens per test, so one bin's excess of 5 % of the
#: tokens (a token the sampler should have cut) stands out
SAMPLER_BINS = 20
#: group independence (``suites/test_group_sampling.py``): the false alarms per certify run its
#: identical-children tests may raise together on a sound engine (a bound, not an estimate:
#: the suite's docstring derives it), shared between its tests as the sampler's are
GROUP_FALSE_ALARMS_PER_RUN = 1e-3
