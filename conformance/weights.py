"""Model weights for the weight-sync property: read a model folder's weights, perturb them
reproducibly, and write a model folder holding the perturbed ones."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.hf_model import AUTO_ATTN, load_causal_lm

if TYPE_CHECKING:
    import torch

#: relative size of the perturbation: every tensor moves by half its own spread, so skipping
#: any one of them in a refit changes log-probabilities far beyond every profile
PERTURBATION = 0.5


def read_weights(model: Path) -> dict[str, torch.Tensor]:
    """The model folder's weights as a transformers-named state dict on CPU, in float32.

    A tensor the model holds under several names (tied input and output embeddings) is one
    tensor under each of them here too, as :func:`perturbed` needs to keep it one."""
    # the weights are read, never run: any implementation the model loads with will do
    lm = load_causal_lm(model, "float32", AUTO_ATTN)
    copies: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    weights = {}
    for name, tensor in lm.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in copies:
            copies[key] = tensor.detach().cpu().clone()
        weights[name] = copies[key]
    return weights


def perturbed(
    weights: dict[str, torch.Tensor], seed: int, scale: float = PERTURBATION
) -> dict[str, torch.Tensor]:
    """Every tensor changed, reproducibly from ``seed``: ``w + s·σ(w)·ε`` for matrices and
    ``w·(1 + s·ε)`` for vectors (norm weights, biases), ``ε ~ N(0, 1)``, ``s = scale`` (the
    suite's ``PERTURBATION``; other scales are for measuring it).

    A tensor under several names (tied embeddings, see :func:`read_weights`) changes once,
    as under its first name in sorted order, and stays one tensor: a refit of a tied model
    sends equal tensors, and an engine may read either name (vLLM skips ``lm_head.weight``
    when the embeddings are tied). That first name's change is also what
    :func:`write_model`'s folder holds (transformers loads ``lm_head.weight`` last), so the
    engine and the folder agree. Every name still draws its ε, so each other tensor's change
    is the same whatever is tied."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    changed: dict[str, torch.Tensor] = {}
    first_name: dict[int, str] = {}
    for name in sorted(weights):
        w = weights[name]
        noise = torch.randn(w.shape, generator=generator, dtype=torch.float32).to(w.dtype)
        first = first_name.setdefault(id(w), name)
        if first != name:
            changed[name] = changed[first]
        elif w.ndim >= 2:
            changed[name] = w + scale * w.float().std().to(w.dtype) * noise
        else:
            changed[name] = w * (1 + scale * noise)
    return changed


def write_model(weights: dict[str, torch.Tensor], like: Path, out: Path) -> Path:
    """A model folder at ``out``: ``like``'s config and tokenizer with ``weights``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(like)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(weights, strict=True)
    model.save_pretrained(out)
    for item in like.iterdir():
        if item.is_file() and not (out / item.name).exists():
            shutil.copy2(item, out / item.name)
    return out
