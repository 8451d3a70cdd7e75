"""How far the property search reaches: the sizes every suite draws from.

Real rollouts are thousands of tokens, engines batch hundreds of sequences and KV caches are
paged, so a property drawn only at toy sizes certifies nothing about them. The anchors: NeMo-RL's
validation matrix (sequence length 100 / 1,000 / 10,000; batch 1 / 8 / 32), SGLang's
decode-vs-prefill test (inputs up to 3,000 tokens, long outputs), vLLM's batch-invariance test
(batches up to 128). Sizes are drawn log-uniformly (``strategies.log_sizes``), so long cases are
reached without dominating a run's time and shrinking still ends at the smallest; and each
property runs one more example at the top sizes (``recorder.run_at_top``), so every run
reaches them.

A batch's tokens (sequences × longest prompt and rollout) are bounded too, as engines bound the
tokens of one step (vLLM's ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size``): batch
size and length each reach their top, but not together. Without the bound nearly every large
deep batch was the 64 × 4,096 corner (the longest of 64 drawn lengths is almost always the top),
and a deep run on 2 cores spent 25 minutes on 4 of its 10 properties.

On a CPU host a costly model draws within a budget its cost sets (:meth:`Depth.within_cost`):
each example's batch holds about as much forward-pass work as the depth's budget does on a
small model, a few seconds on two cores, down to what still reaches every limit. A trained
135M-parameter model's batches at the quick depth's corner, 32 × (512 + 128) tokens, took 90–115 s
per property there, and a property runs about 20 of them.

A run certified before a long RL run is certified at that run's own shape
(:meth:`Depth.with_run_shape`): its longest prompt and rollout, its rollout batch and its GRPO
group size replace the depth's limits, and the example each property runs at the top sizes
reaches them (a grouped batch at the run's group size, where the property draws groups).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from conformance.errors import UsageError

if TYPE_CHECKING:
    from conformance.models import ModelInfo


@dataclass(frozen=True)
class Depth:
    """Upper ends of the drawn sizes. ``max_prompt_len`` None: up to the model's context;
    ``max_batch_tokens``: sequences × (longest prompt + new tokens) of one batch, set by
    ``budget`` (:data:`BUDGETS`); ``group_size``: the run's GRPO group size (None: groups of
    2–16 are drawn, none forced)."""

    name: str
    max_new_tokens: int
    max_prompt_len: int | None
    max_batch: int
    max_batch_tokens: int
    purpose: str
    group_size: int | None = None
    budget: Literal["depth", "run shape", "option", "model cost"] = "depth"

    def with_run_shape(
        self,
        *,
        max_prompt_len: int | None = None,
        max_new_tokens: int | None = None,
        max_batch: int | None = None,
        group_size: int | None = None,
        max_batch_tokens: int | None = None,
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
        if max_batch_tokens is not None:
            shaped = replace(shaped, max_batch_tokens=max_batch_tokens, budget="option")
        if shaped.group_size is not None and shaped.group_size > shaped.max_batch:
            raise UsageError(
                f"--group-size {shaped.group_size} is larger than the batch of "
                f"{shaped.max_batch} sequences",
                f"pass --max-batch {shaped.group_size} or more",
            )
        if shaped.max_prompt_len is not None:
            longest = shaped.max_prompt_len + shaped.max_new_tokens
            needed = longest * (shaped.group_size or 1)
            if needed > shaped.max_batch_tokens:
                shaped = replace(shaped, max_batch_tokens=needed, budget="run shape")
        return shaped

    def within_cost(self, weights: int, context: int | None) -> Depth:
        """This depth with its token budget lowered so that a batch holds
        :data:`CPU_BATCH_WORK` (``weights`` × tokens, :func:`forward_weights`), but never below
        what reaches every limit: the largest batch of one-token prompts with the longest
        rollouts, and one whole group (one sequence without a group size) of the longest
        prompt and rollout within ``context``. The two are then drawn as two top-size examples
        (``conformance.strategies.at_top_sizes``). Unchanged where an option set the budget or
        the depth's largest batch fits the lowered one anyway."""
        if self.budget == "option":
            return self
        prompt = self.max_prompt_len or (context or 1 << 30) - self.max_new_tokens - 1
        floor = max(
            self.max_batch * (1 + self.max_new_tokens),
            (prompt + self.max_new_tokens) * (self.group_size or 1),
        )
        tokens = min(self.max_batch_tokens, max(floor, CPU_BATCH_WORK // max(1, weights)))
        corner = self.max_batch * (prompt + self.max_new_tokens)
        if tokens == self.max_batch_tokens or tokens >= corner:  # no drawn batch changes
            return self
        return replace(self, max_batch_tokens=tokens, budget="model cost")

    def for_host(self, model: ModelInfo, device: Mapping[str, Any]) -> Depth:
        """The depth a run on ``device`` draws for ``model``: on a CPU, within the model's cost
        (:meth:`within_cost`, its weights per token from :func:`forward_weights`); an
        accelerator holds the depth's own."""
        if device.get("kind") != "cpu":
            return self
        weights = forward_weights(
            hidden_size=model.hidden_size, num_layers=model.num_layers, vocab_size=model.vocab_size
        )
        return self.within_cost(weights, model.max_position_embeddings)

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

    def check_fits(self, context: int | None) -> None:
        """A run shape the model cannot hold is an error, not a silently shorter run (a depth's
        own limits are clamped to the model's ``context`` instead)."""
        if context is None or self.max_prompt_len is None or self == depth(self.name):
            return
        # one more position: an engine scores a sequence by generating one token after it
        needed = self.max_prompt_len + self.max_new_tokens + 1
        if needed > context:
            raise UsageError(
                f"--max-prompt-len {self.max_prompt_len} + --max-new-tokens "
                f"{self.max_new_tokens} (+1) needs {needed} positions; the model has {context}",
                f"pass a shorter run shape, at most {context - 1} tokens together",
            )

    def calibration_cap(self, context: int | None) -> tuple[int, int, int] | None:
        """What this depth's own profile is calibrated up to where a run shape replaced the
        depth's limits (prompts, prompt length, new tokens); None for the depth's own."""
        base = depth(self.name)
        unbounded = context or 1 << 30
        cap = (self.max_batch, self.max_prompt_len or unbounded, self.max_new_tokens)
        limits = (base.max_batch, base.max_prompt_len or unbounded, base.max_new_tokens)
        # a shape at or above the depth's calibrates as the depth does, and shares its cache
        return cap if any(c < limit for c, limit in zip(cap, limits, strict=True)) else None

    def describe(self) -> str:
        prompts = f"{self.max_prompt_len}" if self.max_prompt_len else "the model's context"
        groups = f", GRPO groups of {self.group_size}" if self.group_size else ""
        return (
            f"{self.name} ({self.purpose}: rollouts up to {self.max_new_tokens} new tokens, "
            f"prompts up to {prompts}, batches up to {self.max_batch} sequences and "
            f"{self.max_batch_tokens:,} tokens{BUDGETS[self.budget]}{groups})"
        )


#: tokens in one drawn batch: 16 sequences of 4,096, or 64 of 1,024
MAX_BATCH_TOKENS = 65_536
#: what set a depth's ``max_batch_tokens``, as :meth:`Depth.describe` says it
BUDGETS = {
    "depth": "",
    "run shape": ", raised to hold the run's longest sequences",
    "option": ", as --max-batch-tokens gives",
    "model cost": ", sized to the model's cost on a CPU (--max-batch-tokens raises it)",
}
#: weights × tokens one drawn batch holds on a CPU host (:meth:`Depth.within_cost`): about 4 s
#: of forward pass on this project's 2-core CPU, where SmolLM2-135M (1.5e8 weights a token by
#: :func:`forward_weights`) scores about 450 tokens a second; the embedded models' 65,536-token
#: batches (1.2e5 weights a token) hold 3 % of it, and only models past 1.3e7 weights a token
#: hold more in the quick depth's largest batch
CPU_BATCH_WORK = 1 << 38


def forward_weights(*, hidden_size: int, num_layers: int, vocab_size: int) -> int:
    """Weights one token's forward pass multiplies through: ``12 · n_layer · d_model²`` for the
    layers (attention's four d × d projections and an MLP four times as wide; Kaplan et al.
    2020, "Scaling Laws for Neural Language Models", §2.1) plus the output head's
    ``vocab · d_model``. A cost scale, not an exact count: gated MLPs and grouped KV heads
    change the layers' share by tens of percent.

    >>> forward_weights(hidden_size=576, num_layers=30, vocab_size=49_152)
    147750912
    """
    return 12 * num_layers * hidden_size**2 + vocab_size * hidden_size


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


__all__ = [
    "DEPTHS",
    "Depth",
    "depth",
]
