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


def test_a_costly_model_on_a_cpu_draws_within_its_cost_and_replays_it():
    spec = StackSpec().within_cost(SMOLLM2, CPU)
    assert spec.depth.max_batch_tokens == 32 * (1 + 128) and spec.depth.budget == "model cost"
    assert spec.option_values()["max-batch-tokens"] == "4128"
    args = spec.pytest_args()
    assert args[args.index("--tim-max-batch-tokens") + 1] == "4128"
    replayed = StackSpec.from_options({**_resolved(spec), "max-batch-tokens": "4128"}).within_cost(
        SMOLLM2, CPU
    )
    assert replayed.depth == replace(spec.depth, budget="option")


def test_the_budget_stays_the_depths_on_a_gpu_for_a_small_model_and_when_given():
    default = StackSpec()
    assert default.within_cost(SMOLLM2, {"kind": "cuda", "name": "H200"}) == default
    assert default.within_cost(_model(64, 2, 384), CPU) == default
    given = StackSpec.from_options({**_resolved(default), "max-batch-tokens": "65536"})
    assert given.within_cost(SMOLLM2, CPU) == given
    assert given.option_values()["max-batch-tokens"] == "65536"  # a replay keeps it


def _resolved(spec: StackSpec) -> dict:
    from conformance.options import resolve

    return resolve({}) | {k: v for k, v in spec.option_values().items() if v is not None}
