"""The ``hf`` backend: a trainer-style full-sequence forward with Hugging Face transformers, in
this process, fed as ``conformance.backends._layout`` lays batches out (micro-batches; right
padding, left padding or packing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from conformance.backends._layout import check_feeding, check_sequences, forward, micro_batches
from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.errors import UsageError
from conformance.hf_model import load_causal_lm

if TYPE_CHECKING:
    import torch


class HFBackend(Backend):
    name = "hf"

    def __init__(self, config: BackendConfig) -> None:
        super().__init__(config)
        check_feeding(config)
        if config.options:
            raise UsageError(
                f"backend 'hf' takes no backend options (got {sorted(config.options)})",
                "drop --backend-option, or use --backend-micro-batch / --backend-attn",
            )
        self._model = load_causal_lm(config.model, config.dtype, config.attn_implementation)

    @property
    def module(self) -> torch.nn.Module:
        return self._model

    def recompute(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        grad: bool = False,
    ) -> Recompute:
        import torch

        chunks = micro_batches(check_sequences(sequences), self.config.micro_batch_size)
        logprobs: list[torch.Tensor] = []
        entropy: list[torch.Tensor] = []
        sampling = (temperature, top_k, top_p)
        with torch.set_grad_enabled(grad):
            for chunk in chunks:
                lp, ent = forward(
                    self._model, chunk, self.config.layout, sampling, self._model.dtype
                )
                logprobs.extend(lp)
                entropy.extend(ent)
        return Recompute(logprobs=logprobs, entropy=entropy)
