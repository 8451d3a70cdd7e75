"""The profile a stack is judged by when none is named, for a model or device the shipped
profiles were not measured on: the model's own, calibrated here once and cached.

Decided from the transfer and detection-power tables (issue 20; docs/transfer.md,
docs/detection-power.md): the shipped profiles, measured on 2-layer embedded models, fail sound
stacks of other models (an 8-layer model's bf16 engine, a small MoE model's fp16) and are
blunter there (a per-token bias the model's own bf16 profile fails at 0.003 nats needs 0.01
under the shipped one), so a user's model gets its own measurement by default; ``--profile
NAME`` still picks a shipped one (with its one-line warning)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance import __version__
from conformance.calibration.runner import (
    METHOD,
    Batch,
    Plan,
    default_backend_dtypes,
    measure,
    provenance,
    render_profile,
)
from conformance.hf_model import AUTO_ATTN
from conformance.host import device_info
from conformance.models.cache import cache_root

if TYPE_CHECKING:
    from conformance.models import ModelInfo


def cached_profile_path(
    model_sha256: str, device: dict[str, Any], plan: Plan, version: str
) -> Path:
    """Where the own profile of ``plan`` on ``device`` is cached: keyed by everything that
    changes what calibrate measures (the model's bytes, the device's kind and name, the
    precisions, the depth, the harness's version and calibrate's ``METHOD``)."""
    key = json.dumps(
        [model_sha256, device.get("kind"), device.get("name"), plan.engine_dtype,
         list(plan.backend_dtypes), plan.depth, version, METHOD,
         *([list(plan.cap)] if plan.cap else []),
         *([{"max_tokens": plan.max_tokens}] if plan.max_tokens else []),
         *([{"attn": plan.attn_implementation}] if plan.attn_implementation != AUTO_ATTN else []),
         *([{"kv": plan.kv_format}] if plan.kv_format else [])]
    )  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "profiles" / f"own-{model_sha256[:12]}-{digest}.toml"


def plan_flags(plan: Plan) -> list[str]:
    """The calibrate flags that give ``plan``'s cap, tokens per batch, attention implementation
    and KV format (what ``--depth`` and the precisions leave to it)."""
    flags = ["--max-batch-tokens", str(plan.max_tokens)] if plan.max_tokens else []
    if plan.attn_implementation != AUTO_ATTN:
        flags += ["--backend-attn", plan.attn_implementation]
    if plan.kv_format:
        flags += ["--kv-cache-dtype", plan.kv_format]
    cap = plan.cap
    if cap is None:
        return flags
    batch, prompt_len, new_tokens = cap
    return [
        "--max-batch", str(batch), "--max-prompt-len", str(prompt_len),
        "--max-new-tokens", str(new_tokens), *flags,
    ]  # fmt: skip


#: progress lines, flushed: certify's output is often a pipe (CI logs), and this runs for minutes
_print_flushed = functools.partial(print, flush=True)


def own_profile(
    info: ModelInfo,
    engine_dtype: str,
    backend_dtype: str,
    depth: str,
    progress: Callable[[str], None] = _print_flushed,
    *,
    cap: Batch | None = None,
    max_tokens: int | None = None,
    attn_implementation: str = AUTO_ATTN,
    kv_format: str | None = None,
) -> Path:
    """The own profile of the model ``info`` describes, for this precision and depth on this
    device: read from the cache, else calibrated (as ``tim-conformance calibrate`` does,
    progress line by line) and cached. The calibration's backends are calibrate's default for
    the engine precision and the stack's own backend precision; ``cap`` (prompts, prompt
    length, new tokens) is a run's own shape where it is smaller than the depth's batches,
    ``max_tokens`` the run's tokens per batch where it is not the depth's,
    ``attn_implementation`` the stack's ``--backend-attn``, ``kv_format`` the format the
    engine caches keys and values in."""
    model = info.path
    backends = tuple(dict.fromkeys((*default_backend_dtypes(engine_dtype), backend_dtype)))
    plan = Plan(
        models=(model,),
        engine_dtype=engine_dtype,
        backend_dtypes=backends,
        depth=depth,
        cap=cap,
        max_tokens=max_tokens,
        attn_implementation=attn_implementation,
        kv_format=kv_format,
    )
    path = cached_profile_path(info.sha256, device_info(), plan, __version__)
    if path.is_file():
        progress(f"tim-conformance: profile: the model's own, calibrated before ({path})")
        return path
    progress(
        f"tim-conformance: profile: the model's own: no --profile given and the shipped ones "
        f"were measured on other models, another device or caches in the model's precision, "
        f"so calibrating {model} first "
        f"({engine_dtype} engine vs {' and '.join(backends)} backend, depth {depth}; cached in "
        f"{path.parent}; pass --profile to choose one)"
    )
    measured, infos = measure(plan, progress=lambda line: progress(f"  {line}"))
    command = shlex.join(
        [
            "tim-conformance", "calibrate", "--model", str(model), "--engine-dtype", engine_dtype,
            *(a for dtype in backends for a in ("--backend-dtype", dtype)),
            "--depth", depth, *plan_flags(plan), "--out", str(path),
        ]
    )  # fmt: skip
    text = render_profile(plan, measured, provenance(plan, infos, command))
    path.parent.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed: a run cut short leaves no half profile under the final name
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)
    return path
