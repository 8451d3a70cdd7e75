"""make_model: determinism, loadability in transformers, tokenizer, peakedness, bad arguments."""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.errors import UsageError
from conformance.models import ARCHS, ModelStats, make_model
from conformance.models.build import HEAD_DIM, MAX_POSITIONS
from conformance.models.stats import peakedness
from conformance.models.tokenizer import SPECIAL_TOKENS, _trained_json

from .conftest import file_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ALL_ARCHS = pytest.mark.parametrize("arch", tuple(ARCHS))


@ALL_ARCHS
def test_same_arguments_give_bitwise_identical_files(
    zoo: dict[str, ModelStats], tmp_path: Path, arch: str
) -> None:
    again = make_model(tmp_path / "again", arch=arch)
    assert file_bytes(again.path) == file_bytes(zoo[arch].path)
    assert again == ModelStats(**{**vars(zoo[arch]), "path": again.path})


def test_another_seed_gives_other_weights_and_the_same_tokenizer(
    zoo: dict[str, ModelStats], tmp_path: Path
) -> None:
    other = file_bytes(make_model(tmp_path / "seed1", seed=1).path)
    first = file_bytes(zoo["qwen2"].path)
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


@ALL_ARCHS
def test_loads_in_transformers_and_runs_a_forward_pass(
    zoo: dict[str, ModelStats], arch: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = zoo[arch].path
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = model.config
    assert len(tokenizer) == config.vocab_size == 384
    assert config.hidden_size // config.num_attention_heads == config.head_dim == HEAD_DIM
    assert config.max_position_embeddings == MAX_POSITIONS
    assert [tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token] == list(SPECIAL_TOKENS)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 1, 2)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer("What is 12 + 7? The answer is 19.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tokenizer_training_is_deterministic() -> None:
    # a fresh training run (new hash-map seeds inside tokenizers) against the cached one
    assert _trained_json.__wrapped__(384) == _trained_json(384)


@pytest.fixture(scope="module")
def tokenizer(zoo: dict[str, ModelStats]) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(zoo["qwen2"].path)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_tokenizer_round_trips_nfc_text(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    ids = tokenizer(text).input_ids
    assert all(0 <= i < len(tokenizer) for i in ids)
    # the tokenizer normalises to NFC, as Qwen2's does
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_peakedness_of_uniform_and_one_hot_logits() -> None:
    vocab = 384
    assert peakedness(torch.zeros(5, vocab)) == pytest.approx((1 / vocab, math.log(vocab)))
    one_hot = torch.full((3, 2, vocab), -1e4)
    one_hot[..., 7] = 0.0
    assert peakedness(one_hot) == pytest.approx((1.0, 0.0), abs=1e-9)


@ALL_ARCHS
def test_next_token_distributions_are_peaked(zoo: dict[str, ModelStats], arch: str) -> None:
    stats = zoo[arch]
    uniform_entropy = math.log(384)
    # a uniform model scores 1/384 and log 384; a real LM is far more certain than that
    assert 0.3 <= stats.median_max_prob <= 0.7
    assert 0.15 * uniform_entropy <= stats.mean_entropy <= 0.5 * uniform_entropy


def test_wider_model_has_more_heads_of_the_same_size(tmp_path: Path) -> None:
    stats = make_model(tmp_path / "wide", arch="qwen3", hidden=128, layers=1, vocab=512)
    config = json.loads((stats.path / "config.json").read_text())
    assert (config["num_attention_heads"], config["head_dim"]) == (4, HEAD_DIM)
    assert (config["num_hidden_layers"], config["vocab_size"]) == (1, 512)
    assert 0.3 <= stats.median_max_prob <= 0.7


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        ({"hidden": 48}, "--hidden 48"),
        ({"arch": "gpt2"}, "gpt2"),
        ({"vocab": 200}, "--vocab 200"),
        ({"layers": 0}, "--layers 0"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(
    tmp_path: Path, arguments: dict[str, object], names: str
) -> None:
    with pytest.raises(UsageError) as caught:
        make_model(tmp_path / "model", **arguments)
    assert names in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.fix
    assert not (tmp_path / "model").exists()


def test_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not an empty folder"):
        make_model(tmp_path)
    assert [f.name for f in tmp_path.iterdir()] == ["notes.txt"]
