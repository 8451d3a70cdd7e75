"""The ``fsdp`` backend: the model sharded with FSDP2 over ``world_size`` rank processes, as
verl, torchtitan and NeMo-RL train it.

``--backend-option world_size=N`` (default 2) rank processes are started by the harness with
torch.distributed's launcher (``conformance.backends._ranks``): gloo on CPU, NCCL on GPU. Each
rank keeps float32 master weights sharded by ``fully_shard`` (every decoder layer, then the
root) and computes in ``--backend-dtype`` with float32 gradient reductions, i.e.
``MixedPrecisionPolicy(param_dtype=<backend dtype>, reduce_dtype=float32)``.

Data parallelism as trainers do it: a batch of sequences is split into ``world_size``
contiguous, near-equal shares (as verl's ``DataProto.chunk`` does; :func:`shares`), and each
rank cuts its share into micro-batches of ``--backend-micro-batch`` sequences, laid out like
the ``hf`` backend (``conformance.backends._layout``). So at world size N a sequence is scored
next to other batch-mates than at world size 1, as in a real trainer.

Training (the Backend training protocol: ``update``, ``state_dict``, ``reset_optimizer``) runs
on the ranks: each takes its shard of the batch (``PolicyBatch.shard``), accumulates gradients
over its micro-batches, and FSDP reduce-scatters them in float32 before the clip and the Adam
step on the sharded master weights; ``state_dict`` gathers the full float32 weights.

``--backend-option routing_replay=none|engine-ids|engine`` (default none) replays an MoE
engine's routes in ``recompute(..., routes=...)`` as the ``hf`` backend does
(``conformance.routing``): each rank gets its share's routes and replays them per micro-batch;
the routes the ranks recorded come back in ``Recompute.routes``. Training replays a batch's
``PolicyBatch.routes`` the same way.

Rank processes are the expensive part, so backends that differ only in how batches are fed
(micro-batch size, layout) share one group of ranks until one of them trains: its first
``update`` gives it ranks of its own, so no other backend sees trained weights. A group is
stopped when its last backend closes, when a rank dies, and at interpreter exit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conformance.backends import _fsdp_rank
from conformance.backends._layout import check_feeding, check_sequences, micro_batches
from conformance.backends._ranks import RankGroup
from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.component_options import parse_engine_options, parse_positive_int
from conformance.errors import UsageError
from conformance.hf_model import TRANSFORMERS_RELEASES
from conformance.parallel import ParallelSetting
from conformance.routing import Replay, Routes, replay_mode, replay_of

if TYPE_CHECKING:
    import torch

    from conformance.training import PolicyBatch

#: seconds the ranks may take to start (≈ 4 s each on a quiet two-core machine, 25 s loaded)
START_TIMEOUT_S = float(os.environ.get("TIM_FSDP_START_TIMEOUT", "600"))
#: seconds one request may take, and one collective may wait for the other ranks
TIMEOUT_S = float(os.environ.get("TIM_FSDP_TIMEOUT", "600"))
#: FSDP reduces gradients in float32 whatever the compute dtype (verl, torchtitan)
REDUCE_DTYPE = "float32"

_OPTIONS = {"world_size": parse_positive_int, "routing_replay": replay_mode}


@dataclass
class _Shared:
    group: RankGroup
    users: int = 0


#: rank groups by what defines the sharded model: (model, dtype, attention, world size)
_GROUPS: dict[tuple[str, str, str, int], _Shared] = {}


def shares(count: int, world_size: int) -> list[range]:
    """The contiguous, near-equal index ranges of ``count`` sequences the ranks get: rank ``r``
    gets ``[r·count // N, (r+1)·count // N)``, the split ``PolicyBatch.shard`` makes for training,
    so a sequence sits on the same rank whether it is scored or trained. With fewer sequences
    than ranks, some ranks get none."""
    return [
        range(r * count // world_size, (r + 1) * count // world_size) for r in range(world_size)
    ]


class FSDPBackend(Backend):
    name = "fsdp"
    RELEASES = TRANSFORMERS_RELEASES
    parallel = ParallelSetting(option="world_size", label="world_size", default=2)

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        _options(options)

    def __init__(self, config: BackendConfig) -> None:
        super().__init__(config)
        check_feeding(config)
        options = _options(config.options)
        self.world_size: int = options["world_size"]
        self.routing_replay: str = options["routing_replay"]
        self._cuda = _cuda_devices()
        self._key = (str(config.model), config.dtype, config.attn_implementation, self.world_size)
        shared = _GROUPS.get(self._key)
        if shared is None or shared.group.closed:
            shared = _GROUPS[self._key] = _Shared(self._start_ranks())
        shared.users += 1
        self._group: RankGroup | None = shared.group

    def _start_ranks(self) -> RankGroup:
        setup = _fsdp_rank.RankSetup(
            model=str(self.config.model),
            param_dtype=self.config.dtype,
            attn_implementation=self.config.attn_implementation,
            parent_pid=os.getpid(),
            timeout_s=TIMEOUT_S,
        )
        return RankGroup(
            _fsdp_rank.serve,
            setup,
            self.world_size,
            start_timeout_s=START_TIMEOUT_S,
            timeout_s=TIMEOUT_S,
        )

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

        if grad:
            raise NotImplementedError(
                "the fsdp backend's graph lives on its ranks; train it through update()"
            )
        replay = replay_of(self.routing_replay, routes, sequences)
        rows = self._call_on_shares(
            "recompute", sequences, (temperature, top_k, top_p), replay=replay
        )
        routed = [_fsdp_rank.from_wire(r) for _, _, r in rows]
        return Recompute(
            logprobs=[torch.from_numpy(lp) for lp, _, _ in rows],
            entropy=[torch.from_numpy(ent) for _, ent, _ in rows],
            # every sequence has routes on an MoE model, none on a dense one
            routes=[r for r in routed if r is not None] or None,
        )

    def next_token_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> list[torch.Tensor]:
        import torch

        rows = self._call_on_shares("next_token_logprobs", sequences, (temperature, top_k, top_p))
        return [torch.from_numpy(row) for row in rows]

    def _call_on_shares(
        self,
        kind: str,
        sequences: Sequence[Sequence[int]],
        sampling: _fsdp_rank.Sampling,
        replay: Replay | None = None,
    ) -> list[Any]:
        """Each rank's share of ``sequences`` (``shares``), in micro-batches, through the
        ranks' ``kind`` handler, with its share of ``replay`` cut alike; the per-sequence
        results in the batch's order."""
        checked = check_sequences(sequences)
        size = self.config.micro_batch_size
        feeds = []
        for share in shares(len(checked), self.world_size):
            chunks = micro_batches([checked[i] for i in share], size)
            wired = None
            if replay is not None:
                own = [_fsdp_rank.to_wire(replay.routes[i]) for i in share]
                wired = [own[start : start + size] for start in range(0, len(own), size)]
            feeds.append((chunks, wired))
        steps = max(len(chunks) for chunks, _ in feeds)
        weights = replay is not None and replay.weights
        payloads = [
            _fsdp_rank.Feed(chunks, steps, self.config.layout, sampling, wired, weights)
            for chunks, wired in feeds
        ]
        return [row for reply in self._ranks().call(kind, payloads) for row in reply]

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        from conformance.training import COUNTS

        count = min(self.world_size, len(batch.sequences))
        shards = [batch.shard(r, count) if r < count else None for r in range(self.world_size)]
        micro = self.config.micro_batch_size
        pieces = [0 if s is None else -(-len(s.sequences) // micro) for s in shards]
        steps = [
            _fsdp_rank.Step(
                shard,
                n,
                max(pieces),
                self.config.layout,
                batch.lr,
                batch.max_grad_norm,
                self.routing_replay,
            )
            for shard, n in zip(shards, pieces, strict=True)
        ]
        replies = self._private_ranks().call("update", steps)
        figures = {key: sum(reply[key] for reply in replies) for key in ("loss", *COUNTS)}
        # the norm is over every shard's gradients, the same on each rank
        return {**figures, "grad_norm": replies[0]["grad_norm"]}

    def state_dict(self) -> dict[str, torch.Tensor]:
        import torch

        full = self._ranks().call("state_dict", [None] * self.world_size)[0]
        return {name: torch.from_numpy(array) for name, array in full.items()}

    def reset_optimizer(self) -> None:
        self._ranks().call("reset_optimizer", [None] * self.world_size)

    def _ranks(self) -> RankGroup:
        if self._group is None:
            raise UsageError("backend 'fsdp' was closed", "build a new one")
        return self._group

    def _private_ranks(self) -> RankGroup:
        """The ranks this backend trains, shared with no other: training changes their
        weights, and a backend built later (or a variant) must start from the model folder's."""
        group = self._ranks()
        shared = _GROUPS.get(self._key)
        if shared is not None and shared.group is group:
            shared.users -= 1
            if shared.users:
                self._group = self._start_ranks()
            else:
                del _GROUPS[self._key]
        return self._ranks()

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


def _options(options: Mapping[str, str]) -> dict[str, Any]:
    """The options, checked: ``world_size`` a positive integer and no more than the GPUs,
    ``routing_replay`` one of ``conformance.routing.REPLAY_MODES`` (default none)."""
    defaults = {"world_size": FSDPBackend.parallel.default, "routing_replay": "none"}
    parsed = parse_engine_options("fsdp", options, _OPTIONS, defaults)
    size: int = parsed["world_size"]
    gpus = _cuda_devices()
    if gpus and size > gpus:
        raise UsageError(
            f"world_size={size} needs {size} GPUs, {gpus} found",
            f"use --backend-option world_size={gpus} or fewer",
        )
    return parsed


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
