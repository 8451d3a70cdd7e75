"""How far the property search reaches: the sizes every suite draws from.

Real rollouts are thousands of tokens, engines batch hundreds of sequences and KV caches are
paged, so a property drawn only at toy sizes certifies nothing about them. The anchors: NeMo-RL's
validation matrix (sequence length 100 / 1,000 / 10,000; batch 1 / 8 / 32), SGLang's
decode-vs-prefill test (inputs up to 3,000 tokens, long outputs), vLLM's batch-invariance test
(batches up to 128). Sizes are drawn log-uniformly (``strategies.log_sizes``), so long cases are
reached without dominating a run's time and shrinking still ends at the smallest; and each
property runs one more example at the top sizes (``recorder.one_example_at_top``), so every run
reaches them.

A batch's tokens (sequences × longest prompt and rollout) are bounded too, as engines bound the
tokens of one step (vLLM's ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size``): batch
size and length each reach their top, but not together. Without the bound nearly every large
deep batch was the 64 × 4,096 corner (the longest of 64 drawn lengths is almost always the top),
and a deep run on 2 cores spent 25 minutes on 4 of its 10 properties.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.errors import UsageError


@dataclass(frozen=True)
class Depth:
    """Upper ends of the drawn sizes. ``max_prompt_len`` None: up to the model's context;
    ``max_batch_tokens``: sequences × (longest prompt + new tokens) of one batch."""

    name: str
    max_new_tokens: int
    max_prompt_len: int | None
    max_batch: int
    max_batch_tokens: int
    purpose: str

    def prompt_limit(self, context: int, new_tokens: int = 0) -> int:
        """Longest prompt to draw for a model with ``context`` positions, leaving room for
        ``new_tokens`` generated tokens."""
        room = context - new_tokens
        limit = room if self.max_prompt_len is None else min(self.max_prompt_len, room)
        if limit < 2:
            raise UsageError(
                f"the model's context of {context} positions leaves no room for prompts next to "
                f"{new_tokens} new tokens",
                "use a model with a longer context (max_position_embeddings)",
            )
        return limit

    def describe(self) -> str:
        prompts = f"{self.max_prompt_len}" if self.max_prompt_len else "the model's context"
        return (
            f"{self.name} ({self.purpose}: rollouts up to {self.max_new_tokens} new tokens, "
            f"prompts up to {prompts}, batches up to {self.max_batch} sequences and "
            f"{self.max_batch_tokens:,} tokens)"
        )


#: tokens in one drawn batch: 16 sequences of 4,096, or 64 of 1,024
MAX_BATCH_TOKENS = 65_536

DEPTHS = {
    d.name: d
    for d in (
        # quick's largest batch (32 × 640 tokens) is within its budget
        Depth(
            "quick",
            max_new_tokens=128,
            max_prompt_len=512,
            max_batch=32,
            max_batch_tokens=MAX_BATCH_TOKENS,
            purpose="CI",
        ),
        Depth(
            "deep",
            max_new_tokens=2048,
            max_prompt_len=None,
            max_batch=64,
            max_batch_tokens=MAX_BATCH_TOKENS,
            purpose="before a long RL run",
        ),
    )
}


def depth(name: str) -> Depth:
    """The depth called ``name``; a one-line error lists the choices."""
    try:
        return DEPTHS[name]
    except KeyError:
        raise UsageError(f"unknown depth {name!r}", f"use one of: {', '.join(DEPTHS)}") from None
