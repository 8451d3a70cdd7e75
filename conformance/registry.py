"""A name → implementation registry with lazy import paths (lm-evaluation-harness style).

Lazy ``"module:Class"`` paths keep ``import conformance`` free of torch, vLLM and SGLang.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from conformance.errors import EngineUnavailable, UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to classes given as ``"package.module:ClassName"``, imported on first use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._paths: dict[str, str] = {}
        self._install_hints: dict[str, str] = {}

    def register(self, name: str, lazy: str, *, install_hint: str = "") -> None:
        if name in self._paths:
            raise ValueError(f"{self.kind} {name!r} is already registered as {self._paths[name]}")
        if ":" not in lazy:
            raise ValueError(f"lazy path {lazy!r} must look like 'package.module:ClassName'")
        self._paths[name] = lazy
        self._install_hints[name] = install_hint

    def names(self) -> list[str]:
        return sorted(self._paths)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; a ``"module:Class"`` path works too (your own)."""
        if ":" in name and name not in self._paths:
            return self._import(name, name, f"make {name.partition(':')[0]} importable")
        if name not in self._paths:
            raise UsageError(
                f"unknown {self.kind} {name!r}",
                f"choose one of: {', '.join(self.names())}",
            )
        module_name, class_name = self._paths[name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = (
                self._install_hints[name] or f"install the package that {self.kind} {name!r} needs"
            )
            raise EngineUnavailable(
                f"{self.kind} {name!r} cannot be loaded ({exc})",
                hint,
            ) from exc
        return getattr(module, class_name)
