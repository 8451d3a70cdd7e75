"""A component's parallel setting: the one option that splits its model over processes or devices
(an engine's tensor-parallel size, a training backend's world size).

Engines that have one declare it as ``capabilities.parallel``, backends as the class attribute
``parallel``; the parallelism-invariance suite, the stack fingerprint and the report read that
declaration and nothing else, so a new parallel engine or backend touches none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParallelSetting:
    #: the ``--engine-option``/``--backend-option`` key that sets it, e.g. ``tensor_parallel_size``
    option: str
    #: its name in the stack fingerprint: ``tp_size`` (tensor parallel) or ``world_size``
    label: str
    #: the size when the option is not given
    default: int = 1

    def size(self, options: Mapping[str, Any]) -> int:
        """The size a component built with ``options`` runs at."""
        return int(options.get(self.option, self.default))
