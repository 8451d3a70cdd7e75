"""How far pooled metrics of small pools stray on a sound stack, and on broken ones.

Measures the reference stack (``hf-generate`` decode vs its own prefill, as the
decode-vs-prefill suite compares; and vs the ``hf`` backend, as the rollout suites do) on the
embedded model, pools whole rollouts into pools of n tokens, and prints, per n, the largest
ratio of a pooled metric's distance from its ideal to its bound's (the profile's, as
``Profile.check`` holds a pool of ``min_pooled_tokens`` or more), next to √(min / n): a bound
widened by that factor would hold the pool where the ratio stays below it. It also counts the
pools the widened bound fails, those holding a rollout that breaks a per-example bound (which
fails a check at any pool size), and those the widened bound alone fails. The broken engines
from ``tests/support/engines.py`` show what such a widened bound would add; docs/report-json.md
("Small pools") holds the numbers and the decision.

Run from the repository root (a few minutes on one CPU core):

    PYTHONPATH=. python tools/small_pools.py
"""

from __future__ import annotations

import math
import random

import torch

from conformance.backends import BackendConfig
from conformance.backends.hf import HFBackend
from conformance.engines import EngineConfig, SamplingSpec
from conformance.metric_table import metric
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.models.cache import default_model
from conformance.profiles import load_profile
from conformance.suite_support import generated_rows
from tests.support import engines as broken

POOLS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 255)
DRAWS = 200
STACKS = (("float32", "fp32"), ("bfloat16", "bf16"))
ENGINES = {
    "sound": "HFGenerateEngine",
    "OffByOne": "OffByOne",
    "ConstantBias(0.01)": "ConstantBias",
    "TokenNoise(0.01)": "TokenNoise",
}


def rows(engine, backend, seeds=range(6)):
    """Per rollout: (decode, prefill, backend) log-probs, over batches of 8 prompts."""
    out = []
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        prompts = [
            torch.randint(3, 384, (int(n),), generator=gen).tolist()
            for n in torch.randint(1, 48, (8,), generator=gen)
        ]
        spec = SamplingSpec(max_new_tokens=(8, 16, 32, 64, 48, 24)[seed % 6], seed=seed)
        completions = engine.generate(prompts, spec)
        sequences = [c.sequence for c in completions]
        decode = [list(c.logprobs) for c in completions]
        prefill, _, _ = generated_rows(completions, engine.score(sequences))
        train, _, _ = generated_rows(completions, backend.recompute(sequences).logprobs)
        out += list(zip(decode, prefill, train, strict=True))
    return out


def example_fails(a_row, b_row, bounds):
    """Whether one rollout breaks a per-example bound (as ``Recorder.check_profile`` holds)."""
    a, mask = stack_ragged([a_row])
    b, _ = stack_ragged([b_row])
    metrics = mismatch_metrics(a, b, mask)
    return any(
        metric(k).scope == "example" and metric(k).violates(v, bounds[k])
        for k, v in metrics.items()
        if k in bounds
    )


def pools(measured, bounds, n, side, least):
    """Over DRAWS pools of n tokens drawn from whole rollouts (the last one cut to fit): per
    pooled metric the largest |value − ideal| / |bound − ideal|, and how many pools a bound
    widened by √(min / n) fails, how many break a per-example bound, and how many the widened
    bound alone fails."""
    rng = random.Random(n)
    widen = math.sqrt(least / n)
    worst: dict[str, float] = {}
    broken: dict[tuple[int, int], bool] = {}
    widened = per_example = widened_only = 0
    for _ in range(DRAWS):
        order = rng.sample(range(len(measured)), len(measured))
        a_rows, b_rows, left, broken_example = [], [], n, False
        for i in order:
            row = measured[i]
            take = min(left, len(row[0]))
            a_rows.append(row[side][:take])
            b_rows.append(row[0][:take])
            if (i, take) not in broken:
                broken[i, take] = example_fails(row[side][:take], row[0][:take], bounds)
            broken_example |= broken[i, take]
            left -= take
            if not left:
                break
        a, mask = stack_ragged(a_rows)
        b, _ = stack_ragged(b_rows)
        over = False
        for name, value in mismatch_metrics(a, b, mask).items():
            fact = metric(name)
            bound = bounds.get(name)
            # exact_match_rate >= 0 holds any value: not a bound to measure against
            if fact.scope != "pooled" or bound is None or (fact.bound == "min" and bound <= 0):
                continue
            ratio = fact.deviation(value) / fact.deviation(bound)
            worst[name] = max(worst.get(name, 0.0), ratio)
            over |= ratio > widen
        widened += over
        per_example += broken_example
        widened_only += over and not broken_example
    return worst, (widened, per_example, widened_only)


def main() -> None:
    model = default_model()
    for dtype, name in STACKS:
        profile = load_profile(name)
        backend = HFBackend(BackendConfig(model=model, dtype="float32"))
        for label, cls in ENGINES.items():
            engine_cls = getattr(broken, cls)
            options = {"bias": "0.01"} if cls == "ConstantBias" else {}
            options |= {"noise": "0.01"} if cls == "TokenNoise" else {}
            engine = engine_cls(EngineConfig(model=model, dtype=dtype, options=options))
            measured = rows(engine, backend)
            for side, suite in ((1, "decode_vs_prefill"), (2, "rollout_parity")):
                bounds = profile.bounds(suite)
                print(f"\n{name} profile, {label} engine, {suite} ({len(measured)} rollouts)")
                print(
                    "   n  sqrt(min/n)  pools failing: widened/per-example/widened alone  "
                    "worst ratios |value - ideal| / |bound - ideal|"
                )
                for n in POOLS:
                    worst, (widened, per_example, alone) = pools(
                        measured, bounds, n, side, profile.min_pooled_tokens
                    )
                    top = sorted(worst, key=worst.get, reverse=True)[:3]
                    widen = math.sqrt(profile.min_pooled_tokens / n)
                    shown = ", ".join(f"{m} {worst[m]:.3g}" for m in top)
                    failing = f"{widened}/{per_example}/{alone} of {DRAWS}"
                    print(f"{n:4d}  {widen:11.2f}  {failing:>46}  {shown}")
            engine.close()
        backend.close()


if __name__ == "__main__":
    main()
