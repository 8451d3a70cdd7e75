"""Engines written the way a user brings their own: one that refuses a precision it cannot run,
one whose answers make the harness's own code raise (an adapter fault), and one whose batching
is broken while it ignores the knob meant to change it.

Plug one in as ``--engine tests.support.byoe_engines:Fp32Only`` from the repository root.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from conformance.engines.base import Completion, EngineConfig, Knob, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.errors import UsageError

from .engines import UnmaskedPadding


class Fp32Only(HFGenerateEngine):
    """Runs float32 only and says so when started in another precision, as an adapter over a
    runtime without bf16 kernels does."""

    name = "fp32-only"

    def __init__(self, config: EngineConfig) -> None:
        if config.dtype != "float32":
            raise UsageError(
                f"{self.name} has no {config.dtype} kernels", "run it with --engine-dtype float32"
            )
        super().__init__(config)


class NoneFirstLogprob(HFGenerateEngine):
    """Reports ``None`` for the first sampled token's log-prob (a runtime that returns no
    log-prob for the token the prefill sampled), which the harness cannot turn into numbers."""

    name = "none-first-logprob"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions: list[Completion] = super().generate(prompts, spec, **kw)
        for completion in completions:
            completion.logprobs = [None, *completion.logprobs[1:]]  # type: ignore[list-item]
        return completions


class IgnoredKnobBatchingDefect(UnmaskedPadding):
    """Declares a ``max_batch_size`` knob that its ``generate`` ignores, over a batching defect
    of its own (padding a batch without masking it): run one prompt at a time, as the knob says,
    and the defect would vanish; ignored, every variant has it, as the engine itself does."""

    name = "ignored-knob-batching-defect"
    OPTIONS: ClassVar[Mapping[str, str]] = {**UnmaskedPadding.OPTIONS, "max_batch_size": "64"}
    capabilities = replace(UnmaskedPadding.capabilities, knobs={"max_batch_size": Knob(("1",))})
