"""How far the property search reaches: the sizes every suite draws from.

Real rollouts are thousands of tokens, engines batch hundreds of sequences and KV caches are
paged, so a property drawn only at toy sizes certifies nothing about them. The anchors: NeMo-RL's
validation matrix (sequence length 100 / 1,000 / 10,000; batch 1 / 8 / 32), SGLang's
decode-vs-prefill test (inputs up to 3,000 tokens, long outputs), vLLM's batch-invariance test
(batches up to 128). Sizes are drawn log-uniformly (``strategies.log_sizes``), so the long cases
are reached in every run without dominating its time, and shrinking still ends at the smallest.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.errors import UsageError


@dataclass(frozen=True)
class Depth:
    """Upper ends of the drawn sizes. ``max_prompt_len`` None: up to the model's context."""

    name: str
    max_new_tokens: int
    max_prompt_len: int | None
    max_batch: int
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
            f"prompts up to {prompts}, batches up to {self.max_batch})"
        )


DEPTHS = {
    d.name: d
    for d in (
        Depth("quick", max_new_tokens=128, max_prompt_len=512, max_batch=32, purpose="CI"),
        Depth(
            "deep",
            max_new_tokens=2048,
            max_prompt_len=None,
            max_batch=64,
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
