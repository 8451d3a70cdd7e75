"""Mixture-of-experts routes as data: which experts each token went to, recorded from a
transformers model's routers, and replayed into another forward (routing replay, R3).

A route belongs to a *scored position*: for a sequence ``s`` of length n, entry ``t`` is where
the model sent token ``s[t]`` in every MoE layer, which is what shaped ``log p(s[t + 1] |
s[: t + 1])`` — the positions follow the Engine convention, n − 1 of them. The last token's route
shapes no score (an engine never feeds it), so it is neither recorded nor replayed.

Routers are found by their transformers ≥ 5 shape: a module whose class name ends in
``TopKRouter`` returns ``(router_logits, top_k_weights, top_k_indices)`` over the flattened
tokens of the forward (``Qwen3MoeTopKRouter``, ``MixtralTopKRouter`` and their kin). Replay
substitutes the indices, and either the given combine weights or the model's own router
probabilities at the given experts (renormalised where the router renormalises its top k): the
ids-only replay of R3 (arXiv 2510.11370 §3), the ids-and-weights one of prime-rl #3523.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

    #: what a ``TopKRouter`` returns: ``(router_logits, top_k_weights, top_k_indices)``
    RouterOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    #: a forward hook on a router: (the router, its positional inputs, its output) to the
    #: output the forward goes on with
    RouterHook = Callable[[torch.nn.Module, tuple[object, ...], RouterOutput], RouterOutput]

#: ``routing_replay`` values a backend takes: off; the engine's expert ids with the backend's
#: own router weights at them; the engine's ids and its combine weights where it reports them
REPLAY_MODES = ("none", "engine-ids", "engine")


@dataclass(frozen=True)
class Routes:
    """One sequence's routes: ``experts`` int64 ``[positions, layers, k]``, the top-k experts
    in the router's order; ``weights`` float32 of the same shape, the combine weights, where the
    side that routed reports them."""

    experts: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def positions(self) -> int:
        return int(self.experts.shape[0])

    def tail(self, start: int) -> Routes:
        """The routes from scored position ``start`` on (a rollout's generated tokens)."""
        weights = None if self.weights is None else self.weights[start:]
        return Routes(self.experts[start:], weights)


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order; empty for a dense model."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


class RouteTap:
    """Records the routers' choices over the forwards run inside :func:`tapped`, and replays
    given routes into the next forward. Inactive (records nothing) on a dense model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._routers = routers(model)
        #: per forward, per layer: (indices [rows, k], weights [rows, k] float32) on CPU
        self.calls: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self._current: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._replay: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._handles: list[RemovableHandle] = []

    @property
    def active(self) -> bool:
        return bool(self._routers)

    def replay_next(self, experts: torch.Tensor, weights: torch.Tensor | None) -> None:
        """Route the next forward's rows as given: ``experts`` int64 ``[layers, rows, k]``, −1
        where a row keeps its own route; ``weights`` float32 alike, or None to take the model's
        own router probabilities at the given experts."""
        self._replay = (experts, weights)

    def _attach(self) -> None:
        for layer, router in enumerate(self._routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int) -> RouterHook:
        def hook(
            module: torch.nn.Module, _args: tuple[object, ...], output: RouterOutput
        ) -> RouterOutput:
            logits, weights, experts = output
            if self._replay is not None:
                weights, experts = _replayed(module, logits, weights, experts, self._replay, layer)
            self._current.append((experts.detach().cpu(), weights.detach().float().cpu()))
            if layer == len(self._routers) - 1:
                self.calls.append(self._current)
                self._current = []
                self._replay = None
            return logits, weights, experts

        return hook

    def sequence_routes(self, rows: Sequence[torch.Tensor]) -> list[Routes]:
        """Per sequence, the routes of the one forward run at the given flat rows (its scored
        positions in order)."""
        return [self._gather([(0, r)]) for r in rows]

    def _gather(self, pieces: Sequence[tuple[int, torch.Tensor]]) -> Routes:
        """Routes assembled from ``(call, rows)`` pieces, in order."""
        import torch

        experts = torch.cat(
            [torch.stack([e[rows] for e, _ in self.calls[c]], dim=1) for c, rows in pieces]
        )
        weights = torch.cat(
            [torch.stack([w[rows] for _, w in self.calls[c]], dim=1) for c, rows in pieces]
        )
        return Routes(experts, weights)

    def decoded_routes(
        self, prompt_rows: Sequence[torch.Tensor], lengths: Sequence[int]
    ) -> list[Routes]:
        """Routes of a KV-cache decode: forward 0 the prompts' prefill (``prompt_rows[b]`` the
        flat rows of prompt ``b``), forward ``j`` the decode step feeding generated token ``j −
        1`` (row ``b``); ``lengths[b]`` tokens were generated, the last of them never fed."""
        import torch

        out = []
        for row, (rows, length) in enumerate(zip(prompt_rows, lengths, strict=True)):
            pieces = [(0, rows)] + [(step, torch.tensor([row])) for step in range(1, length)]
            out.append(self._gather(pieces))
        return out


@contextmanager
def tapped(model: torch.nn.Module) -> Iterator[RouteTap]:
    """A :class:`RouteTap` on ``model``'s routers for the duration of the block."""
    tap = RouteTap(model)
    tap._attach()
    try:
        yield tap
    finally:
        tap._detach()


@dataclass(frozen=True)
class Replay:
    """Routes to replay into a forward, per sequence of its batch (None: the sequence routes
    itself), with the reported combine weights (``weights``) or the model's own at them."""

    routes: Sequence[Routes | None]
    weights: bool

    def part(self, start: int, stop: int) -> Replay:
        """The replay of sequences ``start:stop`` (one micro-batch)."""
        return Replay(self.routes[start:stop], self.weights)

    def arm(self, tap: RouteTap, rows: Sequence[torch.Tensor], total: int) -> None:
        """Have ``tap`` replay these routes into its next forward, whose ``total`` flat rows hold
        each sequence's scored positions at ``rows``. Weights are replayed only when every
        sequence's routes carry them."""
        import torch

        given = [(r, at) for r, at in zip(self.routes, rows, strict=True) if r is not None]
        if not given:
            return
        layers, k = given[0][0].experts.shape[1:]
        experts = torch.full((layers, total, k), -1, dtype=torch.long)
        with_weights = self.weights and all(r.weights is not None for r, _ in given)
        weights = torch.zeros((layers, total, k)) if with_weights else None
        # one route per scored position: ``replay_of`` refused routes that do not line up
        for r, at in given:
            experts[:, at] = r.experts.transpose(0, 1)
            if weights is not None and r.weights is not None:
                weights[:, at] = r.weights.transpose(0, 1)
        tap.replay_next(experts, weights)


def replay_mode(value: str) -> str:
    """A ``routing_replay`` option value, checked against :data:`REPLAY_MODES` (a parser for
    ``conformance.component_options.parse_engine_options``)."""
    if value not in REPLAY_MODES:
        raise ValueError(f"expected one of {', '.join(REPLAY_MODES)}")
    return value


def replay_of(
    mode: str, routes: Sequence[Routes | None] | None, sequences: Sequence[Sequence[int]]
) -> Replay | None:
    """What a backend in replay ``mode`` replays of the engine's ``routes`` for ``sequences``
    (None: nothing). Routes must line up with the sequences, one per sequence (None where it
    routes itself) with one entry per scored position: replaying another sequence's routes
    would silently route it wrong."""
    if mode == "none" or routes is None:
        return None
    if len(routes) != len(sequences):
        raise ValueError(
            f"{len(routes)} routes for {len(sequences)} sequences; pass one per sequence "
            "(None where it routes itself)"
        )
    for index, (r, sequence) in enumerate(zip(routes, sequences, strict=True)):
        if r is not None and r.positions != len(sequence) - 1:
            raise ValueError(
                f"the routes of sequence {index} have {r.positions} positions for its "
                f"{len(sequence)} tokens; pass the routes of this sequence (n − 1 positions)"
            )
    return Replay(routes, weights=mode == "engine")


def _replayed(
    module: torch.nn.Module,
    logits: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    replay: tuple[torch.Tensor, torch.Tensor | None],
    layer: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    given, given_weights = replay[0][layer].to(experts.device), replay[1]
    keep = (given[:, :1] < 0).expand_as(given)
    new_experts = torch.where(keep, experts, given)
    if given_weights is not None:
        new_weights = torch.where(keep, weights, given_weights[layer].to(weights))
        return new_weights, new_experts
    # the router's own probabilities at the replayed experts, as the router computes them
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    picked = probs.gather(-1, new_experts)
    if getattr(module, "norm_topk_prob", False):
        picked = picked / picked.sum(dim=-1, keepdim=True)
    return picked.to(weights.dtype), new_experts


def agreeing(engine: torch.Tensor, backend: torch.Tensor) -> torch.Tensor:
    """Per (position, layer), whether two routings chose the same top-k *set* of experts
    (``[positions, layers, k]`` each; the order within the k does not matter, the combine is a
    weighted sum): bool ``[positions, layers]``. Agreement is the R3 paper's router-level
    comparison (arXiv 2510.11370 §2.2: ~10 % of routers disagree on Qwen3-30B-A3B)."""
    return (engine.sort(dim=-1).values == backend.sort(dim=-1).values).all(dim=-1)


def routing_metrics(
    engine: Sequence[torch.Tensor],
    backend: Sequence[torch.Tensor],
    abs_log_ratio: Sequence[torch.Tensor],
) -> dict[str, float]:
    """Routing agreement of aligned per-sequence routes and the mismatch split by it.

    route_agreement = mean over (token, layer) of 1[E_engine = E_backend] (top-k sets);
    route_flip_tokens = mean over tokens of 1[∃ layer: sets differ] (R3 §2.2: 94 % of tokens);
    abs_diff_mean_route_kept / _flipped = mean |log ρ| over the tokens without / with a flip
    (the latter absent when no token flipped): how much of the mismatch the flips carry.
    ``abs_log_ratio`` holds each sequence's |log ρ| at the same positions.
    """
    import torch

    agree = torch.cat([agreeing(e, b) for e, b in zip(engine, backend, strict=True)])
    diffs = torch.cat([torch.as_tensor(d, dtype=torch.float64) for d in abs_log_ratio])
    flipped = ~agree.all(dim=-1)
    # a NaN/inf token is counted by nonfinite_tokens, not averaged here
    finite = torch.isfinite(diffs)
    metrics = {
        "route_agreement": float(agree.double().mean()),
        "route_flip_tokens": float(flipped.double().mean()),
    }
    if (kept := ~flipped & finite).any():
        metrics["abs_diff_mean_route_kept"] = float(diffs[kept].mean())
    if (flips := flipped & finite).any():
        metrics["abs_diff_mean_route_flipped"] = float(diffs[flips].mean())
    return metrics
