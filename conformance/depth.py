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

A run certified before a long RL run is certified at that run's own shape
(:meth:`Depth.with_run_shape`): its longest prompt and rollout, its rollout batch and its GRPO
group size replace the depth's limits, and the example each property runs at the top sizes
reaches them (a grouped batch at the run's group size, where the property draws groups).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from conformance.errors import UsageError


@dataclass(frozen=True)
class Depth:
    """Upper ends of the drawn sizes. ``max_prompt_len`` None: up to the model's context;
    ``max_batch_tokens``: sequences × (longest prompt + new tokens) of one batch;
    ``group_size``: the run's GRPO group size (None: groups of 2–16 are drawn, none forced)."""

    name: str
    max_new_tokens: int
    max_prompt_len: int | None
    max_batch: int
    max_batch_tokens: int
    purpose: str
    group_size: int | None = None

    def with_run_shape(
        self,
        *,
        max_prompt_len: int | None = None,
        max_new_tokens: int | None = None,
        max_batch: int | None = None,
        group_size: int | None = None,
    ) -> Depth:
        """This depth with a run's own limits in place of its own (None keeps the depth's).

        The token budget grows to hold one batch of the run's longest sequence and, at the
        run's group size, one whole group of them: both are cases the run will produce.
        """
        shaped = replace(
            self,
            max_prompt_len=self.max_prompt_len if max_prompt_len is None else max_prompt_len,
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            max_batch=self.max_batch if max_batch is None else max_batch,
            group_size=self.group_size if group_size is None else group_size,
        )
        if shaped.group_size is not None and shaped.group_size > shaped.max_batch:
            raise UsageError(
                f"--group-size {shaped.group_size} is larger than the batch of "
                f"{shaped.max_batch} sequences",
                f"pass --max-batch {shaped.group_size} or more",
            )
        if shaped.max_prompt_len is not None:
            longest = shaped.max_prompt_len + shaped.max_new_tokens
            needed = longest * (shaped.group_size or 1)
            shaped = replace(shaped, max_batch_tokens=max(shaped.max_batch_tokens, needed))
        return shaped

    def run_shape(self) -> dict[str, int | None]:
        """The limits a run is drawn up to, as report.json records them."""
        return {
            "max_prompt_len": self.max_prompt_len,
            "max_new_tokens": self.max_new_tokens,
            "max_batch": self.max_batch,
            "max_batch_tokens": self.max_batch_tokens,
            "group_size": self.group_size,
        }

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
        groups = f", GRPO groups of {self.group_size}" if self.group_size else ""
        return (
            f"{self.name} ({self.purpose}: rollouts up to {self.max_new_tokens} new tokens, "
            f"prompts up to {prompts}, batches up to {self.max_batch} sequences and "
            f"{self.max_batch_tokens:,} tokens{groups})"
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
