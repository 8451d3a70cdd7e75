"""inspect_model: what it reports on a good folder, and one ModelError per kind of bad folder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.errors import ModelError
from conformance.models import ModelStats, inspect_model


@pytest.fixture
def copy(zoo: dict[str, ModelStats], tmp_path: Path) -> Path:
    """A private copy of the default-sized qwen2 model, free to break."""
    return Path(shutil.copytree(zoo["qwen2"].path, tmp_path / "model"))


def test_reports_the_config_and_tokenizer(zoo: dict[str, ModelStats]) -> None:
    info = inspect_model(zoo["qwen3-moe"].path)
    assert (info.arch, info.architectures) == ("qwen3_moe", ["Qwen3MoeForCausalLM"])
    assert (info.vocab_size, info.max_position_embeddings) == (384, 4096)
    assert (info.bos_token_id, info.eos_token_id, info.pad_token_id) == (0, 1, 2)
    assert info.special_token_ids == [0, 1, 2]
    assert (info.hidden_size, info.num_layers) == (64, 2)


def test_digest_follows_config_weights_and_tokenizer_only(
    zoo: dict[str, ModelStats], copy: Path
) -> None:
    original = inspect_model(zoo["qwen2"].path).sha256
    assert inspect_model(copy).sha256 == original
    (copy / "README.md").write_text("notes do not change what the model is")
    assert inspect_model(copy).sha256 == original
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(weights)
    assert inspect_model(copy).sha256 != original
    assert inspect_model(zoo["llama"].path).sha256 != original


def test_digest_leaves_out_the_transformers_version_stamp(
    zoo: dict[str, ModelStats], copy: Path
) -> None:
    # save_pretrained stamps the release that wrote the folder: one model built by two
    # releases (an engine's env pins another) must match the same shipped profile
    original = inspect_model(zoo["qwen2"].path).sha256
    _edit_config(copy, transformers_version="0.0.1")
    generation = json.loads((copy / "generation_config.json").read_text())
    generation["transformers_version"] = "0.0.1"
    (copy / "generation_config.json").write_text(json.dumps(generation, indent=4))
    assert inspect_model(copy).sha256 == original
    _edit_config(copy, rope_theta=1234.5)
    assert inspect_model(copy).sha256 != original


def _edit_config(copy: Path, **changes: object) -> None:
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **changes}))


def _truncate_weights(copy: Path) -> None:
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


BREAKAGES: dict[str, tuple[Callable[[Path], object], str]] = {
    "missing folder": (shutil.rmtree, "tim-conformance make-model DIR"),
    "no config": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "config not json": (lambda d: (d / "config.json").write_text("{"), "cannot read"),
    "not a causal LM": (lambda d: _edit_config(d, architectures=["BertModel"]), "not a causal"),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "has no tokenizer.json"),
    "tokenizer beyond vocab": (lambda d: _edit_config(d, vocab_size=300), "ids up to 383"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "no *.safetensors"),
    "truncated weights": (_truncate_weights, "cannot read weights"),
}


@pytest.mark.parametrize("breakage", tuple(BREAKAGES))
def test_a_broken_folder_is_a_one_line_model_error(copy: Path, breakage: str) -> None:
    break_it, problem = BREAKAGES[breakage]
    break_it(copy)
    with pytest.raises(ModelError) as caught:
        inspect_model(copy)
    message = str(caught.value)
    assert problem in message and "\n" not in message
    assert caught.value.fix
