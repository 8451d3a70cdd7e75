"""The weight-sync suite's weights (``conformance.weights``) on a model with tied embeddings, as
most small trained models have (SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B): the perturbed state dict
keeps the tie, the folder written from it holds exactly those weights, and every other tensor
changes as it would untied (the models calibrate measured stay the same)."""

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
