"""``tim-conformance calibrate``: measure the reference stack on a model, write its profile."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from conformance.dtypes import KV_FORMATS, canonical_dtype, dtype_spellings
from conformance.errors import UsageError
from conformance.hf_model import AUTO_ATTN
from conformance.models import default_model, model_folder
from conformance.options import ATTN_CHOICES
from conformance.profiles import load_profile

EPILOG = """examples:
  tim-conformance calibrate --model ~/models/mine --out mine-fp32.toml
  tim-conformance calibrate --model ~/models/mine --engine-dtype bf16 --out mine-bf16.toml
  tim-conformance certify --model ~/models/mine --engine-dtype bf16 --profile mine-bf16.toml

The profile holds one threshold per metric with its measurement beside it, and a [provenance]
table (models' sha256, device, versions, sizes, seeds); certify warns when the stack's model or
device is not the one it was measured on.
"""


HELP = "measure the reference stack on your model and device; write a tolerance profile"
DESCRIPTION = (
    "Run hf-generate (KV-cache decode) against the hf backend's full forward on "
    "MODEL(s) and write a profile whose thresholds are the measured worst times a safety "
    "factor (10 in fp32, 3 in bf16/fp16). Takes minutes; progress is printed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from conformance.calibration.runner import DEPTH_BATCHES

    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="DIR",
        help="model folder or embedded:NAME (repeatable: one profile over several models; "
        "default: the embedded default model)",
    )
    parser.add_argument(
        "--engine-dtype",
        default="float32",
        metavar="DTYPE",
        help=f"one of {', '.join(dtype_spellings())} (default: %(default)s)",
    )
    parser.add_argument(
        "--backend-dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="trainer precision, repeatable (default: float32, and the engine's precision "
        "where it is lower)",
    )
    parser.add_argument(
        "--depth",
        choices=tuple(DEPTH_BATCHES),
        default="quick",
        help="the batches measured, 2 sampling seeds each (match certify's --depth; default: "
        "%(default)s): "
        + "; ".join(
            f"{name}: {', '.join(f'{p} x ({n} + {k})' for p, n, k in batches)} tokens"
            for name, batches in DEPTH_BATCHES.items()
        ),
    )
    for name, what in (
        ("max-batch", "prompts"),
        ("max-prompt-len", "prompt length"),
        ("max-new-tokens", "new tokens"),
    ):
        parser.add_argument(
            f"--{name}",
            type=int,
            metavar="N",
            help=f"cap the depth's batches' {what} at a run's own (match certify's --{name}; "
            "default: the depth's)",
        )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        metavar="N",
        help="measure a batch of more tokens as the two certify draws in its place (match "
        "the budget certify prints, e.g. a costly model's on a CPU; default: the depth's)",
    )
    parser.add_argument(
        "--backend-attn",
        choices=ATTN_CHOICES,
        default=AUTO_ATTN,
        help="the attention implementation both sides load the model with (match certify's "
        "--backend-attn; default: %(default)s, the one transformers picks for the model)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=tuple(KV_FORMATS),
        help="the format the engine caches keys and values in: the reference engine's are "
        "rounded to it (to nearest) and the safety factor is 3, as for bf16 (default: the "
        "model's precision)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the profile .toml to write")


def run(args: argparse.Namespace) -> int:
    from conformance.calibration.own_profile import plan_flags
    from conformance.calibration.runner import (
        Plan,
        default_backend_dtypes,
        measure,
        provenance,
        render_profile,
    )

    if args.out.suffix != ".toml":
        raise UsageError(f"--out {args.out} is not a .toml file", "pass e.g. --out mine.toml")
    if not args.out.parent.is_dir():
        raise UsageError(
            f"--out folder {args.out.parent} does not exist", "create it or pass another path"
        )
    engine_dtype = canonical_dtype(args.engine_dtype)
    backend_dtypes = tuple(dict.fromkeys(canonical_dtype(d) for d in args.backend_dtype))
    caps = (args.max_batch, args.max_prompt_len, args.max_new_tokens)
    given = [c for c in (*caps, args.max_batch_tokens) if c is not None]
    if any(c < 1 for c in given):
        raise UsageError(f"a cap of {min(given)}", "pass N >= 1")
    cap = None if caps == (None, None, None) else tuple(c or 1 << 30 for c in caps)
    plan = Plan(
        models=tuple(model_folder(m) for m in args.model) or (default_model(),),
        engine_dtype=engine_dtype,
        backend_dtypes=backend_dtypes or default_backend_dtypes(engine_dtype),
        depth=args.depth,
        cap=cap,
        max_tokens=args.max_batch_tokens,
        attn_implementation=args.backend_attn,
        kv_format=args.kv_cache_dtype,
    )
    print(
        f"tim-conformance: calibrating {engine_dtype} hf-generate vs "
        f"{' and '.join(plan.backend_dtypes)} hf on {len(plan.models)} model(s), depth "
        f"{plan.depth} -> {args.out}",
        flush=True,
    )
    measured, infos = measure(plan, progress=lambda line: print(f"  {line}", flush=True))
    command = shlex.join(
        [
            "tim-conformance", "calibrate",
            *(a for model in args.model or plan.models for a in ("--model", str(model))),
            "--engine-dtype", engine_dtype,
            *(a for dtype in plan.backend_dtypes for a in ("--backend-dtype", dtype)),
            "--depth", plan.depth, *plan_flags(plan), "--out", str(args.out),
        ]
    )  # fmt: skip
    args.out.write_text(render_profile(plan, measured, provenance(plan, infos, command)))
    profile = load_profile(args.out)  # what certify will read: it must load
    print(
        f"tim-conformance: wrote {args.out} ({len(profile.thresholds)} thresholds; "
        f"certify --profile {args.out})"
    )
    return 0
