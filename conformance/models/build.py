"""Build a tiny random-initialised causal LM and its tokenizer, deterministically."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.errors import UsageError
from conformance.models import stats
from conformance.models.tokenizer import MIN_VOCAB, SPECIAL_TOKENS, save_tokenizer, train_tokenizer

if TYPE_CHECKING:
    import torch

#: vLLM's CPU attention has no kernel for head size 16; 32 is its smallest
HEAD_DIM = 32
#: long enough for the deep search: prompts of thousands of tokens plus 2,048 new ones
MAX_POSITIONS = 4096
#: std of the logits at init; std 0.02 everywhere gives near-uniform next-token distributions
LOGIT_STD = 4.0
#: spread of norm weights around 1 and of biases around 0
VECTOR_STD = 0.1


#: the window of the sliding-window families: small, so the suites' prompts (2–512 tokens at the
#: quick depth) cross it
WINDOW = 64
#: the original context of the RoPE-scaled families: the quick depth's prompts reach past it
ROPE_ORIGINAL_POSITIONS = 256
#: the SSM chunk of the hybrid family: prefill scans in chunks of this many tokens, decode steps
#: the recurrence one token at a time, so a rollout past it crosses a chunk boundary
SSM_CHUNK = 32


@dataclass(frozen=True)
class Family:
    """An ``--arch``: a transformers model type and the config that gives it its features.

    ``features`` names what distinguishes the family (what a conformance run must reach);
    ``logit_gain`` is what the family's head multiplies logits by (Granite divides by
    ``logits_scaling``, Cohere multiplies by ``logit_scale``), which the LM head's init divides
    out so every family's logits have the spread :data:`LOGIT_STD` gives.
    """

    model_type: str
    features: str
    config: Mapping[str, object] = field(default_factory=dict)
    #: layer kinds repeated over the layers (``layer_types``), for interleaved families
    layer_pattern: tuple[str, ...] = ()
    tied: bool = False
    logit_gain: float = 1.0
    #: what norm weights are drawn around: 1, or 0 for norms that scale by (1 + weight)
    norm_center: float = 1.0
    #: the config key of the norms' epsilon: a key the family does not read is no harmless
    #: extra, since an engine may read it (vLLM's Cohere takes ``rms_norm_eps`` as the sign to
    #: swap its LayerNorm for an RMSNorm)
    norm_eps_key: str = "rms_norm_eps"

    def config_fields(self, layers: int) -> dict[str, object]:
        fields = dict(self.config)
        if self.layer_pattern:
            period = len(self.layer_pattern)
            fields["layer_types"] = [self.layer_pattern[i % period] for i in range(layers)]
        return fields


SLIDING_THEN_FULL = ("sliding_attention", "full_attention")

#: --arch name → its family
ARCHS: dict[str, Family] = {
    "llama": Family("llama", "dense decoder"),
    "qwen2": Family("qwen2", "dense decoder, QKV biases", {"use_sliding_window": False}),
    "qwen3": Family("qwen3", "dense decoder, QK norms", {"use_sliding_window": False}),
    "qwen3-moe": Family(
        "qwen3_moe",
        "MoE: 4 experts, top-2, normalised top-k",
        {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True},
    ),
    "gemma2": Family(
        "gemma2",
        f"sliding window {WINDOW} on alternate layers, final-logit soft-cap 10, attention "
        "soft-cap 2, tied head (transformers runs it with eager attention only)",
        {
            "sliding_window": WINDOW,
            # caps near the logits' and scores' own spread (a tied head's logit for the token just
            # read sits near 30, the rest near 4; scores about 1), so tanh bends them
            "final_logit_softcapping": 10.0,
            "attn_logit_softcapping": 2.0,
            "query_pre_attn_scalar": HEAD_DIM,
            # the hub's Gemma-2 configs name the activation under both keys: transformers reads
            # hidden_activation, SGLang's Gemma-2 hidden_act
            "hidden_act": "gelu_pytorch_tanh",
        },
        layer_pattern=SLIDING_THEN_FULL,
        tied=True,
        norm_center=0.0,
    ),
    "mistral": Family(
        "mistral", f"sliding window {WINDOW} on every layer", {"sliding_window": WINDOW}
    ),
    "gpt-oss": Family(
        "gpt_oss",
        f"attention sinks, sliding window {WINDOW} on alternate layers, MoE (4 experts, top-2), "
        f"yarn RoPE past {ROPE_ORIGINAL_POSITIONS} positions (transformers runs it with eager "
        "attention only)",
        {
            "sliding_window": WINDOW,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": MAX_POSITIONS / ROPE_ORIGINAL_POSITIONS,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": ROPE_ORIGINAL_POSITIONS,
                "rope_theta": 150000.0,
            },
        },
        layer_pattern=SLIDING_THEN_FULL,
    ),
    "granite": Family(
        "granite", "logits divided by logits_scaling 8", {"logits_scaling": 8.0}, logit_gain=1 / 8
    ),
    "cohere": Family(
        "cohere",
        "logits multiplied by logit_scale 0.0625, parallel attention and MLP, LayerNorm, "
        "untied head",
        {"logit_scale": 0.0625},
        logit_gain=0.0625,
        norm_eps_key="layer_norm_eps",
    ),
    "qwen2-moe": Family(
        "qwen2_moe",
        "MoE with a shared expert, top-k weights not normalised, a leading dense layer",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "shared_expert_intermediate_size": 64,
            "mlp_only_layers": [0],
            "use_sliding_window": False,
        },
    ),
    "bamba": Family(
        "bamba",
        f"hybrid: a Mamba-2 SSM layer (chunk {SSM_CHUNK}) then an attention layer",
        {
            "attn_layer_indices": [1],
            "mamba_n_heads": 4,
            "mamba_d_head": HEAD_DIM,
            "mamba_d_state": 16,
            "mamba_chunk_size": SSM_CHUNK,
            "mamba_expand": 2,
            "mamba_n_groups": 1,
        },
    ),
    "llama-rope-scaled": Family(
        "llama",
        f"llama3 RoPE scaling (factor 8) of an original {ROPE_ORIGINAL_POSITIONS}-position context",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": ROPE_ORIGINAL_POSITIONS,
                "rope_theta": 10000.0,
            }
        },
    ),
}


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
    family = ARCHS[arch]
    bos, eos, pad = range(len(SPECIAL_TOKENS))
    config = AutoConfig.for_model(
        family.model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=family.tied,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        **{family.norm_eps_key: 1e-6},
        **family.config_fields(layers),
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    _initialise(model, torch.Generator().manual_seed(seed), hidden, family)
    return model.eval()


def _initialise(
    model: torch.nn.Module, generator: torch.Generator, hidden: int, family: Family
) -> None:
    """Draw every parameter from ``generator`` in name order, so weights depend on the seed only.

    Norm weights are ``norm_center`` + N(0, VECTOR_STD²), other vectors (biases, attention
    sinks, SSM decay and skip terms) N(0, VECTOR_STD²). Projections get std 1/√fan_in:
    activations keep unit scale, so attention and MLP shape the hidden state, not just the
    current token's embedding. The LM head gets std LOGIT_STD/(√hidden · logit_gain): the final
    norm gives unit-RMS features, so logits have std ≈ LOGIT_STD whatever the family's head
    multiplies them by. A tied head is the embedding, which then gets the head's std.
    """
    import torch

    head_std = LOGIT_STD / (math.sqrt(hidden) * family.logit_gain)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                # not exactly 1 and 0, so an engine that drops a norm weight or a bias shows
                param.normal_(0.0, VECTOR_STD, generator=generator)
                if "norm" in name:
                    param.add_(family.norm_center)
            elif name.startswith("lm_head") or (family.tied and "embed_tokens" in name):
                param.normal_(0.0, head_std, generator=generator)
            elif "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=generator)
            else:
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=generator)
