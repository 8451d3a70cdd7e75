"""What the engine tests share: the marks of an engine that needs a package, a started engine,
a batch that overflows a KV budget."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conformance.engines import ENGINES, Engine, EngineConfig


def needs(package: str) -> list[pytest.MarkDecorator]:
    """The package's marker (``-m vllm`` selects its tests) and a skip where it is missing."""
    missing = importlib.util.find_spec(package) is None
    reason = f"{package} is not installed (tox -e {package})"
    return [getattr(pytest.mark, package), pytest.mark.skipif(missing, reason=reason)]


@contextmanager
def started(name: str, model: Path, **config: Any) -> Iterator[Engine]:
    """The engine registered as ``name``, closed at the end of the block."""
    engine = ENGINES.get(name)(EngineConfig(model=model, **config))
    try:
        yield engine
    finally:
        engine.close()


def over_budget(engine: Engine, budget: int = 256) -> int | None:
    """The preemptions of a seeded batch of six requests, each needing 96 + 64 KV tokens (less
    than ``budget``) and together 3.75 budgets of 256, on ``engine``."""
    from conformance.engines import SamplingSpec

    rng = random.Random(0)
    prompts = [[rng.randrange(3, 384) for _ in range(96)] for _ in range(6)]
    before = engine.preemptions()
    completions = engine.generate(prompts, SamplingSpec(max_new_tokens=64, seed=3))
    assert [len(c.tokens) for c in completions] == [64] * 6
    after = engine.preemptions()
    return None if before is None or after is None else after - before
