"""The ``hf`` backend: a trainer-style full-sequence forward with Hugging Face transformers, in
this process, fed as ``conformance.backends._layout`` lays batches out (micro-batches; right
padding, left padding or packing). It trains in process (the Backend training protocol), with the
same layouts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conformance.backends._layout import (
    check_feeding,
    check_sequences,
    forward,
    micro_batches,
    next_token_logprobs,
)
from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.component_options import parse_engine_options
from conformance.hf_model import TRANSFORMERS_RELEASES, attention_in_use, load_causal_lm
from conformance.routing import Routes, replay_mode, replay_of

if TYPE_CHECKING:
    import torch

    from conformance.training import PolicyBatch


class HFBackend(Backend):
    name = "hf"
    RELEASES = TRANSFORMERS_RELEASES

    def __init__(self, config: BackendConfig) -> None:
        super().__init__(config)
        check_feeding(config)
        self.routing_replay = routing_replay(self.name, config.options)
        self._model = load_causal_lm(config.model, config.dtype, config.attn_implementation)
        self._optimizer: torch.optim.Optimizer | None = None

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        routing_replay(cls.name, options)

    @property
    def module(self) -> torch.nn.Module:
        return self._model

    def info(self) -> dict[str, Any]:
        # the implementation in use, not the one asked for: "auto" names none
        return {**super().info(), "attn_implementation": attention_in_use(self._model)}

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        import torch

        from conformance.training import adam_at, policy_loss, response_logprobs

        params = list(self._model.parameters())
        self._optimizer = adam_at(self._optimizer, params, batch.lr)
        out = self.recompute(batch.sequences, grad=True, routes=batch.routes)
        logprobs = response_logprobs(out.logprobs, batch.prompt_lengths).float().cpu()
        loss, counts = policy_loss(logprobs, batch)
        self._optimizer.zero_grad()
        loss.backward()
        limit = math.inf if batch.max_grad_norm is None else batch.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, limit)
        self._optimizer.step()
        return {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **counts}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self._model.state_dict().items()}

    def reset_optimizer(self) -> None:
        self._optimizer = None

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
        import torch

        size = self.config.micro_batch_size
        chunks = micro_batches(check_sequences(sequences), size)
        replay = replay_of(self.routing_replay, routes, sequences)
        logprobs: list[torch.Tensor] = []
        entropy: list[torch.Tensor] = []
        routed: list[Routes] = []
        sampling = (temperature, top_k, top_p)
        with torch.set_grad_enabled(grad):
            for index, chunk in enumerate(chunks):
                part = replay.part(index * size, (index + 1) * size) if replay else None
                lp, ent, chunk_routes = forward(
                    self._model, chunk, self.config.layout, sampling, self._model.dtype, part
                )
                logprobs.extend(lp)
                entropy.extend(ent)
                routed.extend(chunk_routes or ())
        return Recompute(logprobs=logprobs, entropy=entropy, routes=routed or None)

    def next_token_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> list[torch.Tensor]:
        import torch

        chunks = micro_batches(check_sequences(sequences), self.config.micro_batch_size)
        with torch.no_grad():
            return [
                row
                for chunk in chunks
                for row in next_token_logprobs(self._model, chunk, (temperature, top_k, top_p))
            ]


def routing_replay(backend: str, options: Mapping[str, str]) -> str:
    """The ``routing_replay`` option (``conformance.routing.REPLAY_MODES``; default none), the
    only option a transformers backend takes besides its parallel one."""
    return parse_engine_options(
        backend, options, {"routing_replay": replay_mode}, {"routing_replay": "none"}
    )["routing_replay"]
