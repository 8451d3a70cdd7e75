"""Recalibrate the shipped ``fp32``, ``bf16`` and ``fp16`` profiles by measurement.

``python -m conformance.profiles.calibrate`` runs the reference stack — ``hf-generate`` (KV-cache
decode, left padding) in each precision against the ``hf`` backend's full forward in fp32, and in
bf16/fp16 also against the backend in the same low precision (a profile covers both stacks) — on
three embedded-recipe models (qwen2 seeds 0 and 1, llama seed 2), over rollout batches that span
both search depths, from 8 prompts × 32 new tokens to 8 prompts × 2,048 new tokens. Each
threshold is the measured extreme times a safety factor (10 in fp32, where only kernel and
reduction order differ; 3 in bf16/fp16, whose rounding dominates), squared for the quadratic
metrics (k2, k3, 1 − pcc), applied to the distance from the metric's ideal; community anchors
replace the factor where they are tighter but still above the measurement (verl's
``rollout_probs_diff_mean`` < 0.01, NeMo-RL's ``token_mult_prob_error`` < 1.05). Every metric is
measured per batch, pooled ones included: a suite pools one test's tokens, often a few hundred,
and a mean over a few hundred tokens strays further from its ideal than one over a whole model's
batches. The smallest batch's rollout tokens are the profile's ``min_pooled_tokens``: below it
a pooled bound would be judged outside what was measured. The measurement sits next to each
number in the written TOML.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from conformance.metric_table import METRICS, Metric

#: (profile, engine precision, backend precisions, safety factor)
PRECISIONS = (
    ("fp32", "float32", ("float32",), 10.0),
    ("bf16", "bfloat16", ("float32", "bfloat16"), 3.0),
    ("fp16", "float16", ("float32", "float16"), 3.0),
)
#: (prompts, prompt length, new tokens): the depths' small, middle and large ends
BATCHES = ((8, 64, 32), (32, 512, 128), (64, 256, 512), (8, 1024, 2048))
MODELS = (("qwen2", 0), ("qwen2", 1), ("llama", 2))
SAMPLING_SEEDS = (0, 1)
#: metrics whose scale is the square of a log-ratio: the factor is squared too
QUADRATIC = frozenset({"k2", "k3", "pcc"})
#: profile → metric → (threshold, source): used when tighter than factor × measured, but above
#: 1.5 × measured
ANCHORS = {
    "bf16": {
        "prob_diff_mean": (0.01, "verl FAQ: < 0.005 fine, > 0.01 bad (BACKGROUND.md §5)"),
        "token_mult_prob_error": (1.05, "NeMo-RL / Megatron: < 1.05 (BACKGROUND.md §5)"),
    },
}
DESCRIPTIONS = {
    "fp32": "fp32 engine vs fp32 trainer: only kernel and reduction-order differences",
    "bf16": "bf16 engine vs fp32 trainer (the precision the engine runs in)",
    "fp16": "fp16 engine vs fp32 trainer (the precision the engine runs in)",
}


@dataclass
class Measured:
    """Every value one metric took, one per batch."""

    values: list[float]

    def worst(self, fact: Metric) -> float:
        return max(self.values, key=fact.deviation)

    def median(self) -> float:
        return statistics.median(self.values)


def measure(
    precision: str, backend_precision: str, batches: tuple[tuple[int, int, int], ...]
) -> dict[str, list[float]]:
    """Run the reference stack, engine in ``precision``; every metric's values."""
    import torch

    from conformance.backends import BackendConfig
    from conformance.backends.hf import HFBackend
    from conformance.engines import EngineConfig, SamplingSpec
    from conformance.engines.hf_generate import HFGenerateEngine
    from conformance.metrics import mismatch_metrics, stack_ragged
    from conformance.models.cache import DEFAULT_MODEL, cached_model
    from conformance.suite_support import generated_rows

    found: dict[str, list[float]] = {m.name: [] for m in METRICS}
    for arch, seed in MODELS:
        model = cached_model(**{**DEFAULT_MODEL, "arch": arch, "seed": seed})
        engine = HFGenerateEngine(EngineConfig(model=model, dtype=precision))
        backend = HFBackend(BackendConfig(model=model, dtype=backend_precision))
        for (prompts, length, new), sampling_seed in (
            (b, s) for b in batches for s in SAMPLING_SEEDS
        ):
            generator = torch.Generator().manual_seed(sampling_seed)
            ids = torch.randint(3, 384, (prompts, length), generator=generator).tolist()
            spec = SamplingSpec(max_new_tokens=new, seed=sampling_seed)
            completions = engine.generate(ids, spec)
            recomputed = backend.recompute([c.sequence for c in completions]).logprobs
            lp_train, lp_infer, _ = generated_rows(completions, recomputed)
            train, mask = stack_ragged(lp_train)
            infer, _ = stack_ragged(lp_infer)
            for name, value in mismatch_metrics(train, infer, mask).items():
                found[name].append(value)
            print(
                f"  {precision} vs {backend_precision} {arch}-s{seed} "
                f"batch {prompts}x{length}+{new}",
                flush=True,
            )
    return found


def threshold(profile: str, fact: Metric, measured: Measured, factor: float) -> tuple[float, str]:
    """The bound and the comment that says where it comes from."""
    worst = measured.worst(fact)
    note = f"measured median {_num(fact, measured.median())}, worst {_num(fact, worst)}"
    if fact.name == "nonfinite_tokens":
        return 0.0, "a NaN/inf log-probability is never conformant"
    if fact.name == "exact_match_rate":
        return 0.0, f"not required: kernels differ ({note})"
    scale = factor**2 if fact.name in QUADRATIC else factor
    # a lower bound sits below the ideal; upper and two-sided bounds are written above it
    sign = -1.0 if fact.bound == "min" else 1.0
    bound = _round_up(fact.ideal + sign * scale * fact.deviation(worst), fact)
    anchor = ANCHORS.get(profile, {}).get(fact.name)
    if anchor is not None:
        value, source = anchor
        margin = fact.deviation(value) / max(fact.deviation(worst), 1e-300)
        if fact.deviation(value) < fact.deviation(bound) and margin >= 1.5:
            return value, f"{source}; {note}"
    return bound, note


def write_profile(
    path: Path,
    profile: str,
    measured: dict[str, Measured],
    factor: float,
    when: str,
    batches: tuple[tuple[int, int, int], ...],
) -> None:
    quadratic = ", ".join(sorted(QUADRATIC))
    prompts, _, new = min(batches, key=lambda batch: batch[0] * batch[2])
    pooled_tokens = prompts * new
    lines = [
        f"# {profile}: {DESCRIPTIONS[profile]}",
        "# Calibrated by `python -m conformance.profiles.calibrate` (see its docstring): "
        "hf-generate (KV-cache decode,",
        f"# left padding) vs the hf backend's full forward in {_backends(profile)} on 3 models "
        "(qwen2 seeds 0 and 1, llama seed 2;",
        f"# 2 layers, hidden 64, vocab 384), batches {_batches(batches)} x {len(SAMPLING_SEEDS)} "
        f"sampling seeds, measured {when}.",
        f"# Threshold = worst measured distance from the ideal x {factor:g} ({factor:g}^2 for "
        f"{quadratic}), rounded up",
        "# to two significant digits; signed metrics (rho_mean, k1, chi2_token) are bounded on "
        "both sides of their ideal.",
        f'description = "{DESCRIPTIONS[profile]}"',
        f"min_pooled_tokens = {pooled_tokens}  # the smallest batch's rollout tokens "
        f"({prompts} x {new}): pooled bounds are judged from there",
        "",
    ]
    for fact in METRICS:
        if fact.grows_with_length or fact.name not in measured:
            continue
        value, note = threshold(profile, fact, measured[fact.name], factor)
        lines.append(f"{fact.name} = {value!r}  # {note}")
    path.write_text("\n".join(lines) + "\n")


def _backends(profile: str) -> str:
    dtypes = next(backends for name, _, backends, _ in PRECISIONS if name == profile)
    return " and ".join(dtypes)


def _batches(batches: tuple[tuple[int, int, int], ...]) -> str:
    return ", ".join(f"{p}x({n}+{new})" for p, n, new in batches)


def _round_up(value: float, fact: Metric) -> float:
    """Two significant digits of the distance from the ideal, rounded away from the ideal."""
    deviation = fact.deviation(value)
    if deviation == 0:
        return fact.ideal
    digits = 1 - math.floor(math.log10(deviation))
    rounded = math.ceil(deviation * 10**digits) / 10**digits
    return round(fact.ideal + math.copysign(rounded, value - fact.ideal), digits + 1)


def _num(fact: Metric, value: float) -> str:
    if fact.ideal == 1.0 and 0 < abs(value - 1) < 0.01:
        return f"1 {'+' if value > 1 else '-'} {abs(value - 1):.2g}"
    return f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument(
        "--quick", action="store_true", help="only the two smaller batch sizes (a trial run)"
    )
    args = parser.parse_args()
    batches = BATCHES[:2] if args.quick else BATCHES
    when = dt.date.today().isoformat()
    for profile, precision, backend_precisions, factor in PRECISIONS:
        found: dict[str, list[float]] = {}
        for backend_precision in backend_precisions:
            for name, values in measure(precision, backend_precision, batches).items():
                found.setdefault(name, []).extend(values)
        measured = {name: Measured(values) for name, values in found.items() if values}
        write_profile(args.out / f"{profile}.toml", profile, measured, factor, when, batches)
        print(f"wrote {args.out / f'{profile}.toml'}", flush=True)


if __name__ == "__main__":
    main()
