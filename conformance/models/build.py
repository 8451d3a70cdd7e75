"""Build a tiny random-initialised causal LM and its tokenizer, deterministically."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.errors import UsageError
from conformance.models import stats
from conformance.models.tokenizer import MIN_VOCAB, SPECIAL_TOKENS, save_tokenizer, train_tokenizer

if TYPE_CHECKING:
    import torch

#: --arch name → (transformers model_type, arch-specific config fields)
ARCHS: dict[str, tuple[str, dict[str, object]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {"use_sliding_window": False}),
    "qwen3": ("qwen3", {"use_sliding_window": False}),
    "qwen3-moe": (
        "qwen3_moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True},
    ),
}
#: vLLM's CPU attention has no kernel for head size 16; 32 is its smallest
HEAD_DIM = 32
#: long enough for the deep search: prompts of thousands of tokens plus 2,048 new ones
MAX_POSITIONS = 4096
#: std of the logits at init; std 0.02 everywhere gives near-uniform next-token distributions
LOGIT_STD = 4.0
#: spread of norm weights around 1 and of biases around 0
VECTOR_STD = 0.1


@dataclass(frozen=True)
class ModelStats:
    """What ``make_model`` wrote, and how peaked its next-token distributions are."""

    path: Path
    arch: str
    seed: int
    vocab: int
    n_params: int
    median_max_prob: float
    mean_entropy: float


def make_model(
    out_dir: Path,
    *,
    arch: str = "qwen2",
    seed: int = 0,
    vocab: int = 384,
    layers: int = 2,
    hidden: int = 64,
) -> ModelStats:
    """Write a tiny causal LM (safetensors) and its tokenizer into the new or empty ``out_dir``.

    Same arguments give bitwise-identical files. The tokenizer depends on ``vocab`` only.
    """
    _check_args(out_dir, arch, vocab, layers, hidden)
    tokenizer = train_tokenizer(vocab, max_length=MAX_POSITIONS)
    if len(tokenizer) != vocab:
        raise UsageError(
            f"--vocab {vocab} is more than the built-in corpus yields ({len(tokenizer)} tokens)",
            "pass a smaller --vocab",
        )
    model = _random_model(arch, seed, vocab, layers, hidden)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    median_max_prob, mean_entropy = stats.measure(model, vocab, first_id=len(SPECIAL_TOKENS))
    return ModelStats(
        path=out_dir,
        arch=arch,
        seed=seed,
        vocab=vocab,
        n_params=sum(p.numel() for p in model.parameters()),
        median_max_prob=median_max_prob,
        mean_entropy=mean_entropy,
    )


def _check_args(out_dir: Path, arch: str, vocab: int, layers: int, hidden: int) -> None:
    if arch not in ARCHS:
        raise UsageError(f"unknown arch {arch!r}", f"use one of: {', '.join(ARCHS)}")
    if hidden < HEAD_DIM or hidden % HEAD_DIM:
        raise UsageError(
            f"--hidden {hidden} is not a multiple of the head size {HEAD_DIM}",
            "pass --hidden 64, 96, 128, ...",
        )
    if vocab < MIN_VOCAB:
        raise UsageError(f"--vocab {vocab} is below the byte alphabet", f"pass ≥ {MIN_VOCAB}")
    if layers < 1:
        raise UsageError(f"--layers {layers} builds no model", "pass --layers 1 or more")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} exists and is not an empty folder", "pass a new folder")


def _random_model(arch: str, seed: int, vocab: int, layers: int, hidden: int) -> torch.nn.Module:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    model_type, extra = ARCHS[arch]
    bos, eos, pad = range(len(SPECIAL_TOKENS))
    config = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    _initialise(model, torch.Generator().manual_seed(seed), hidden)
    return model.eval()


def _initialise(model: torch.nn.Module, generator: torch.Generator, hidden: int) -> None:
    """Draw every parameter from ``generator`` in name order, so weights depend on the seed only.

    Norm weights are 1 + N(0, VECTOR_STD²), biases N(0, VECTOR_STD²). Projections get std
    1/√fan_in: activations keep unit scale, so attention and MLP shape the hidden state, not
    just the current token's embedding. The LM head gets std LOGIT_STD/√hidden: the final
    RMSNorm gives unit-RMS features, so logits have std ≈ LOGIT_STD.
    """
    import torch

    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                # not exactly 1 and 0, so an engine that drops a norm weight or a bias shows
                param.normal_(0.0, VECTOR_STD, generator=generator)
                if "norm" in name:
                    param.add_(1.0)
            elif name.startswith("lm_head"):
                param.normal_(0.0, LOGIT_STD / math.sqrt(hidden), generator=generator)
            elif "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=generator)
            else:
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=generator)
