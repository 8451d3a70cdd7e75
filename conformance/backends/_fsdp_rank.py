"""One rank of the ``fsdp`` backend: the code that runs in each worker process.

``conformance.backends._ranks`` starts the processes with torch.distributed.elastic's launcher and
the environment torchrun gives its workers (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``
of the launcher's own store). Each rank joins the process group (gloo on CPU, NCCL on GPU), loads
the model in float32, shards it with FSDP2 as torchtitan does (``fully_shard`` on every decoder
layer, then on the root) under ``MixedPrecisionPolicy(param_dtype=<backend dtype>,
reduce_dtype=float32)``, and then serves requests from its queue until it is told to stop (or its
parent is gone).

Every forward is a collective (FSDP all-gathers each layer's parameters), so every rank runs the
same number of forwards per request: a rank with fewer micro-batches than the others runs extra
ones on a two-token filler sequence and drops their output.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conformance.backends._layout import Sampling, forward

if TYPE_CHECKING:
    import torch

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


@dataclass(frozen=True)
class Feed:
    """One rank's share of a recompute: its micro-batches, laid out and scored alike."""

    chunks: list[list[list[int]]]
    #: forwards every rank runs (the most micro-batches any rank has)
    steps: int
    layout: str
    sampling: Sampling


def serve(setup: RankSetup, requests: Any, replies: Any) -> None:
    """The rank's main loop. Requests are ``(seq, kind, payload)`` or ``None`` (stop); replies
    are ``(seq, rank, ok, payload)``, seq 0 being the start (payload: this process's pid)."""
    rank = int(os.environ["RANK"])
    _exit_with_parent(setup.parent_pid)
    try:
        model, compute_dtype = _start(setup)
    except BaseException as exc:
        replies.put((0, rank, False, _describe(exc)))
        raise
    replies.put((0, rank, True, os.getpid()))
    handlers = {"recompute": lambda feed: _recompute(model, feed, compute_dtype)}
    while (request := requests.get()) is not None:
        seq, kind, payload = request
        try:
            replies.put((seq, rank, True, handlers[kind](payload)))
        except Exception as exc:
            replies.put((seq, rank, False, _describe(exc)))
    import torch.distributed as dist

    dist.destroy_process_group()


def _start(setup: RankSetup) -> tuple[torch.nn.Module, torch.dtype]:
    import datetime as dt

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from conformance.dtypes import torch_dtype
    from conformance.hf_model import load_causal_lm

    # the thread pool was sized when torch was imported, before the launcher set the variable
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        "nccl" if cuda else "gloo", timeout=dt.timedelta(seconds=setup.timeout_s)
    )
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))
    compute_dtype = torch_dtype(setup.param_dtype)
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # float32 master weights, as verl and torchtitan keep them; FSDP casts for compute
    model = load_causal_lm(setup.model, "float32", setup.attn_implementation)
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, compute_dtype


def _recompute(
    model: torch.nn.Module, feed: Feed, compute_dtype: torch.dtype
) -> list[tuple[Any, Any]]:
    """``(logprobs, entropy)`` float32 numpy arrays per sequence of this rank's share."""
    import torch

    out = []
    with torch.no_grad():
        for step in range(feed.steps):
            real = step < len(feed.chunks)
            chunk = feed.chunks[step] if real else FILLER
            lp, ent = forward(model, chunk, feed.layout, feed.sampling, compute_dtype)
            if real:
                # numpy arrays pickle as bytes; tensors would travel as shared-memory handles
                out.extend((a.numpy(), b.numpy()) for a, b in zip(lp, ent, strict=True))
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
