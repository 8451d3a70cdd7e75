"""An engine wrapper that turns an engine dying mid-run into ``EngineCrashed`` exactly once,
so the session can keep what was measured and end with verdict ``incomplete``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conformance.engines.base import Completion, Engine, SamplingSpec
from conformance.errors import EngineCrashed, UsageError


class GuardedEngine:
    """Delegates to an engine; after its first unexpected failure, every call fails fast."""

    def __init__(self, engine: Engine, *, on_crash: Callable[[str], None]) -> None:
        self.inner = engine
        self.name = engine.name
        self.config = engine.config
        self._on_crash = on_crash
        self._crash: str | None = None
        #: seconds spent inside the engine's own calls (the harness's overhead is the rest)
        self.busy_s = 0.0

    def generate(
        self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        return self._call("generate", prompts, spec, top_logprobs=top_logprobs)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return self._call("score", sequences)

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        self._call("load_weights", state_dict)

    def knobs(self) -> dict[str, tuple[Any, ...]]:
        return self.inner.knobs()

    def info(self) -> dict[str, Any]:
        return self.inner.info()

    def close(self) -> None:
        self.inner.close()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._crash is not None:
            raise EngineCrashed(f"engine {self.name!r} is dead: {self._crash}")
        started = time.perf_counter()
        try:
            return getattr(self.inner, method)(*args, **kwargs)
        except (UsageError, NotImplementedError):
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._crash = f"engine {self.name!r} died in {method}(): {type(exc).__name__}: {first}"
            self._on_crash(self._crash)
            if isinstance(exc, EngineCrashed):
                raise
            raise EngineCrashed(
                f"engine {self.name!r} died during {method}(): {type(exc).__name__}: {first}",
                "what was measured is kept in results.jsonl; check the engine's log and rerun",
            ) from exc
        finally:
            self.busy_s += time.perf_counter() - started
