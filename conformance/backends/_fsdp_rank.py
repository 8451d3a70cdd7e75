"""One rank of the ``fsdp`` backend: the code that runs in each worker process.

``conformance.backends._ranks`` starts the processes with torch.distributed.elastic's launcher and
the environment torchrun gives its workers (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``
of the launcher's own store). Each rank joins the process group (gloo on CPU, NCCL on GPU), loads
the model in float32, shards it with FSDP2 as torchtitan does (``fully_shard`` on every decoder
layer, then on the root) under ``MixedPrecisionPolicy(param_dtype=<backend dtype>,
reduce_dtype=float32)``, and then serves requests from its queue until it is told to stop (or its
parent is gone).

Every forward and every backward is a collective (FSDP all-gathers each layer's parameters, and
reduce-scatters its gradients), so every rank runs the same number of them per request: a rank
with fewer micro-batches than the others runs extra ones on a two-token filler sequence, drops
their output, and back-propagates zero through them.

A recompute may replay an engine's MoE routes (``conformance.routing``): the feed carries the
share's routes per micro-batch, each forward replays its micro-batch's as the ``hf`` backend
does, and every sequence's recorded routes go back with its log-probs (the filler's neither
replay nor return any).

Training (``update``) is gradient accumulation over the rank's micro-batches, as verl does it:
per micro-batch, ``conformance.training.policy_loss`` on that piece of the batch (a shard of
a shard, keeping the batch's normalisation, so the pieces add up to the whole batch's loss),
backward; then the gradient-norm clip over all shards and one Adam step on the sharded float32
master weights.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from conformance.backends._layout import Sampling, forward, next_token_logprobs
from conformance.dtypes import torch_dtype
from conformance.hf_model import load_causal_lm
from conformance.routing import Replay, Routes, replay_of

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    import torch

    from conformance.training import PolicyBatch

_T = TypeVar("_T")

#: what a rank runs while the ranks with more micro-batches run theirs
FILLER = [[0, 0]]
#: seconds between checks that the harness that started this rank is still alive
PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class RankSetup:
    """What every rank is started with (pickled into the spawned process)."""

    model: str
    #: the dtype parameters are cast to for compute; the sharded master copy stays float32
    param_dtype: str
    attn_implementation: str
    #: the harness process; the rank exits when it is gone
    parent_pid: int
    #: seconds a collective may wait for the other ranks before it fails
    timeout_s: float


#: a sequence's routes as they travel between the harness and the ranks: numpy ``(experts,
#: weights or None)``, which pickle as bytes (tensors would travel as shared-memory handles)
WireRoutes = tuple[Any, Any]


def to_wire(routes: Routes | None) -> WireRoutes | None:
    if routes is None:
        return None
    weights = None if routes.weights is None else routes.weights.detach().cpu().numpy()
    return routes.experts.cpu().numpy(), weights


def from_wire(wire: WireRoutes | None) -> Routes | None:
    import torch

    if wire is None:
        return None
    experts, weights = wire
    return Routes(torch.from_numpy(experts), None if weights is None else torch.from_numpy(weights))


@dataclass(frozen=True)
class Feed:
    """One rank's share of a recompute: its micro-batches, laid out and scored alike."""

    chunks: list[list[list[int]]]
    #: forwards every rank runs (the most micro-batches any rank has)
    steps: int
    layout: str
    sampling: Sampling
    #: per micro-batch, per sequence, the routes to replay (``to_wire``; None where a sequence
    #: routes itself); None: no replay
    routes: list[list[WireRoutes | None]] | None = None
    #: replay the routes' combine weights, not the model's own router weights at their experts
    replay_weights: bool = False


@dataclass(frozen=True)
class Step:
    """One rank's share of an optimizer step."""

    #: this rank's shard of the batch (``PolicyBatch.shard``), None when it has none
    shard: PolicyBatch | None
    #: the micro-batches the shard is cut into (``shard.shard(j, pieces)``)
    pieces: int
    #: forward-backward passes every rank runs (the most pieces any rank has)
    steps: int
    layout: str
    lr: float
    max_grad_norm: float | None
    #: the backend's ``routing_replay``: the shard's routes (``PolicyBatch.routes``) are
    #: replayed in training as in recompute
    routing_replay: str = "none"


def serve(
    setup: RankSetup,
    requests: Queue[tuple[int, str, object] | None],
    replies: Queue[tuple[int, int, bool, object]],
) -> None:
    """The rank's main loop. Requests are ``(seq, kind, payload)`` or ``None`` (stop); replies
    are ``(seq, rank, ok, payload)``, seq 0 being the start (payload: this process's pid)."""
    rank = int(os.environ["RANK"])
    _exit_with_parent(setup.parent_pid)
    try:
        this = _Rank(setup)
    except BaseException as exc:
        replies.put((0, rank, False, _describe(exc)))
        raise
    replies.put((0, rank, True, os.getpid()))
    handlers = {
        "recompute": this.recompute,
        "next_token_logprobs": this.next_token_logprobs,
        "update": this.update,
        "state_dict": this.state_dict,
        "reset_optimizer": this.reset_optimizer,
    }
    while (request := requests.get()) is not None:
        seq, kind, payload = request
        try:
            replies.put((seq, rank, True, handlers[kind](payload)))
        except Exception as exc:
            replies.put((seq, rank, False, _describe(exc)))
    import torch.distributed as dist

    dist.destroy_process_group()


class _Rank:
    """This process's shard of the model, and the optimizer over it once it trains."""

    def __init__(self, setup: RankSetup) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # the thread pool was sized when torch was imported, before the launcher set the variable
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(
            "nccl" if cuda else "gloo", timeout=dt.timedelta(seconds=setup.timeout_s)
        )
        self.world_size = dist.get_world_size()
        mesh = init_device_mesh("cuda" if cuda else "cpu", (self.world_size,))
        self.compute_dtype = torch_dtype(setup.param_dtype)
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        # float32 master weights, as verl and torchtitan keep them; FSDP casts for compute
        self.model = load_causal_lm(setup.model, "float32", setup.attn_implementation)
        layer_classes = set(getattr(self.model, "_no_split_modules", None) or ())
        for module in self.model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(self.model, mesh=mesh, mp_policy=policy)
        self.optimizer: torch.optim.Optimizer | None = None

    def recompute(self, feed: Feed) -> list[tuple[Any, Any, WireRoutes | None]]:
        """``(logprobs, entropy, routes)`` per sequence of this rank's share: float32 numpy
        arrays, and on an MoE model the routes of its scored positions (``to_wire``; after the
        feed's replay, if any), None on a dense one."""

        def run(chunk: list[list[int]], index: int | None) -> list[tuple[Any, Any, Any]]:
            replay = None
            if feed.routes is not None and index is not None:
                given = [from_wire(w) for w in feed.routes[index]]
                replay = Replay(given, weights=feed.replay_weights)
            lp, ent, routes = forward(
                self.model, chunk, feed.layout, feed.sampling, self.compute_dtype, replay
            )
            wired = [to_wire(r) for r in routes] if routes is not None else [None] * len(chunk)
            return [(a.numpy(), b.numpy(), r) for a, b, r in zip(lp, ent, wired, strict=True)]

        return _every_step(feed, run)

    def next_token_logprobs(self, feed: Feed) -> list[Any]:
        """``[len(seq) − 1, V]`` float32 numpy arrays per sequence of this rank's share: the
        processed distribution at every position (``Backend.next_token_logprobs``)."""

        def run(chunk: list[list[int]], _: int | None) -> list[Any]:
            return [r.numpy() for r in next_token_logprobs(self.model, chunk, feed.sampling)]

        return _every_step(feed, run)

    def update(self, step: Step) -> dict[str, float]:
        """This rank's part of ``Backend.update``: its loss and counts, and the gradient norm."""
        import torch
        from torch.distributed.tensor import DTensor

        from conformance.training import COUNTS, adam_at, policy_loss, response_logprobs

        params = list(self.model.parameters())
        self.optimizer = adam_at(self.optimizer, params, step.lr)
        self.optimizer.zero_grad()
        figures = dict.fromkeys(("loss", *COUNTS), 0.0)
        raw = (1.0, 0, 1.0)
        for index in range(step.steps):
            if index < step.pieces and step.shard is not None:
                piece = step.shard.shard(index, step.pieces)
                chunk = [list(s) for s in piece.sequences]
                replay = replay_of(step.routing_replay, piece.routes, chunk)
                lp, _, _ = forward(self.model, chunk, step.layout, raw, self.compute_dtype, replay)
                logprobs = response_logprobs(lp, piece.prompt_lengths).float().cpu()
                loss, counts = policy_loss(logprobs, piece)
                figures["loss"] += float(loss.detach())
                for key, value in counts.items():
                    figures[key] += value
            else:
                lp, _, _ = forward(self.model, FILLER, step.layout, raw, self.compute_dtype)
                loss = lp[0].sum() * 0.0
            # FSDP averages gradients over the ranks; the protocol's loss is the shards' sum
            (loss * self.world_size).backward()
        limit = math.inf if step.max_grad_norm is None else step.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self.optimizer.step()
        return {**figures, "grad_norm": float(norm)}

    def state_dict(self, _: None) -> dict[str, Any] | None:
        """The full float32 weights as numpy arrays on rank 0 (gathered from every shard)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.model, options=options)
        return {name: tensor.numpy() for name, tensor in full.items()} or None

    def reset_optimizer(self, _: None) -> None:
        self.optimizer = None


def _every_step(feed: Feed, run: Callable[[list[list[int]], int | None], list[_T]]) -> list[_T]:
    """``run(chunk, index)`` on each of the rank's micro-batches, without grad, and
    ``run(FILLER, None)`` for the steps it has none (every forward is a collective); the real
    ones' results in order. Results are numpy arrays: they pickle as bytes, where tensors would
    travel as shared-memory handles."""
    import torch

    out: list[_T] = []
    with torch.no_grad():
        for step in range(feed.steps):
            real = step < len(feed.chunks)
            rows = run(feed.chunks[step], step) if real else run(FILLER, None)
            if real:
                out.extend(rows)
    return out


def _exit_with_parent(parent_pid: int) -> None:
    """End this process once the harness is gone (killed, say), so no rank outlives it."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="tim-fsdp-parent-watch", daemon=True).start()


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
