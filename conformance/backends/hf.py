"""The ``hf`` backend: a trainer-style full-sequence forward with Hugging Face transformers.

Sequences are cut into micro-batches and laid out as the trainer would: right padding, left
padding (positions counted from the first real token, as verl does), or packing into one row
with a block-diagonal causal mask and positions restarting per sequence. It trains in process
(the Backend training protocol), with the same layouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.errors import UsageError
from conformance.hf_model import device, gather_logprobs, load_causal_lm

if TYPE_CHECKING:
    import torch

    from conformance.rl.objective import PolicyBatch


class HFBackend(Backend):
    name = "hf"

    def __init__(self, config: BackendConfig) -> None:
        super().__init__(config)
        if config.micro_batch_size < 1:
            raise UsageError(
                f"micro_batch_size={config.micro_batch_size}", "use micro_batch_size >= 1"
            )
        if config.layout not in ("right-pad", "left-pad", "packed"):
            raise UsageError(
                f"unknown layout {config.layout!r}", "use right-pad, left-pad or packed"
            )
        self.check_options(config.options)
        self._model = load_causal_lm(config.model, config.dtype, config.attn_implementation)
        self._optimizer: torch.optim.Optimizer | None = None

    @property
    def module(self) -> torch.nn.Module:
        return self._model

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        import torch

        from conformance.rl.objective import (
            ADAM_BETAS,
            ADAM_EPS,
            policy_loss,
            response_logprobs,
        )

        params = list(self._model.parameters())
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(params, lr=batch.lr, betas=ADAM_BETAS, eps=ADAM_EPS)
        for group in self._optimizer.param_groups:
            group["lr"] = batch.lr
        out = self.recompute(batch.sequences, grad=True)
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
    ) -> Recompute:
        import torch

        if any(len(s) < 2 for s in sequences):
            raise UsageError(
                "a sequence shorter than 2 tokens has nothing to score", "pass longer sequences"
            )
        logprobs: list[torch.Tensor] = []
        entropy: list[torch.Tensor] = []
        step = self.config.micro_batch_size
        with torch.set_grad_enabled(grad):
            for start in range(0, len(sequences), step):
                chunk = [list(s) for s in sequences[start : start + step]]
                lp, ent = self._forward(chunk, (temperature, top_k, top_p))
                logprobs.extend(lp)
                entropy.extend(ent)
        return Recompute(logprobs=logprobs, entropy=entropy)

    def _forward(
        self, chunk: list[list[int]], sampling: tuple[float, int, float]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self.config.layout == "packed":
            return self._forward_packed(chunk, sampling)
        import torch

        width = max(map(len, chunk))
        left = self.config.layout == "left-pad"
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, seq in enumerate(chunk):
            cols = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[row, cols] = torch.tensor(seq)
            mask[row, cols] = 1
        # Positions count real tokens only, so left padding does not shift RoPE phases.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._model(
            input_ids=ids.to(device()),
            attention_mask=mask.to(device()),
            position_ids=positions.to(device()),
        ).logits
        lp, ent = gather_logprobs(logits[:, :-1], ids[:, 1:].to(device()), *sampling)
        out_lp, out_ent = [], []
        for row, seq in enumerate(chunk):
            offset = width - len(seq) if left else 0
            cols = slice(offset, offset + len(seq) - 1)
            out_lp.append(lp[row, cols].cpu() if not lp.requires_grad else lp[row, cols])
            out_ent.append(ent[row, cols].detach().cpu())
        return out_lp, out_ent

    def _forward_packed(
        self, chunk: list[list[int]], sampling: tuple[float, int, float]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        import torch

        ids = torch.tensor([t for seq in chunk for t in seq]).unsqueeze(0)
        positions = torch.cat([torch.arange(len(seq)) for seq in chunk]).unsqueeze(0)
        total = ids.shape[1]
        # Block-diagonal causal mask: a token sees only earlier tokens of its own sequence.
        segment = torch.cat([torch.full((len(s),), i) for i, s in enumerate(chunk)])
        allowed = (segment[:, None] == segment[None, :]) & torch.ones(total, total).tril().bool()
        dtype = self._model.dtype
        bias = torch.zeros(total, total, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        logits = self._model(
            input_ids=ids.to(device()),
            attention_mask=bias[None, None].to(device()),
            position_ids=positions.to(device()),
        ).logits[0]
        lp, ent = gather_logprobs(logits[:-1], ids[0, 1:].to(device()), *sampling)
        out_lp, out_ent = [], []
        start = 0
        for seq in chunk:
            cols = slice(start, start + len(seq) - 1)
            out_lp.append(lp[cols].cpu() if not lp.requires_grad else lp[cols])
            out_ent.append(ent[cols].detach().cpu())
            start += len(seq)
        return out_lp, out_ent
