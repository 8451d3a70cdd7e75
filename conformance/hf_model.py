"""Shared transformers plumbing for the ``hf-generate`` engine and the ``hf`` backend."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.dtypes import torch_dtype
from conformance.errors import ModelError
from conformance.models.features import model_features
from conformance.releases import ReleaseRange
from conformance.sampling import truncate

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

#: the transformers releases the ``hf-generate`` engine and the ``hf``/``fsdp`` backends were
#: measured on (docs/engine-versions.md)
TRANSFORMERS_RELEASES = ReleaseRange("transformers", min="5.17.0", max_tested="5.25.0")


#: the attention implementation transformers picks for the model itself: SDPA where the model
#: supports it, eager where that is all it has (Gemma-2 and gpt-oss in transformers 5.25), so
#: every place that loads a model (engine, backend, calibration, a fresh engine after a weight
#: sync) loads one that runs
AUTO_ATTN = "auto"
#: model features SDPA has no term for: ``auto`` runs such a model eagerly whatever the release
#: picks (transformers 5.19 picks SDPA for Gemma-2 and drops its attention soft-cap: 2.2 nats
#: off a float64 forward, docs/findings/harness-gemma2-sdpa-reference.md)
EAGER_ONLY_FEATURES = frozenset({"attention_softcap", "attention_sinks"})


def load_causal_lm(model: Path, dtype: str, attn_implementation: str) -> PreTrainedModel:
    """Load a causal LM from a local folder, offline, in eval mode on CPU/GPU as available.

    ``attn_implementation`` is transformers' name for one, or :data:`AUTO_ATTN`; the one in use
    is ``lm.config._attn_implementation`` (:func:`attention_in_use`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    asked = _resolved(model) if attn_implementation == AUTO_ATTN else attn_implementation
    try:
        lm = AutoModelForCausalLM.from_pretrained(
            str(model), dtype=torch_dtype(dtype), attn_implementation=asked
        )
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if asked is not None and "does not support" in first_line:
            raise ModelError(
                f"{model} cannot run attention implementation {asked!r}: {first_line}",
                f"leave the attention implementation at {AUTO_ATTN!r} (the model's own) or name "
                "one it supports, e.g. eager",
            ) from exc
        raise ModelError(
            f"cannot load a causal LM from {model}: {first_line}",
            "pass --model DIR with a transformers model folder, e.g. one made by "
            "`tim-conformance make-model DIR`",
        ) from exc
    return lm.to(device()).eval()


def _resolved(model: Path) -> str | None:
    """What :data:`AUTO_ATTN` asks transformers for: eager for a model with a feature SDPA
    lacks, else nothing (transformers' own pick)."""
    return "eager" if needs_eager(model) else None


def needs_eager(model: Path) -> bool:
    """Whether the model in the folder has a feature SDPA has no term for
    (:data:`EAGER_ONLY_FEATURES`); False for a folder whose config cannot be read
    (``from_pretrained`` names what is wrong with it)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    features = {feature.name for feature in model_features(config)}
    return bool(features & EAGER_ONLY_FEATURES)


def attention_in_use(lm: PreTrainedModel) -> str:
    """The attention implementation a loaded model runs (what :data:`AUTO_ATTN` resolved to)."""
    return str(lm.config._attn_implementation)


def device() -> torch.device:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gather_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``targets`` and the entropy, from ``logits`` ``[..., V]``.

    log p = log_softmax(logits / T)[target], computed in float32 as trainers do
    (verl ``logprobs_from_logits``); H = −Σ p log p over the vocabulary. With ``top_k`` or
    ``top_p`` the distribution is first truncated and renormalised as a sampler does
    (:func:`conformance.sampling.truncate`), so a target outside it gets −inf.

    A batch ``[B, T, V]`` is computed one sequence at a time, which gives the same numbers
    (each position's softmax is its own): its full-vocabulary intermediates are one
    sequence's. Over the whole batch, a 32 × 640-token batch of a 49,152-id vocabulary took
    4 GB a copy and peaked at 23 GB.
    """
    import torch

    if logits.ndim > 2:
        pairs = zip(logits, targets, strict=True)
        rows = [gather_logprobs(*row, temperature, top_k, top_p) for row in pairs]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_k or top_p < 1.0:
        logp = truncate(logp, top_k, top_p)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return picked, entropy
