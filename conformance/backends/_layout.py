"""How a trainer feeds sequences to its model, shared by every backend that runs a transformers
forward (``hf`` in this process, ``fsdp`` on each rank).

Sequences are cut into micro-batches and laid out as the trainer would: right padding, left
padding (positions counted from the first real token, as verl does), or packing into one row
with a block-diagonal causal mask and positions restarting per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from conformance.errors import UsageError
from conformance.hf_model import device, gather_logprobs
from conformance.routing import Replay, Routes, RouteTap, tapped
from conformance.sampling import truncate

if TYPE_CHECKING:
    import torch

    from conformance.backends.base import BackendConfig

LAYOUTS = ("right-pad", "left-pad", "packed")
#: (temperature, top_k, top_p) of the distribution to score (see ``Backend.recompute``)
Sampling = tuple[float, int, float]


def check_feeding(config: BackendConfig) -> None:
    """The micro-batch size and layout are ones a trainer can use."""
    if config.micro_batch_size < 1:
        raise UsageError(f"micro_batch_size={config.micro_batch_size}", "use micro_batch_size >= 1")
    if config.layout not in LAYOUTS:
        raise UsageError(f"unknown layout {config.layout!r}", "use right-pad, left-pad or packed")


def check_sequences(sequences: Sequence[Sequence[int]]) -> list[list[int]]:
    if any(len(s) < 2 for s in sequences):
        raise UsageError(
            "a sequence shorter than 2 tokens has nothing to score", "pass longer sequences"
        )
    return [list(s) for s in sequences]


def micro_batches(sequences: Sequence[list[int]], size: int) -> list[list[list[int]]]:
    return [list(sequences[start : start + size]) for start in range(0, len(sequences), size)]


def forward(
    model: torch.nn.Module,
    chunk: list[list[int]],
    layout: str,
    sampling: Sampling,
    compute_dtype: torch.dtype,
    replay: Replay | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Routes] | None]:
    """Log-probabilities and entropies of one micro-batch, per sequence (``len(seq) - 1`` each),
    and on an MoE model the routes of its scored positions (None on a dense one).

    ``compute_dtype`` is the dtype attention runs in (the packed layout's mask bias must match
    it); the log-probs keep their graph when grad is enabled, entropies never do. ``replay``
    routes the chunk's positions as the engine did (``conformance.routing``).
    """
    with tapped(model) as tap:
        if layout == "packed":
            lp, ent, rows = _forward_packed(model, chunk, sampling, compute_dtype, tap, replay)
        else:
            left = layout == "left-pad"
            lp, ent, rows = _forward_padded(model, chunk, left, sampling, tap, replay)
    return lp, ent, tap.sequence_routes(rows) if tap.active else None


def _forward_padded(
    model: torch.nn.Module,
    chunk: list[list[int]],
    left: bool,
    sampling: Sampling,
    tap: RouteTap,
    replay: Replay | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    width = max(map(len, chunk))
    columns = _scored_columns(chunk, width, left)
    rows = [_rows(row * width + c.start, c.stop - c.start) for row, c in enumerate(columns)]
    if replay is not None and tap.active:
        replay.arm(tap, rows, len(chunk) * width)
    logits, ids = _padded_logits(model, chunk, left)
    lp, ent = gather_logprobs(logits[:, :-1], ids[:, 1:].to(device()), *sampling)
    out_lp, out_ent = [], []
    for row, cols in enumerate(columns):
        out_lp.append(lp[row, cols].cpu() if not lp.requires_grad else lp[row, cols])
        out_ent.append(ent[row, cols].detach().cpu())
    return out_lp, out_ent, rows


def _rows(start: int, count: int) -> torch.Tensor:
    import torch

    return torch.arange(start, start + count)


def next_token_logprobs(
    model: torch.nn.Module, chunk: list[list[int]], sampling: Sampling
) -> list[torch.Tensor]:
    """The whole next-token distribution a sampler with ``sampling`` draws from, per scored
    position of each sequence: ``[len(seq) − 1, V]`` float32 log-probabilities (−inf outside
    top-k/top-p), right-padded (layouts are held to agree elsewhere)."""
    import torch

    temperature, top_k, top_p = sampling
    logits, ids = _padded_logits(model, chunk, left=False)
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    if top_k or top_p < 1.0:
        logp = truncate(logp, top_k, top_p)
    return [logp[row, cols].cpu() for row, cols in enumerate(_scored_columns(chunk, ids.shape[1]))]


def _padded_logits(
    model: torch.nn.Module, chunk: list[list[int]], left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[B, W, V]`` of one padded micro-batch, and its ids ``[B, W]``."""
    import torch

    width = max(map(len, chunk))
    ids = torch.zeros(len(chunk), width, dtype=torch.long)
    mask = torch.zeros(len(chunk), width, dtype=torch.long)
    for row, seq in enumerate(chunk):
        cols = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, cols] = torch.tensor(seq)
        mask[row, cols] = 1
    # Positions count real tokens only, so left padding does not shift RoPE phases.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=ids.to(device()),
        attention_mask=mask.to(device()),
        position_ids=positions.to(device()),
    ).logits
    return logits, ids


def _scored_columns(chunk: list[list[int]], width: int, left: bool = False) -> list[slice]:
    """Per sequence, its ``len(seq) − 1`` scored columns of a padded batch ``width`` wide."""
    offsets = [width - len(seq) if left else 0 for seq in chunk]
    return [slice(o, o + len(seq) - 1) for o, seq in zip(offsets, chunk, strict=True)]


def _forward_packed(
    model: torch.nn.Module,
    chunk: list[list[int]],
    sampling: Sampling,
    dtype: torch.dtype,
    tap: RouteTap,
    replay: Replay | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    import torch

    ids = torch.tensor([t for seq in chunk for t in seq]).unsqueeze(0)
    positions = torch.cat([torch.arange(len(seq)) for seq in chunk]).unsqueeze(0)
    total = ids.shape[1]
    starts = [sum(map(len, chunk[:i])) for i in range(len(chunk))]
    rows = [_rows(start, len(seq) - 1) for start, seq in zip(starts, chunk, strict=True)]
    if replay is not None and tap.active:
        replay.arm(tap, rows, total)
    # Block-diagonal causal mask: a token sees only earlier tokens of its own sequence.
    segment = torch.cat([torch.full((len(s),), i) for i, s in enumerate(chunk)])
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(total, total).tril().bool()
    bias = torch.zeros(total, total, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    logits = model(
        input_ids=ids.to(device()),
        attention_mask=bias[None, None].to(device()),
        position_ids=positions.to(device()),
    ).logits[0]
    lp, ent = gather_logprobs(logits[:-1], ids[0, 1:].to(device()), *sampling)
    out_lp, out_ent = [], []
    for start, seq in zip(starts, chunk, strict=True):
        cols = slice(start, start + len(seq) - 1)
        out_lp.append(lp[cols].cpu() if not lp.requires_grad else lp[cols])
        out_ent.append(ent[cols].detach().cpu())
    return out_lp, out_ent, rows
