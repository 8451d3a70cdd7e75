"""The Backend protocol: how a trainer recomputes log-probabilities of given sequences, and
how it trains (the RL smoke run's side of a step).

Positions follow the Engine convention: for a sequence of length n, n − 1 values, entry ``t``
being ``log p(s[t + 1] | s[: t + 1])``.

Training protocol (``update``, ``state_dict``, ``reset_optimizer``): the RL loop in
``conformance.rl.loop`` trains only through these three, so a backend whose model lives
elsewhere (sharded over worker processes) trains the same way as the in-process ``hf`` one. The
batch and the loss are defined once, in ``conformance.training`` (``PolicyBatch``,
``policy_loss``): a backend never computes a loss of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from conformance.errors import UsageError
from conformance.hf_model import AUTO_ATTN
from conformance.parallel import ParallelSetting
from conformance.releases import ReleaseRange
from conformance.routing import Routes

if TYPE_CHECKING:
    import torch

    from conformance.training import PolicyBatch


Layout = Literal["right-pad", "left-pad", "packed"]


@dataclass
class BackendConfig:
    """What every backend is built from: the trainer's numerics knobs."""

    model: Path
    dtype: str = "float32"
    micro_batch_size: int = 8
    layout: Layout = "right-pad"
    attn_implementation: str = AUTO_ATTN
    #: backend-specific settings as ``--backend-option KEY=VALUE`` gives them (strings)
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Recompute:
    """Per-sequence float32 tensors of shape ``[len(seq) - 1]``."""

    logprobs: list[torch.Tensor]
    #: entropy of the full next-token distribution at each position
    entropy: list[torch.Tensor]
    #: per sequence, where an MoE model routed each scored position (after any replay); None
    #: for a dense model or a backend that cannot tell
    routes: list[Routes] | None = None


class Backend(ABC):
    """A training backend's forward pass, batched the way the trainer batches."""

    name: ClassVar[str]
    #: the option that shards the model over processes, for backends that have one
    parallel: ClassVar[ParallelSetting | None] = None
    #: the releases of the package it drives that it supports (``conformance.releases``)
    RELEASES: ClassVar[ReleaseRange | None] = None

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Raise ``UsageError`` for ``--backend-option`` settings this backend does not take or
        cannot parse, before anything starts. By default a backend takes none."""
        if options:
            raise UsageError(
                f"backend {cls.name!r} takes no backend options (got {', '.join(sorted(options))})",
                "drop --backend-option",
            )

    @abstractmethod
    def recompute(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        grad: bool = False,
        routes: Sequence[Routes | None] | None = None,
    ) -> Recompute:
        """Log-probabilities and entropies of the next-token distribution at every position.

        By default the raw model distribution ``log_softmax(logits)``. With ``temperature``,
        ``top_k`` (0 = off) or ``top_p`` (1.0 = off), the *processed* distribution a sampler
        draws from: logits / temperature, then everything outside the top k and outside the
        smallest nucleus of mass ≥ top_p masked out and the rest renormalised (the order of
        vLLM's and transformers' samplers). A token outside it gets ``-inf``.

        With ``grad=True`` the log-probabilities carry the autograd graph (for RL updates).

        ``routes`` are the engine's routes per sequence (``Completion.routes``); a backend that
        replays routes (``routing_replay``, ``conformance.routing.REPLAY_MODES``) routes each
        scored position as given, others ignore them.
        """

    def next_token_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> list[torch.Tensor]:
        """The whole processed next-token distribution (as ``recompute`` describes it) at every
        position: per sequence a float32 ``[len(seq) − 1, V]`` tensor of log-probabilities,
        ``-inf`` outside top-k/top-p. What the sampler-fidelity suite tests sampled tokens
        against; a backend that cannot hand it out has that suite skipped."""
        raise NotImplementedError(
            f"backend {self.name!r} cannot hand out whole next-token distributions; implement "
            "next_token_logprobs() or choose a backend that can (hf)"
        )

    @property
    def module(self) -> torch.nn.Module:
        """The in-process model, where there is one (the training protocol never needs it)."""
        raise NotImplementedError(f"backend {self.name!r} exposes no in-process module")

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the step's figures.

        In order: the response log-probs of ``batch.sequences`` at the current weights, with
        grad, as ``[B, T]`` float32 (``conformance.training.response_logprobs`` of a
        ``recompute(..., grad=True)``: column ``j`` of row ``i`` is the log-prob of
        ``sequences[i][prompt_lengths[i] + j]``); ``loss, counts =
        conformance.training.policy_loss(logprobs, batch)``; backward; the total gradient
        norm clipped to ``batch.max_grad_norm`` (None: not clipped); one Adam step
        (``objective.ADAM_BETAS``, ``ADAM_EPS``, no weight decay) at ``batch.lr``. The optimizer
        is created at the first ``update`` and keeps its state across calls until
        ``reset_optimizer``.

        Returns ``{"loss": float, "grad_norm": float, **counts}``: the loss value, the total
        gradient norm *before* clipping, and ``policy_loss``'s additive counts (``tokens``,
        ``sequences``, ``clip_low``, ``clip_high``, ``clip_seq``, ``ratio_k3``). A backend that
        splits the batch (data-parallel ranks, micro-batches) calls ``policy_loss`` on each
        ``batch.shard(i, n)`` and returns the sums of the losses and counts, which equal the
        whole batch's (the shards keep the batch's ``loss_norm``); the gradients must add up
        too, so under a mean all-reduce (FSDP's and DDP's default) each rank scales its shard's
        loss by the world size before backward.
        """
        raise NotImplementedError(
            f"backend {self.name!r} cannot train; implement update(), state_dict() and "
            "reset_optimizer() or choose a backend that can (hf)"
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full, unsharded weights as CPU tensors under the model's transformers names (what
        ``Engine.load_weights`` takes); a copy the caller may keep across later updates."""
        raise NotImplementedError(
            f"backend {self.name!r} cannot hand out its weights; implement state_dict()"
        )

    def reset_optimizer(self) -> None:
        """Forget the optimizer state (Adam moments and step count): the next ``update`` starts
        a fresh optimizer. The RL run calls it between the supervised warm start and RL."""
        raise NotImplementedError(
            f"backend {self.name!r} cannot train; implement reset_optimizer()"
        )

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
        if self.RELEASES is not None:
            info["release"] = self.RELEASES.describe()
        return info

    def close(self) -> None:
        """Release what the backend holds. Idempotent."""


__all__ = [
    "Backend",
    "BackendConfig",
    "Layout",
    "Recompute",
]
