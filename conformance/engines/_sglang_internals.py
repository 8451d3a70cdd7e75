"""Every part of SGLang the harness reaches that is not SGLang's public API (``sglang.Engine``'s
methods, ``POST /generate``), in one place, each with the releases it was checked on and what
the harness does where the part is absent. ``tests/engines/test_engine_internals.py`` runs each
against the installed SGLang (``tox -e sglang``).

Checked on: sglang 0.5.22 and 0.5.23 on its CPU engine (docs/engine-versions.md).
"""

from __future__ import annotations

import asyncio
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


def release_ipc(engine: Any) -> None:
    """Close the zmq contexts this process holds for ``engine``: ``Engine.send_to_rpc``'s and the
    tokenizer manager's (``recv_from_detokenizer``, ``send_to_scheduler``), 0.5.22 and 0.5.23,
    after cancelling the tokenizer manager's ``asyncio_tasks`` that await those sockets (a task
    whose socket fails under it kills this process: ``print_exception_wrapper``).

    Left to the garbage collector, a context and its sockets die in one reference cycle; the
    collector clears the weak references the context keeps to its sockets first, so the
    context's ``term()`` waits forever for sockets it can no longer close. A pytest run of the
    SGLang engine tests hung at exit that way, in ``Context.__del__``. Attributes a release
    lacks are skipped."""
    manager = getattr(engine, "tokenizer_manager", None)
    tasks = [task for task in getattr(manager, "asyncio_tasks", ()) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop = tasks[0].get_loop()
        if not loop.is_running() and not loop.is_closed():
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    sockets = (
        getattr(engine, "send_to_rpc", None),
        getattr(manager, "recv_from_detokenizer", None),
        getattr(manager, "send_to_scheduler", None),
    )
    contexts = {id(s.context): s.context for s in sockets if s is not None}
    for context in contexts.values():
        context.destroy(linger=0)
