"""Every part of SGLang the harness reaches that is not SGLang's public API (``sglang.Engine``'s
methods, ``POST /generate``), in one place, each with the releases it was checked on and what
the harness does where the part is absent. ``tests/engines/test_engine_internals.py`` runs each
against the installed SGLang (``tox -e sglang``).

Checked on: sglang 0.5.22 and 0.5.23 on its CPU engine (docs/engine-versions.md).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import signal
import threading
from collections.abc import Mapping
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


def keep_handlers(engine: Any, handlers: Mapping[signal.Signals, Any]) -> bool:
    """Put ``handlers`` in place of the handlers SGLang installs on its event loop for the same
    signals. Returns whether SGLang's were removed.

    ``TokenizerManager.auto_create_handle_loop`` (checked on 0.5.23), run on an engine's first
    request, adds loop handlers for SIGTERM and SIGQUIT. SIGTERM's only flags a graceful exit for
    its own ``sigterm_watchdog`` (which drains requests, then kills this process's children), so
    a SIGTERM mid-run (CI's timeout) never ended the session: on 0.5.23, a certify sent SIGTERM
    after its first example went on through all 500 and exited 0 with its verdict. SIGQUIT's,
    which a failing child sends, kills this process's whole tree, the harness with it, before it
    writes its report. The handling is set up here, before any request, on the loop
    ``Engine.loop`` runs requests on (outside a running loop, SGLang would make a new one that
    nothing runs), and SGLang's handlers removed. A release without these parts, or a call off
    the main thread (where SGLang adds no handler), leaves things as they are."""
    manager = getattr(engine, "tokenizer_manager", None)
    create = getattr(manager, "auto_create_handle_loop", None)
    loop = getattr(engine, "loop", None)
    if create is None or loop is None or threading.current_thread() is not threading.main_thread():
        return False

    async def create_on_the_engines_loop() -> bool:
        create()
        # uvloop's loop (SGLang's) removes a handler only while it runs
        running = asyncio.get_running_loop()
        return all([running.remove_signal_handler(number) for number in handlers])

    removed = loop.run_until_complete(create_on_the_engines_loop())
    if removed:
        for number, handler in handlers.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
    return removed


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


def server_arg_defaults() -> dict[str, Any]:
    """SGLang's own default of each argument its engine and server take: ``ServerArgs``'s
    signature (a ``msgspec.Struct`` in 0.5.23, where this was checked), before the values it
    resolves as it starts. Empty where SGLang does not import here (a server the user started
    elsewhere): its knobs are then the options given."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return {}
    return {
        name: parameter.default
        for name, parameter in inspect.signature(ServerArgs).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
