"""An engine whose defect appears under one knob value only: the knob suite must name that knob.

It is the documentation's micro-batched engine plus a knob that adds a constant to every
log-prob — the kind of error a fast path (a stale or approximated log-softmax) makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from conformance.engines import Knob

from .doc_engine import MicroBatchedEngine  # type: ignore[attr-defined]

#: what the defective knob value adds to every log-prob: ~10x the fp32 profile's bound
SKEW = 1e-3


class SkewedKnobEngine(MicroBatchedEngine):
    name = "skewed-knob-hf"
    OPTIONS: ClassVar[Mapping[str, str]] = {**MicroBatchedEngine.OPTIONS, "skew_logprobs": "false"}
    capabilities = replace(
        MicroBatchedEngine.capabilities,
        knobs={**MicroBatchedEngine.capabilities.knobs, "skew_logprobs": Knob(("true",))},
    )

    def _skew(self) -> float:
        return SKEW if self.options["skew_logprobs"] == "true" else 0.0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        completions = super().generate(*args, **kwargs)
        for completion in completions:
            completion.logprobs = [lp - self._skew() for lp in completion.logprobs]
        return completions

    def score(self, *args: Any, **kwargs: Any) -> Any:
        return [[lp - self._skew() for lp in row] for row in super().score(*args, **kwargs)]


class ChunkSeededEngine(MicroBatchedEngine):
    """A knob under which a seeded rollout cannot start from a prompt longer than the prefill
    chunk, as vLLM's CPU build cannot (its generators take no offset): the engine says so with
    ``NotImplementedError``, and the knob suite scores such examples only, saying how many."""

    name = "chunk-seeded-hf"
    OPTIONS: ClassVar[Mapping[str, str]] = {**MicroBatchedEngine.OPTIONS, "prefill_chunk": "0"}
    capabilities = replace(MicroBatchedEngine.capabilities, knobs={"prefill_chunk": Knob(("8",))})

    def generate(self, prompts: Any, spec: Any, **kwargs: Any) -> Any:
        chunk, longest = int(self.options["prefill_chunk"]), max(map(len, prompts))
        if chunk and longest > chunk:
            raise NotImplementedError(
                f"cannot seed a rollout from a {longest}-token prompt prefilled in chunks of "
                f"{chunk} tokens"
            )
        return super().generate(prompts, spec, **kwargs)
