"""What the suites share: drawing a batch sized to the model, aligning rollout positions, and
describing a case so a failure can be replayed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from conformance.engines.base import Completion, SamplingSpec
from conformance.strategies import BatchShape, batch_shapes, token_batches

#: prompt length cap for property runs: long enough for real attention patterns, short enough
#: that 20 examples stay fast on two CPU cores; --tim-model with a bigger limit keeps this cap
MAX_PROMPT_LEN = 256


def prompt_batches(
    model: Any, *, max_new_tokens: int = 0, min_len: int = 1, max_batch: int = 8
) -> st.SearchStrategy[tuple[BatchShape, list[list[int]]]]:
    """Batches of prompts that fit the model's context together with ``max_new_tokens``."""
    limit = min(MAX_PROMPT_LEN, model.max_position_embeddings - max_new_tokens)
    shapes = batch_shapes(min_len=min_len, max_len=limit, max_batch=max_batch)
    return token_batches(model.vocab_size, shape=shapes, special_ids=model.special_token_ids)


def case(
    prompts: Sequence[Sequence[int]],
    shape: BatchShape | None = None,
    sampling: SamplingSpec | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The reproducer recorded with a measurement: prompt ids, batch shape, sampling spec."""
    return {
        "prompt_ids": [list(p) for p in prompts],
        "batch_shape": shape.as_dict() if shape else {"batch_size": len(prompts)},
        "sampling": sampling.as_dict() if sampling else None,
        **extra,
    }


def generated_rows(
    completions: Sequence[Completion], recomputed: Sequence[Any]
) -> tuple[list[list[float]], list[list[float]], list[list[int]]]:
    """Align a backend recompute of full sequences with the engine's sampled-token logprobs.

    Returns ``(lp_train, lp_infer, positions)`` over generated tokens only; ``positions`` counts
    from the first generated token, so plots of |Δlp| by position show drift along a rollout.
    """
    lp_train, lp_infer, positions = [], [], []
    for completion, row in zip(completions, recomputed, strict=True):
        start = len(completion.prompt) - 1
        values = row.tolist() if hasattr(row, "tolist") else list(row)
        lp_train.append(values[start : start + len(completion.tokens)])
        lp_infer.append(list(completion.logprobs))
        positions.append(list(range(len(completion.tokens))))
    return lp_train, lp_infer, positions
