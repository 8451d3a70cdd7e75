"""Cheap checks on a model folder (config and tokenizer JSON, weight headers; no model load)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.errors import ModelError
from conformance.models.features import ModelFeature, model_features

#: files that make up a model's identity (config, weights, tokenizer); READMEs and the like do not
_IDENTITY_SUFFIXES = frozenset({".json", ".safetensors", ".txt", ".model", ".jinja"})
#: the files ``save_pretrained`` stamps with the transformers release that wrote them, and the
#: stamp's key: one model saved by two releases is one model (a shipped profile's provenance
#: names it whichever release built it)
_STAMPED_FILES = frozenset({"config.json", "generation_config.json"})
_VERSION_STAMP = "transformers_version"
_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class ModelInfo:
    """What a run needs to know about a model folder, and a digest that identifies it."""

    path: Path
    arch: str
    architectures: list[str]
    vocab_size: int
    max_position_embeddings: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    special_token_ids: list[int]
    hidden_size: int
    num_layers: int
    sha256: str
    #: experts per MoE layer (0: a dense model), from ``num_experts`` (Qwen-MoE) or
    #: ``num_local_experts`` (Mixtral)
    num_experts: int = 0
    #: whether the tokenizer has a chat template (:func:`has_chat_template`): the suites then
    #: draw chat-templated natural-language prompts among the random ones
    chat_template: bool = False
    #: what distinguishes the model's architecture, which a run must reach
    #: (:mod:`conformance.models.features`)
    features: tuple[ModelFeature, ...] = ()


def inspect_model(path: Path) -> ModelInfo:
    """Validate the causal-LM folder ``path`` and describe it; ``ModelError`` names the fix."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(
            f"model folder {path} does not exist",
            "pass --model DIR, e.g. one made by `tim-conformance make-model DIR`",
        )
    config = _read_json(path / "config.json", "a folder written by save_pretrained")
    architectures = list(config.get("architectures") or [])
    if not any(name.endswith(_CAUSAL_LM_SUFFIXES) for name in architectures):
        raise ModelError(
            f"{path} holds {architectures or config.get('model_type')}, not a causal LM",
            "pass a folder with a *ForCausalLM model",
        )
    vocab_size = config["vocab_size"]
    max_id, special_ids = _tokenizer_ids(path)
    if max_id >= vocab_size:
        raise ModelError(
            f"the tokenizer in {path} has ids up to {max_id} but config.json has "
            f"vocab_size {vocab_size}",
            "use the tokenizer the model was saved with",
        )
    _check_weights(path)
    generation = _optional_json(path / "generation_config.json")
    return ModelInfo(
        path=path,
        arch=config["model_type"],
        architectures=architectures,
        vocab_size=vocab_size,
        max_position_embeddings=config.get("max_position_embeddings"),
        eos_token_id=_token_id("eos_token_id", config, generation),
        pad_token_id=_token_id("pad_token_id", config, generation),
        bos_token_id=_token_id("bos_token_id", config, generation),
        special_token_ids=special_ids,
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        sha256=folder_digest(path),
        num_experts=_experts(config),
        chat_template=has_chat_template(path),
        features=model_features(config),
    )


def has_chat_template(path: Path) -> bool:
    """Whether the tokenizer in ``path`` has a chat template: a ``chat_template.jinja`` file
    (transformers 5 saves it so) or a ``chat_template`` in ``tokenizer_config.json``."""
    path = Path(path)
    if (path / "chat_template.jinja").is_file():
        return True
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return False
    return bool(_read_json(config, "a valid tokenizer config").get("chat_template"))


def declared_experts(path: Path) -> int:
    """Experts per MoE layer that ``path``'s config.json declares; 0 for a dense model, and for
    a folder without a readable config (``inspect_model`` says what is wrong with it)."""
    try:
        return _experts(_read_json(Path(path) / "config.json", "a model folder"))
    except ModelError:
        return 0


def _experts(config: dict[str, Any]) -> int:
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def folder_digest(path: Path) -> str:
    """sha256 over (name, size, bytes) of the config, weight and tokenizer files, by name; the
    stamped JSON files (``_STAMPED_FILES``) enter as their content without the
    ``transformers_version`` stamp, keys sorted."""
    digest = hashlib.sha256()
    for file in sorted(f for f in path.iterdir() if f.suffix in _IDENTITY_SUFFIXES):
        if file.name in _STAMPED_FILES:
            content = _unstamped(file)
            digest.update(f"{file.name}\0{len(content)}\0".encode())
            digest.update(content)
            continue
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _unstamped(file: Path) -> bytes:
    """``file``'s JSON object without the transformers version stamp, keys sorted (read after
    ``inspect_model`` checked it holds one)."""
    content = _read_json(file, "a model folder saved by save_pretrained")
    content.pop(_VERSION_STAMP, None)
    return json.dumps(content, sort_keys=True).encode()


def _read_json(file: Path, what: str) -> dict[str, Any]:
    if not file.is_file():
        raise ModelError(f"{file.parent} has no {file.name}", f"pass {what}")
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {file}: {exc}", f"pass {what}") from None


def _optional_json(file: Path) -> dict[str, Any]:
    return _read_json(file, "a valid generation config") if file.is_file() else {}


def _tokenizer_ids(path: Path) -> tuple[int, list[int]]:
    """Largest id the tokenizer can produce, and the ids of its special tokens."""
    tokenizer = _read_json(
        path / "tokenizer.json", "a folder with a fast tokenizer saved by save_pretrained"
    )
    vocab = tokenizer.get("model", {}).get("vocab") or {}
    # BPE/WordPiece store {token: id}; Unigram stores [[piece, score], ...] indexed by id
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    added = tokenizer.get("added_tokens") or []
    ids += [token["id"] for token in added]
    special = sorted(token["id"] for token in added if token.get("special"))
    return max(ids, default=-1), special


def _check_weights(path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path} has no *.safetensors weights", "re-save it with save_pretrained")
    for file in files:
        try:
            # reads and validates the header only; numpy keeps torch out of this import
            with safe_open(str(file), framework="numpy") as weights:
                weights.keys()
        except (OSError, SafetensorError) as exc:
            raise ModelError(f"cannot read weights {file}: {exc}", "re-save the model") from None


def _token_id(key: str, config: dict[str, Any], generation: dict[str, Any]) -> int | None:
    value = config.get(key)
    if value is None:
        value = generation.get(key)
    # some models list several eos ids; the first is the one generation stops on by default
    return value[0] if isinstance(value, list) and value else value
