"""Backends for the harness's own verdict tests: the reference ``hf`` backend with one realistic
defect each. Plug one in as ``--backend tests.support.backends:ReplayIgnoresRoutes``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.backends.hf import HFBackend


class ReplayIgnoresRoutes(HFBackend):
    """Takes ``routing_replay`` and the engine's routes, and recomputes with its own routing all
    the same (a replay wired to the wrong field: the trainer logs R3 on, and nothing changes)."""

    name = "replay-ignores-routes"

    def recompute(self, sequences: Sequence[Sequence[int]], **kwargs: Any) -> Any:
        kwargs.pop("routes", None)
        return super().recompute(sequences, **kwargs)
