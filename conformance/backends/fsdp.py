"""The ``fsdp`` backend: the model sharded with FSDP2 over ``world_size`` rank processes, as
verl, torchtitan and NeMo-RL train it.

``--backend-option world_size=N`` (default 2) rank processes are started by the harness with
torch.distributed's launcher (``conformance.backends._ranks``): gloo on CPU, NCCL on GPU. Each
rank keeps float32 master weights sharded by ``fully_shard`` (every decoder layer, then the
root) and computes in ``--backend-dtype`` with float32 gradient reductions, i.e.
``MixedPrecisionPolicy(param_dtype=<backend dtype>, reduce_dtype=float32)``.

Data parallelism as trainers do it: a batch of sequences is split into ``world_size``
contiguous shares (verl's ``DataProto.chunk``), and each rank cuts its share into micro-batches
of ``--backend-micro-batch`` sequences, laid out like the ``hf`` backend
(``conformance.backends._layout``). So at world size N a sequence is scored next to other
batch-mates than at world size 1, as in a real trainer.

Rank processes are the expensive part, so backends that differ only in how batches are fed
(micro-batch size, layout) share one group of ranks; a group is stopped when its last backend
closes, when a rank dies, and at interpreter exit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conformance.backends import _fsdp_rank
from conformance.backends._layout import check_feeding, check_sequences, micro_batches
from conformance.backends._ranks import RankGroup
from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.engines._options import parse_engine_options, parse_positive_int
from conformance.errors import UsageError
from conformance.parallel import ParallelSetting

#: seconds the ranks may take to start (≈ 4 s each on a quiet two-core machine, 25 s loaded)
START_TIMEOUT_S = float(os.environ.get("TIM_FSDP_START_TIMEOUT", "600"))
#: seconds one request may take, and one collective may wait for the other ranks
TIMEOUT_S = float(os.environ.get("TIM_FSDP_TIMEOUT", "600"))
#: FSDP reduces gradients in float32 whatever the compute dtype (verl, torchtitan)
REDUCE_DTYPE = "float32"

_OPTIONS = {"world_size": parse_positive_int}


@dataclass
class _Shared:
    group: RankGroup
    users: int = 0


#: rank groups by what defines the sharded model: (model, dtype, attention, world size)
_GROUPS: dict[tuple[str, str, str, int], _Shared] = {}


def shares(count: int, world_size: int) -> list[range]:
    """The contiguous index ranges of ``count`` sequences each rank gets, as evenly as verl's
    ``chunk`` splits them (the first ranks get the extra one); trailing ranks may get none."""
    size, extra = divmod(count, world_size)
    bounds = [0]
    for rank in range(world_size):
        bounds.append(bounds[-1] + size + (rank < extra))
    return [range(bounds[r], bounds[r + 1]) for r in range(world_size)]


class FSDPBackend(Backend):
    name = "fsdp"
    parallel = ParallelSetting(option="world_size", label="world_size", default=2)

    def __init__(self, config: BackendConfig) -> None:
        super().__init__(config)
        check_feeding(config)
        options = parse_engine_options(
            "fsdp", config.options, _OPTIONS, {"world_size": self.parallel.default}
        )
        self.world_size: int = options["world_size"]
        self._cuda = _cuda_devices()
        if self._cuda and self.world_size > self._cuda:
            raise UsageError(
                f"world_size={self.world_size} needs {self.world_size} GPUs, {self._cuda} found",
                f"use --backend-option world_size={self._cuda} or fewer",
            )
        self._key = (str(config.model), config.dtype, config.attn_implementation, self.world_size)
        shared = _GROUPS.get(self._key)
        if shared is None or shared.group.closed:
            setup = _fsdp_rank.RankSetup(
                model=str(config.model),
                param_dtype=config.dtype,
                attn_implementation=config.attn_implementation,
                parent_pid=os.getpid(),
                timeout_s=TIMEOUT_S,
            )
            group = RankGroup(
                _fsdp_rank.serve,
                setup,
                self.world_size,
                start_timeout_s=START_TIMEOUT_S,
                timeout_s=TIMEOUT_S,
            )
            shared = _GROUPS[self._key] = _Shared(group)
        shared.users += 1
        self._group: RankGroup | None = shared.group

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

        if grad:
            raise NotImplementedError(
                "the fsdp backend's graph lives on its ranks; train it through update()"
            )
        checked = check_sequences(sequences)
        per_rank = [
            micro_batches([checked[i] for i in share], self.config.micro_batch_size)
            for share in shares(len(checked), self.world_size)
        ]
        steps = max(map(len, per_rank))
        sampling = (temperature, top_k, top_p)
        feeds = [
            _fsdp_rank.Feed(chunks, steps, self.config.layout, sampling) for chunks in per_rank
        ]
        replies = self._ranks().call("recompute", feeds)
        pairs = [pair for reply in replies for pair in reply]
        return Recompute(
            logprobs=[torch.from_numpy(lp) for lp, _ in pairs],
            entropy=[torch.from_numpy(ent) for _, ent in pairs],
        )

    def _ranks(self) -> RankGroup:
        if self._group is None:
            raise UsageError("backend 'fsdp' was closed", "build a new one")
        return self._group

    def info(self) -> dict[str, Any]:
        info = super().info()
        info["parallel"].update(
            process_group="nccl" if self._cuda else "gloo",
            mixed_precision={"param_dtype": self.config.dtype, "reduce_dtype": REDUCE_DTYPE},
            sharding="fully_shard per decoder layer, then the root",
            data_parallel="a batch's sequences split across ranks",
        )
        # like a server's pid: names the processes, changes every run
        info["pids"] = list(self._group.pids) if self._group is not None else []
        return info

    def close(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        shared = _GROUPS.get(self._key)
        if shared is not None and shared.group is group:
            shared.users -= 1
            if shared.users:
                return
            del _GROUPS[self._key]
        group.close()


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
