"""A costly model's token budget on a CPU: set from the model's size, carried by the replay
flags, left alone on an accelerator and where an option names one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conformance.models import ModelInfo
from conformance.stack import StackSpec

CPU = {"kind": "cpu", "name": "x86_64"}


def _model(hidden: int, layers: int, vocab: int) -> ModelInfo:
    return ModelInfo(
        path=Path("m"),
        arch="llama",
        architectures=["LlamaForCausalLM"],
        vocab_size=vocab,
        max_position_embeddings=8192,
        eos_token_id=2,
        pad_token_id=None,
        bos_token_id=1,
        special_token_ids=[0, 1, 2],
        hidden_size=hidden,
        num_layers=layers,
        sha256="ab" * 32,
    )


SMOLLM2 = _model(576, 30, 49_152)


def within_cost(spec: StackSpec, model: ModelInfo, device: dict[str, str]) -> StackSpec:
    """``spec`` drawn as preflight draws it for ``model`` on ``device``."""
    return replace(spec, depth=spec.depth.for_host(model, device))


def test_a_costly_model_on_a_cpu_draws_within_its_cost_and_replays_it():
    spec = within_cost(StackSpec(), SMOLLM2, CPU)
    assert spec.depth.max_batch_tokens == 32 * (1 + 128) and spec.depth.budget == "model cost"
    assert spec.option_values()["max-batch-tokens"] == "4128"
    args = spec.pytest_args()
    assert args[args.index("--tim-max-batch-tokens") + 1] == "4128"
    replayed = within_cost(_replayed(spec, **{"max-batch-tokens": "4128"}), SMOLLM2, CPU)
    assert replayed.depth == replace(spec.depth, budget="option")


def test_the_budget_stays_the_depths_on_a_gpu_for_a_small_model_and_when_given():
    default = StackSpec()
    assert within_cost(default, SMOLLM2, {"kind": "cuda", "name": "H200"}) == default
    assert within_cost(default, _model(64, 2, 384), CPU) == default
    given = _replayed(default, **{"max-batch-tokens": "65536"})
    assert within_cost(given, SMOLLM2, CPU) == given
    assert given.option_values()["max-batch-tokens"] == "65536"  # a replay keeps it


def _replayed(spec: StackSpec, **changes: str) -> StackSpec:
    """The stack ``spec``'s option values give, with ``changes``, built as a replay builds it."""
    return StackSpec.from_options({}, {**spec.option_values(), **changes})
