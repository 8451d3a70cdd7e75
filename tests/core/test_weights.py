"""The weight-sync suite's weights (``conformance.weights``) on a model with tied embeddings, as
most small trained models have (SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B): the perturbed state dict
keeps the tie, the folder written from it holds exactly those weights, and every other tensor
changes as it would untied; and the perturbation
is large enough that an engine skipping the sync, or half of it, breaks every shipped
profile's bounds, which the weight-sync suite holds the engine to against itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance.weights import perturbed, read_weights, write_model

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tied")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_tied_embeddings_stay_one_tensor_through_the_perturbation(tied_model: Path) -> None:
    weights = read_weights(tied_model)
    assert weights[EMBED] is weights[HEAD]

    new = perturbed(weights, seed=1)

    assert new[EMBED] is new[HEAD]
    assert not torch.equal(new[HEAD], weights[HEAD])


def test_the_written_folder_holds_the_weights_the_engine_is_sent(
    tied_model: Path, tmp_path: Path
) -> None:
    """The engine gets ``new`` (``load_weights``), the backend the folder: they must agree on
    every name, the output embedding too (vLLM reads a tied head from the input embedding)."""
    new = perturbed(read_weights(tied_model), seed=2)

    folder = write_model(new, tied_model, tmp_path / "synced")

    written = read_weights(folder)
    assert written.keys() == new.keys()
    assert all(torch.equal(written[name], new[name]) for name in new)


def test_untied_tensors_change_as_they_would_without_the_tie(tied_model: Path) -> None:
    weights = read_weights(tied_model)
    untied = {name: tensor.clone() for name, tensor in weights.items()}

    tied_new, untied_new = perturbed(weights, seed=3), perturbed(untied, seed=3)

    assert untied_new[EMBED] is not untied_new[HEAD]
    assert all(torch.equal(tied_new[name], untied_new[name]) for name in weights if name != EMBED)


#: random-id sequences a stale engine is scored on: 8 × 96 tokens, past the embedded
#: tokenizer's special ids
STALE_BATCH, STALE_LEN, FIRST_ID = 8, 96, 3
#: perturbation seeds the stale engines are measured at (a run perturbs with its own seed)
SEEDS = (0, 1, 2)


def _logprobs(lm: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    from conformance.hf_model import gather_logprobs

    with torch.no_grad():
        return gather_logprobs(lm(ids).logits[:, :-1], ids[:, 1:])[0]


@pytest.fixture(scope="module")
def stale_metrics(default_model: Path) -> dict[tuple[int, str], dict[str, float]]:
    """Per sync seed, the metrics of an engine that kept the old weights (``"none"``) and of
    one that took the first half of the tensors it was sent (``"half"``, tests/support's
    ``PartialRefit``) against a trainer holding the new weights, all in fp32 on the embedded
    model: the defect alone, no precision's drift."""
    from conformance.hf_model import load_causal_lm
    from conformance.metrics import mismatch_metrics

    lm = load_causal_lm(default_model, "float32", "sdpa")
    ids = torch.randint(
        FIRST_ID, lm.config.vocab_size, (STALE_BATCH, STALE_LEN),
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    original = read_weights(default_model)
    stale = _logprobs(lm, ids)
    mask = torch.ones_like(stale, dtype=torch.bool)
    measured = {}
    for seed in SEEDS:
        new = perturbed(original, seed)
        lm.load_state_dict(new)
        trainer = _logprobs(lm, ids)
        half = sorted(new)[: len(new) // 2]
        lm.load_state_dict({**original, **{name: new[name] for name in half}})
        measured[seed, "none"] = mismatch_metrics(trainer, stale, mask)
        measured[seed, "half"] = mismatch_metrics(trainer, _logprobs(lm, ids), mask)
        lm.load_state_dict(original)
    return measured


@pytest.mark.parametrize("profile", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("refit", ["none", "half"])
def test_a_stale_engine_breaks_every_shipped_profile(
    stale_metrics: dict[tuple[int, str], dict[str, float]], profile: str, refit: str
) -> None:
    """The perturbation is large enough for the weight-sync suite to catch an engine that
    skips the sync or half of it under every shipped precision's profile, on one 8 × 96-token
    batch of each of a few seeds (the suite judges each example alone)."""
    from conformance.metric_table import EXAMPLE_METRICS
    from conformance.profiles import load_profile

    bounds = load_profile(profile)
    for seed in SEEDS:
        example = {k: v for k, v in stale_metrics[seed, refit].items() if k in EXAMPLE_METRICS}
        assert bounds.check(example, suite="weight_sync"), (seed, example)
