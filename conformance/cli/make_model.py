"""``tim-conformance make-model``: write a tiny random causal LM and its tokenizer."""

from __future__ import annotations

import argparse
import inspect
import math
from pathlib import Path

from conformance.models import ARCHS, make_model

EPILOG = """examples:
  tim-conformance make-model /tmp/tiny                       # qwen2, 2 layers, hidden 64
  tim-conformance make-model /tmp/moe --arch qwen3-moe --seed 1
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(make_model).parameters.items()
        if parameter.kind is parameter.KEYWORD_ONLY
    }
    parser = subparsers.add_parser(
        "make-model",
        help="write a tiny random-initialised causal LM and its tokenizer",
        description="Write a tiny random-initialised causal LM (safetensors) and a byte-level "
        "BPE tokenizer trained offline into DIR. Same arguments give identical files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", type=Path, metavar="DIR", help="new or empty folder to write")
    parser.add_argument("--arch", choices=tuple(ARCHS), default=defaults["arch"])
    parser.add_argument("--seed", type=int, default=defaults["seed"], help="weight init seed")
    parser.add_argument("--vocab", type=int, default=defaults["vocab"], help="tokenizer size")
    parser.add_argument("--layers", type=int, default=defaults["layers"])
    parser.add_argument(
        "--hidden", type=int, default=defaults["hidden"], help="a multiple of the head size 32"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stats = make_model(
        args.dir,
        arch=args.arch,
        seed=args.seed,
        vocab=args.vocab,
        layers=args.layers,
        hidden=args.hidden,
    )
    print(f"wrote {stats.path} ({stats.arch}, seed {stats.seed}, {stats.n_params:,} parameters)")
    print(
        f"next-token distributions on random prompts: median max-prob "
        f"{stats.median_max_prob:.3f}, mean entropy {stats.mean_entropy:.3f} nats "
        f"(uniform: {math.log(args.vocab):.3f})"
    )
    return 0
