"""A name → implementation registry with lazy import paths (lm-evaluation-harness style).

Lazy ``"module:Class"`` paths keep ``import conformance`` free of torch, vLLM and SGLang.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Generic, TypeVar

from conformance.errors import EngineUnavailable, UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry:
    lazy: str
    #: top-level package the implementation needs at run time (checked before import)
    requires: str | None
    install_hint: str


class Registry(Generic[T]):
    """Maps names to classes given as ``"package.module:ClassName"``, imported on first use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, _Entry] = {}

    def register(
        self, name: str, lazy: str, *, requires: str | None = None, install_hint: str = ""
    ) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if ":" not in lazy:
            raise ValueError(f"lazy path {lazy!r} must look like 'package.module:ClassName'")
        self._entries[name] = _Entry(lazy, requires, install_hint)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; a ``"module:Class"`` path works too (your own)."""
        entry = self._entries.get(name)
        if entry is None and ":" in name:
            entry = _Entry(name, None, f"make {name.partition(':')[0]} importable")
        if entry is None:
            raise UsageError(
                f"unknown {self.kind} {name!r}", f"choose one of: {', '.join(self.names())}"
            )
        hint = entry.install_hint or f"install the package that {self.kind} {name!r} needs"
        if entry.requires and importlib.util.find_spec(entry.requires) is None:
            raise EngineUnavailable(f"{self.kind} {name!r} needs {entry.requires}", hint)
        return self._load(name, entry, hint)

    def declared(self) -> dict[str, type[T]]:
        """Every registered class by name, imported without checking that the packages they
        drive are installed: what they declare (their supported releases), e.g. for ``--help``."""
        return {name: self._load(name, entry, "") for name, entry in self._entries.items()}

    def _load(self, name: str, entry: _Entry, hint: str) -> type[T]:
        module_name, _, class_name = entry.lazy.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EngineUnavailable(f"{self.kind} {name!r} cannot be loaded ({exc})", hint) from exc
        try:
            return getattr(module, class_name)
        except AttributeError:
            raise UsageError(
                f"{module_name} has no {self.kind} class {class_name!r}", "check the class name"
            ) from None
