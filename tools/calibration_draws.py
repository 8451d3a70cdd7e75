"""Would more sampling seeds let calibrate bound |Σ log ρ|/√n tighter?

The rollout suites' bound on ``log_ratio_sum_per_sqrt_tokens`` is the larger of the engine
precision's factor × the worst decoded batch and ``Z_SIGMAS`` (7) × the rms of the decoded
batches, one draw of ≈ σ·|Z| each (conformance/calibration/runner.py). Seven keeps 4.6σ when σ's
estimate from 8 draws (2 batch sizes × 2 sampling seeds × 2 backend precisions at quick depth)
sits at its 10th percentile; an estimate from k draws allows Z(k) = 4.6 / √(χ²ₖ(0.1)/k) for the
same margin. This measures the reference stack's decoded batches under ``--seeds`` sampling seeds
and prints, for the first 2, 3, ... of them, the draws' rms and worst, Z(k) × rms, 7 × rms and
factor × worst: whether a longer calibration would give a tighter bound, or a truer, larger one.

    PYTHONPATH=. python tools/calibration_draws.py MODEL --dtype bfloat16 --seeds 8
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from conformance.calibration.runner import Z_SIGMAS, Plan, default_backend_dtypes, measure
from conformance.metric_table import metric

#: the standard normal's 10th percentile
Z_10 = -1.2815515655446004
#: σ's estimate may sit at its 10th percentile and the bound still be this many true σ
KEEP_SIGMAS = 4.6


def z_for(draws: int) -> float:
    """Z(k) = KEEP_SIGMAS / √(χ²ₖ(0.1)/k), χ²ₖ(0.1) by the Wilson–Hilferty approximation
    k·(1 − 2/(9k) + z₀.₁·√(2/(9k)))³ (Wilson & Hilferty 1931, "The distribution of chi-square");
    Z(8) ≈ 7, calibrate's ``Z_SIGMAS``."""
    quantile = draws * (1 - 2 / (9 * draws) + Z_10 * math.sqrt(2 / (9 * draws))) ** 3
    return KEEP_SIGMAS / math.sqrt(quantile / draws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    plan = Plan(
        models=(args.model,),
        engine_dtype=args.dtype,
        backend_dtypes=default_backend_dtypes(args.dtype),
        sampling_seeds=tuple(range(args.seeds)),
    )
    name = "log_ratio_sum_per_sqrt_tokens"
    values = measure(plan, progress=lambda _: None)[0]["decoded"][name].values
    # measure's order: backend precision, then batch size, then sampling seed
    per_batch = [values[i : i + args.seeds] for i in range(0, len(values), args.seeds)]
    columns = ("seeds", "draws k", "rms", "worst", "Z(k)", "Z(k) × rms", f"{Z_SIGMAS:g} × rms")
    print(f"| {' | '.join(columns)} | factor × worst |")
    print("|---|---|---|---|---|---|---|---|")
    for seeds in range(2, args.seeds + 1):
        draws = [v for batch in per_batch for v in batch[:seeds]]
        rms = math.sqrt(sum(v * v for v in draws) / len(draws))
        worst = max(draws, key=metric(name).deviation)
        print(
            f"| {seeds} | {len(draws)} | {rms:.3g} | {worst:.3g} | "
            f"{z_for(len(draws)):.2f} | {z_for(len(draws)) * rms:.3g} | {Z_SIGMAS * rms:.3g} | "
            f"{plan.factor * worst:.3g} |"
        )


if __name__ == "__main__":
    main()
