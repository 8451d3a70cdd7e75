"""Tolerance profiles: one threshold per mismatch metric, shipped as TOML in this package.

A profile file is a flat table ``metric = threshold``, plus an optional ``description``,
``min_pooled_tokens``, ``max_pooled_tokens``, ``[suites.NAME]`` tables and a ``[provenance]``
table. ``max_pooled_tokens`` is the largest pool the calibration measured: a pool-scaled
metric's bound (``Metric.pool_scaled``, |Σ log ρ|/√n) holds up to it and grows as √(n / it) past
it, since the reference stack's own systematic bias b moves that metric as b·√n (measured: a
sound bf16 stack's prefill-parity pool of 57,000 tokens reached 0.43 against a bound of 0.46
calibrated on pools of at most 20,448). A ``[suites.NAME]`` table replaces the bounds it names
for the suite ``NAME`` alone: a rollout suite measures rollouts as decoded, which calibrate may
bound tighter than whole sequences scored in one prefill; ``inf`` (``-inf`` for a lower bound)
there lifts a base bound for that suite. A ``[suites.weight_sync]`` table, which calibrate wrote
before its method 10 to bound the engine against a backend holding new weights, is ignored with
a warning: that suite now judges the engine against itself started on the new weights, under the
base bounds. ``min_pooled_tokens`` is the fewest tokens a pooled bound (an average, spread or
correlation) is judged on: a calibrated profile sets it to the smallest pool its bounds were
measured on; a mean over fewer tokens strays further from its ideal than the calibration saw
(one token's log-ratio is its own mean), so such a pool is reported but not judged
(:meth:`Profile.unjudged` says so, per metric); a mean over one side of the routing split is
judged by that side's own number of tokens. A bound widened for the smaller pool was measured
and not adopted: every broken engine's pool of 4 or more tokens it failed already broke a
per-example bound, and at one or two tokens it failed sound pools (docs/report-json.md, "Small
pools"). A signed mean (mean ρ, k1, χ²) is held to at least ``MEAN_NOISE_SIGMAS`` standard
errors of the pool's own mean (:func:`mean_noise_bound`): a calibration's few batches can set
its bound inside a judged pool's noise. A per-sequence bound (|Σ log ρ|/√T) is at least the
per-token bound it equals on a one-token sequence (``Metric.one_token``): a calibration's
rollouts are 32 tokens or more, over which one token far off is diluted, and the suites draw
them from one token up (a sound fp32 SmolLM2-135M stack's 3-token rollout read 4.6e-4 against a
sequence bound of 1.7e-4, from one token 8.1e-4 off, inside max |Δ log p|'s bound).
``[provenance]`` is what ``tim-conformance calibrate`` measured the profile on: the models'
sha256, the device, the versions, sizes and seeds. Metric names, which side of a threshold is a
violation and which metrics are pooled come from :mod:`conformance.metric_table`; so does which
bounds a profile may hold: a bound the metric's own ideal violates (``abs_diff_max = -1``) is
refused on load, as is an infinite one outside a ``[suites.NAME]`` table.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.errors import ProfileError
from conformance.metric_table import METRIC_NAMES, Breach, metric, tokens_averaged

_HERE = Path(__file__).parent
#: suite tables a profile no longer applies (deprecated: ignored on load, and warned about)
RETIRED_SUITE_TABLES = ("weight_sync",)


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    thresholds: dict[str, float]
    description: str = ""
    #: pools of fewer valid tokens are not held to the pooled bounds (see the module docstring)
    min_pooled_tokens: int = 1
    #: the largest calibrated pool: past it pool-scaled bounds grow (see the module docstring)
    max_pooled_tokens: int | None = None
    #: where the thresholds were measured (``[provenance]``); empty for a hand-written profile
    provenance: dict[str, Any] = field(default_factory=dict)
    #: suite name → the bounds that replace the base ones for that suite (``[suites.NAME]``)
    suites: dict[str, dict[str, float]] = field(default_factory=dict)
    #: what the file holds that loading it ignored (a retired suite table), a warning line
    #: each: a run's preflight and the gate say them, where loading says nothing
    ignored: tuple[str, ...] = ()

    def bounds(
        self,
        suite: str | None = None,
        tokens: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """The bounds ``suite``'s pool of ``tokens`` tokens is held to: the base ones with the
        suite's own table replacing them, each per-sequence one at least the per-token bound
        it equals on a one-token sequence (``Metric.one_token``), the pool-scaled ones grown
        past ``max_pooled_tokens``, and, where the pool's ``metrics`` hold its spread k2, the
        signed means' at least :func:`mean_noise_bound`."""
        merged = self.thresholds | self.suites.get(suite or "", {})
        # ±inf in a suite's table lifts the base bound for that suite
        bounds = {name: value for name, value in merged.items() if math.isfinite(value)}
        for name, threshold in bounds.items():
            per_token = bounds.get(metric(name).one_token or "")
            if per_token is not None and per_token > threshold:
                bounds[name] = per_token
        if tokens and self.max_pooled_tokens and tokens > self.max_pooled_tokens:
            grow = math.sqrt(tokens / self.max_pooled_tokens)
            for name, threshold in bounds.items():
                if metric(name).pool_scaled:
                    bounds[name] = threshold * grow
        k2 = (metrics or {}).get("k2")
        if tokens and k2 is not None and math.isfinite(k2):
            for name, threshold in bounds.items():
                fact = metric(name)
                if fact.noise_slope is None:
                    continue
                floor = mean_noise_bound(fact.noise_slope, k2, tokens)
                if floor > fact.deviation(threshold):
                    bounds[name] = fact.ideal + floor
        return bounds

    def foreign_to(self, model_sha256: str, device: Mapping[str, Any]) -> str | None:
        """One line saying that this profile was calibrated on other models or another device
        than ``model_sha256`` on ``device`` (kind and name compared), or ``None``."""
        models = self.provenance.get("models") or []
        calibrated = self.provenance.get("device") or {}
        where = [k for k in ("kind", "name") if calibrated and calibrated.get(k) != device.get(k)]
        if not models or (model_sha256 in {m.get("sha256") for m in models} and not where):
            return None
        named = ", ".join(f"{m.get('arch', '?')} {str(m.get('sha256', ''))[:12]}" for m in models)
        other = "another device" if where else "other models"
        return (
            f"profile {self.name} was calibrated on {other} (models {named}; device "
            f"{calibrated.get('kind', '?')} {calibrated.get('name', '?')}), not this stack's "
            f"(model {model_sha256[:12]}; device {device.get('kind')} {device.get('name')}): "
            "its thresholds may not fit; measure yours with `tim-conformance calibrate --model "
            "DIR --out profile.toml` and pass --profile profile.toml"
        )

    def judges_pool(self, tokens: int | None) -> bool:
        """Whether metrics pooled over ``tokens`` tokens are held to the pooled bounds
        (``None``: a pool of unknown size, judged)."""
        return tokens is None or tokens >= self.min_pooled_tokens

    def small_pool(self, tokens: int | None, of: int | None = None) -> str:
        """Why a pool of ``tokens`` tokens (``of`` a larger pool, for a mean over part of it) is
        not held to the pooled bounds, in a phrase (empty when it is: :meth:`judges_pool`)."""
        if self.judges_pool(tokens):
            return ""
        pool = (
            f"{tokens} of the pool's {of} tokens"
            if of is not None and of != tokens
            else f"pool of {tokens} token{'s' * (tokens != 1)}"
        )
        return (
            f"{pool}, below profile {self.name}'s min_pooled_tokens {self.min_pooled_tokens} "
            "(the smallest pool its pooled bounds are calibrated on)"
        )

    def unjudged(
        self, metrics: Mapping[str, float], *, tokens: int | None = None, suite: str | None = None
    ) -> dict[str, str]:
        """Of the metrics both measured and bounded, those :meth:`check` does not hold to their
        bound, each with why: the pooled ones of a pool too small (:meth:`small_pool`), and a
        mean over one side of the routing split where that side holds too few tokens
        (:func:`~conformance.metric_table.tokens_averaged`: a sound fp16 MoE stack's mean over
        the 3 flipped tokens of a 6,266-token pool read 0.81 against a bound of 0.72)."""
        if tokens is None:
            return {}
        found = {}
        for name in self.bounds(suite, tokens):
            if name not in metrics or metric(name).scope != "pooled":
                continue
            if why := self.small_pool(tokens_averaged(name, metrics, tokens), of=tokens):
                found[name] = why
        return found

    def check(
        self, metrics: Mapping[str, float], *, tokens: int | None = None, suite: str | None = None
    ) -> list[Breach]:
        """Violations among the metrics both measured and bounded (by :meth:`bounds`); NaN
        always violates. ``tokens`` is how many tokens ``metrics`` pool: the metrics
        :meth:`unjudged` names (the pooled ones of a pool too small) are left out, and the
        signed means are held to at least their noise over the pool (:meth:`bounds`)."""
        violations = []
        unjudged = self.unjudged(metrics, tokens=tokens, suite=suite)
        for name, threshold in self.bounds(suite, tokens, metrics).items():
            if name not in metrics or name in unjudged:
                continue
            fact, value = metric(name), float(metrics[name])
            if fact.violates(value, threshold):
                violations.append(
                    Breach(metric=name, value=value, threshold=threshold, bound=fact.bound)
                )
        return violations


#: standard errors of a pool's mean that a signed mean's bound leaves at least: one rollout's
#: tokens are not independent draws (a stack's mismatch drifts along a sequence), so the
#: error computed as if they were understates the noise; the shipped ``bf16`` profile's k1 bound,
#: set by 24 batches, sits at 7.8 of them over 256 tokens at its measured worst spread
MEAN_NOISE_SIGMAS = 7.0


def mean_noise_bound(slope: float, k2: float, tokens: int) -> float:
    """The least distance from its ideal that a signed mean over ``tokens`` tokens is held
    to: ``MEAN_NOISE_SIGMAS`` · slope · σ/√n, σ = √(2·k2) the pool's rms log ρ (k2 = mean
    ½(log ρ)²), slope the mean's first-order move per unit of log ρ (``Metric.noise_slope``).
    Over n tokens whose log ρ spreads by σ, a mean of log ρ has standard error σ/√n
    (central limit theorem): a sound bf16 stack's mean ρ over a 378-token pool strayed 1.6
    of those from 1, past a bound 3 × a calibration's worst set, measured on 2 small batches.

    >>> round(mean_noise_bound(2.0, 0.03**2 / 2, 256), 6)
    0.02625
    """
    return MEAN_NOISE_SIGMAS * slope * math.sqrt(2 * max(k2, 0.0) / tokens)


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in _HERE.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``exact``, ``fp32``, ``bf16``, ``fp16``) or a TOML file path.

    Raises:
        ProfileError: unknown name, missing or malformed file, unknown metric, bad threshold.
    """
    path = _resolve(name_or_path)
    try:
        table = tomllib.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ProfileError(
            f"profile file {path} not found", "pass an existing .toml file or a profile name"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}", "pass a readable file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            f"profile {path} is not valid TOML ({exc})", "fix the syntax: lines of metric = number"
        ) from None
    description = table.pop("description", "")
    min_pooled_tokens = table.pop("min_pooled_tokens", 1)
    max_pooled_tokens = table.pop("max_pooled_tokens", None)
    provenance = table.pop("provenance", {})
    if not isinstance(description, str):
        raise ProfileError(
            f"profile {path}: description = {description!r} is not a string",
            'write it in quotes, e.g. description = "bf16 engine vs fp32 trainer"',
        )
    if not isinstance(provenance, dict):
        raise ProfileError(
            f"profile {path}: provenance is not a table",
            "write it as a [provenance] table, or leave it out",
        )
    for key, value in (
        ("min_pooled_tokens", min_pooled_tokens),
        ("max_pooled_tokens", max_pooled_tokens),
    ):
        if value is not None and (type(value) is not int or value < 1):
            raise ProfileError(
                f"profile {path}: {key} = {value!r} is not a positive integer",
                f"write a whole number of tokens, e.g. {key} = 256",
            )
    suites = table.pop("suites", {})
    if not isinstance(suites, dict) or not all(isinstance(t, dict) for t in suites.values()):
        raise ProfileError(
            f"profile {path}: suites is not a set of tables",
            "write each suite's bounds as a [suites.NAME] table of metric = number lines",
        )
    ignored = []
    for retired in RETIRED_SUITE_TABLES:
        if suites.pop(retired, None) is not None:
            ignored.append(
                f"profile {path}: its [suites.{retired}] table is ignored: the {retired} suite "
                "judges the engine against itself on the new weights, under the base bounds "
                "(fix: delete the table, or calibrate the profile again)"
            )
    return Profile(
        name=path.stem,
        source=path,
        thresholds=_thresholds(table, f"profile {path}"),
        description=description,
        min_pooled_tokens=min_pooled_tokens,
        max_pooled_tokens=max_pooled_tokens,
        provenance=provenance,
        suites={
            name: _thresholds(bounds, f"profile {path} [suites.{name}]", suite=True)
            for name, bounds in suites.items()
        },
        ignored=tuple(ignored),
    )


def _thresholds(table: Mapping[str, Any], where: str, *, suite: bool = False) -> dict[str, float]:
    unknown = sorted(set(table) - set(METRIC_NAMES))
    if unknown:
        raise ProfileError(
            f"{where} names unknown metric(s) {', '.join(unknown)}",
            f"use metric names from: {', '.join(METRIC_NAMES)}",
        )
    thresholds = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ProfileError(
                f"{where}: {name} = {value!r} is not a number",
                f"write a number, e.g. {name} = 1e-5",
            )
        thresholds[name] = _checked_bound(name, float(value), where, lifts=suite)
    return thresholds


def _checked_bound(name: str, value: float, where: str, *, lifts: bool) -> float:
    """``value`` as a bound on ``name``, refused where the metric's own ideal violates it
    (``abs_diff_max = -1``: every stack fails, and the support audit, which takes that bound as
    its margin, blames the sampler) and, but in a suite's table (where ±inf on the bound's open
    side lifts the base bound), where it is infinite. A finite bound past the metric's range on
    its open side stays (``pcc = -3.9``, ``rho_min = -1.3``: calibrate writes what a measured
    worst times its factor gives; it holds nothing, as ``exact_match_rate = 0`` does)."""
    fact = metric(name)
    side = {"max": "at least", "min": "at most"}.get(fact.bound)
    fix = (
        f"write a bound {side} {fact.ideal:g}, the value of identical log-probs"
        if side
        else f"write a finite distance either side of the ideal {fact.ideal:g}"
    ) + (", or inf on its open side to lift it" if lifts else ", or leave the metric out")
    if fact.violates(fact.ideal, value):
        raise ProfileError(
            f"{where}: {name} = {value:g} is {'below' if fact.bound == 'max' else 'above'} the "
            f"ideal {fact.ideal:g} of {fact.meaning}: identical log-probs would fail it",
            fix,
        )
    if math.isinf(value) and not lifts:
        raise ProfileError(f"{where}: {name} = {value:g} is not a finite bound", fix)
    return value


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        return Path(name_or_path)
    shipped = _HERE / f"{text}.toml"
    if not shipped.is_file():
        raise ProfileError(
            f"unknown profile {text!r}",
            f"use one of {', '.join(available_profiles())} or a path to a .toml file",
        )
    return shipped


__all__ = [
    "Profile",
    "available_profiles",
    "load_profile",
]
