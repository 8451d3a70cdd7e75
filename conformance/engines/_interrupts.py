"""Ctrl-C and SIGTERM held while a call runs inside an engine's own event loop.

The harness ends a run on either by raising an exception from the signal handler
(``KeyboardInterrupt``; ``conformance.guard.sigterm_as_interrupt``), wherever the main thread
is. Inside SGLang's asyncio loop that exception lands in one of its tasks: on 0.5.23 its
scheduler and detokenizer processes died and the request never returned, so a run that Ctrl-C
or CI's SIGTERM should have ended as incomplete hung with no report. Held until the call
returns, the signal reaches the same handler in the harness's own code.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the signals the harness ends a run on
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Inside the block Ctrl-C and SIGTERM are held, then delivered to the handlers they had
    as soon as it ends. A second one inside is delivered at once: the call may be hung, and a
    user pressing Ctrl-C again means it. Off the main thread (where no signal is delivered)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before: dict[int, Any] = {}

    def restore() -> None:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def hold(signum: int, frame: Any) -> None:
        if held:
            held.clear()  # delivered now, not again when the block ends
            restore()
            signal.raise_signal(signum)
            return
        held.append(signum)

    for sig in INTERRUPTS:
        before[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        restore()
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)
