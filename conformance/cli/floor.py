"""``tim-conformance floor``: the softmax rounding floor of ρ (objective-level hacking Table 2)."""

from __future__ import annotations

import argparse
import dataclasses
import json

EPILOG = """examples:
  tim-conformance floor --dtype bf16                  # Table 2: V 2048, S 1.5, 50 000 tokens
  tim-conformance floor --dtype fp16 --vocab 151936 --tokens 2000 --seed 1 --json
"""


HELP = "simulate the rounding floor of the ratio p_fp32 / p_low"
DESCRIPTION = (
    "Simulate how far ρ = p_fp32 / p_low strays from 1 through softmax rounding "
    "alone (objective-level hacking App. C.1, Table 2): fp32 logits ~ N(0, S²), softmax in "
    "fp32 and in DTYPE, one token sampled per logit vector from the DTYPE distribution."
)


#: the simulation's parameters, Table 2's columns: flag, type, default and help
PARAMETERS = (
    ("--vocab", int, 2048, "vocabulary size (default and Table 2: %(default)s)"),
    ("--logit-std", float, 1.5, "std S of the fp32 logits (default and Table 2: %(default)s)"),
    ("--tokens", int, 50_000, "tokens to simulate (default and Table 2: %(default)s)"),
    ("--seed", int, 1234, "seed (default: %(default)s; Table 2: 1234 to 1238)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", required=True, help="the low precision: bf16 or fp16")
    for flag, kind, default, meaning in PARAMETERS:
        parser.add_argument(flag, type=kind, default=default, help=meaning)
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=4096,
        help="tokens held in memory at once; results do not depend on it (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from conformance.floor import simulate_floor

    result = simulate_floor(
        args.dtype,
        args.vocab,
        args.logit_std,
        args.tokens,
        args.seed,
        chunk_rows=args.chunk_rows,
    )
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
        return 0
    print(
        f"precision floor: {result.dtype} vs float32, vocab {result.vocab}, "
        f"logit std {result.logit_std}, {result.tokens} tokens, seed {result.seed}"
    )
    print("ratio p_fp32/p_low of the sampled tokens:")
    for key in ("ratio_mean", "ratio_std", "ratio_max", "ratio_min"):
        print(f"  {key.removeprefix('ratio_'):<5} {getattr(result, key):.6f}")
    print(f"KL(hist low ‖ hist fp32) {result.kl:.6f}   (Table 2's KL column; binning-dependent)")
    print(f"token KL(p_low ‖ p_fp32) {result.token_kl:.3e}")
    return 0
