"""How peaked a model's next-token distributions are, measured on deterministic random prompts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: prompts drawn for the measurement: enough positions for a stable median, a cheap forward
N_PROMPTS, PROMPT_LEN = 8, 64


def peakedness(logits: torch.Tensor) -> tuple[float, float]:
    """Median max-probability and mean entropy (nats) of the softmax over the last dimension.

    With p = softmax(logits): max-prob = max_v p_v and H = −Σ_v p_v log p_v, per position.
    A uniform distribution over V tokens has max-prob 1/V and H = log V; a real LM's
    next-token distributions sit far below log V.
    """
    import torch

    logp = torch.log_softmax(logits.double().reshape(-1, logits.shape[-1]), dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(dim=-1)
    return float(p.max(dim=-1).values.median()), float(entropy.mean())


def measure(model: torch.nn.Module, vocab: int, first_id: int) -> tuple[float, float]:
    """``peakedness`` of ``model`` over random prompts of ids in [first_id, vocab), seed 0."""
    import torch

    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(first_id, vocab, (N_PROMPTS, PROMPT_LEN), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=prompts).logits
    return peakedness(logits)
