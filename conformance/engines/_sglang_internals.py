"""Every part of SGLang the harness reaches that is not SGLang's public API (``sglang.Engine``'s
methods, ``POST /generate``), in one place, each with the releases it was checked on and what
the harness does where the part is absent. ``tests/engines/test_engine_internals.py`` runs each
against the installed SGLang (``tox -e sglang``).

Checked on: sglang 0.5.22 and 0.5.23 on its CPU engine (docs/engine-versions.md).
"""

from __future__ import annotations

import atexit
import logging
from typing import Any

log = logging.getLogger("conformance.engines.sglang")


def subprocess_watchdog(engine: Any) -> Any | None:
    """``Engine.tokenizer_manager._subprocess_watchdog`` (0.5.22, 0.5.23): it treats a scheduler
    that exits as a crash and SIGQUITs this process. ``None`` where absent (nothing to stop)."""
    return getattr(getattr(engine, "tokenizer_manager", None), "_subprocess_watchdog", None)


def detach(engine: Any) -> bool:
    """Keep SGLang from acting when this engine's own processes are stopped: stop its subprocess
    watchdog (:func:`subprocess_watchdog`) and drop the ``atexit`` registration of
    ``Engine.shutdown`` that ``Engine.__init__`` makes (0.5.22, 0.5.23), which kills every child
    of this process. Where either is absent there is nothing to undo (``atexit.unregister`` of a
    function never registered does nothing). Returns whether a watchdog was stopped."""
    atexit.unregister(engine.shutdown)
    watchdog = subprocess_watchdog(engine)
    if watchdog is None:
        return False
    watchdog.stop()
    return True
