"""A real ``hf-generate`` engine that dies after a set number of calls — the in-process
counterpart of a server process being killed mid-run."""

from __future__ import annotations

import os
from typing import Any

from conformance.engines.hf_generate import HFGenerateEngine

#: calls that succeed before the engine dies
CALLS_BEFORE_DEATH = int(os.environ.get("TIM_TEST_CALLS_BEFORE_DEATH", "3"))


class DyingEngine(HFGenerateEngine):
    name = "dying-hf-generate"
    calls = 0

    def _tick(self) -> None:
        type(self).calls += 1
        if type(self).calls > CALLS_BEFORE_DEATH:
            raise RuntimeError("worker process exited unexpectedly (simulated death)")

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._tick()
        return super().generate(*args, **kwargs)

    def score(self, *args: Any, **kwargs: Any) -> Any:
        self._tick()
        return super().score(*args, **kwargs)
