"""The Backend protocol: how a trainer recomputes log-probabilities of given sequences.

Positions follow the Engine convention: for a sequence of length n, n − 1 values, entry ``t``
being ``log p(s[t + 1] | s[: t + 1])``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from conformance.parallel import ParallelSetting

if TYPE_CHECKING:
    import torch


Layout = Literal["right-pad", "left-pad", "packed"]


@dataclass
class BackendConfig:
    """What every backend is built from: the trainer's numerics knobs."""

    model: Path
    dtype: str = "float32"
    micro_batch_size: int = 8
    layout: Layout = "right-pad"
    attn_implementation: str = "sdpa"
    #: backend-specific settings as ``--backend-option KEY=VALUE`` gives them (strings)
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Recompute:
    """Per-sequence float32 tensors of shape ``[len(seq) - 1]``."""

    logprobs: list[torch.Tensor]
    #: entropy of the full next-token distribution at each position
    entropy: list[torch.Tensor]


class Backend(ABC):
    """A training backend's forward pass, batched the way the trainer batches."""

    name: ClassVar[str]
    #: the option that shards the model over processes, for backends that have one
    parallel: ClassVar[ParallelSetting | None] = None

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    @abstractmethod
    def recompute(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        grad: bool = False,
    ) -> Recompute:
        """Log-probabilities and entropies of the next-token distribution at every position.

        By default the raw model distribution ``log_softmax(logits)``. With ``temperature``,
        ``top_k`` (0 = off) or ``top_p`` (1.0 = off), the *processed* distribution a sampler
        draws from: logits / temperature, then everything outside the top k and outside the
        smallest nucleus of mass ≥ top_p masked out and the rest renormalised (the order of
        vLLM's and transformers' samplers). A token outside it gets ``-inf``.

        With ``grad=True`` the log-probabilities carry the autograd graph (for RL updates).
        """

    @property
    def module(self) -> torch.nn.Module:
        """The trainable model, for the RL smoke run."""
        raise NotImplementedError(f"backend {self.name!r} exposes no trainable module")

    def info(self) -> dict[str, Any]:
        c = self.config
        info = {
            "backend": self.name,
            "dtype": c.dtype,
            "micro_batch_size": c.micro_batch_size,
            "layout": c.layout,
            "attn_implementation": c.attn_implementation,
            "options": dict(c.options),
        }
        if self.parallel is not None:
            info["parallel"] = {self.parallel.label: self.parallel.size(c.options)}
        return info

    def close(self) -> None:
        """Release what the backend holds. Idempotent."""
