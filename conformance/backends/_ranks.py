"""A group of rank processes the harness starts, talks to and stops: the ``fsdp`` backend's
workers.

The processes are started with torch.distributed.elastic's ``start_processes`` (torchrun's own
machinery) and given torchrun's environment: rank, world size, and the address of a TCP store
this process hosts, as torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE``). Each rank reads
requests from a queue of its own and answers on one shared queue.

A rank that dies (killed, crashed) or a request that outlives ``timeout_s`` surfaces as an
exception in the caller within a bounded time, and the whole group is stopped then: the other
ranks would otherwise wait in a collective for the dead one. The group is also stopped by
``close`` and at interpreter exit; each rank exits by itself if this process disappears.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: seconds between checks of the ranks' health while waiting for their replies
POLL_S = 0.2
#: seconds to let the other ranks' processes be reaped when one reports a failed collective
#: (a collective fails on every rank once one rank died; the death is the reason to report)
DEATH_GRACE_S = 3.0
#: seconds stopped ranks get to exit before they are killed
STOP_GRACE_S = 5
#: the signals the elastic launcher takes over in the process that starts workers; the harness
#: keeps its own handlers (Ctrl-C stays a KeyboardInterrupt)
_LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
_LAUNCHER_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")


class RankDied(RuntimeError):
    """A rank process exited while the group was in use."""


class RankFailed(RuntimeError):
    """A rank raised while serving a request (the message is its exception's first line)."""


class RankTimeout(RuntimeError):
    """The ranks did not answer a request within the group's timeout."""


class RankGroup:
    """``world_size`` processes running ``entry(setup, requests, replies)``; each must answer
    the start within ``start_timeout_s`` and every later request within ``timeout_s``."""

    def __init__(
        self,
        entry: Callable[..., None],
        setup: object,
        world_size: int,
        *,
        start_timeout_s: float,
        timeout_s: float,
    ) -> None:
        from torch.distributed import TCPStore
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

        # the launcher logs every failure and every stop it makes; ours says it once, in context
        for name in _LAUNCHER_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.world_size = world_size
        self._timeout_s = timeout_s
        self._seq = 0
        self._closed = False
        self._root = tempfile.mkdtemp(prefix="tim-fsdp-")
        spawn = multiprocessing.get_context("spawn")
        self._requests = [spawn.Queue() for _ in range(world_size)]
        self._replies = spawn.Queue()
        self._store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        envs = {rank: self._environment(rank) for rank in range(world_size)}
        with _own_signal_handlers():
            self._context = start_processes(
                name="tim-fsdp",
                entrypoint=entry,
                args={rank: (setup, self._requests[rank], self._replies) for rank in envs},
                envs=envs,
                logs_specs=DefaultLogsSpecs(log_dir=self._root),
            )
        atexit.register(self.close)
        try:
            self.pids: list[int] = self._collect(0, "start", start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    def _environment(self, rank: int) -> dict[str, str]:
        """torchrun's worker environment, with this process's store as the agent's store."""
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "GROUP_RANK": "0",
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self._store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RUN_ID": f"tim-fsdp-{os.getpid()}",
            # torchrun's default for several ranks on one machine, unless the user chose; one
            # rule for every world size, so sizes 1 and N compute with the same threads
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }

    def call(self, kind: str, payloads: Sequence[object]) -> list[Any]:
        """Send ``payloads[rank]`` to each rank; return their results in rank order."""
        if self._closed:
            raise RankDied("the rank group was stopped")
        self._seq += 1
        for rank, payload in enumerate(payloads):
            self._requests[rank].put((self._seq, kind, payload))
        return self._collect(self._seq, kind, self._timeout_s)

    def _collect(self, seq: int, what: str, timeout_s: float) -> list[Any]:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < self.world_size:
            try:
                reply_seq, rank, ok, payload = self._replies.get(timeout=POLL_S)
            except queue.Empty:
                self._raise_if_dead(what)
                if time.monotonic() > deadline:
                    self.close()
                    raise RankTimeout(
                        f"ranks {sorted(set(range(self.world_size)) - set(results))} did not "
                        f"answer {what} within {timeout_s:g} s (hung)"
                    ) from None
                continue
            if reply_seq != seq:
                continue  # the answer to a request abandoned earlier
            if not ok:
                # a killed rank is the cause; ranks exiting after reporting their own failure
                # (as they do in start) are not
                self._raise_if_dead(what, grace_s=DEATH_GRACE_S, killed_only=True)
                self.close()
                raise RankFailed(f"rank {rank} failed in {what}: {payload}")
            results[rank] = payload
        return [results[rank] for rank in range(self.world_size)]

    def _raise_if_dead(self, what: str, grace_s: float = 0.0, killed_only: bool = False) -> None:
        """Raise :class:`RankDied` if a rank has exited, or with ``killed_only`` was killed by a
        signal (the launcher then stops the rest)."""
        result = self._context.wait(timeout=grace_s, period=POLL_S) if grace_s else None
        result = result or self._context.wait(0)
        if result is None:
            return
        failures = {r: f for r, f in result.failures.items() if f.exitcode < 0 or not killed_only}
        if killed_only and not failures:
            return
        self.close()
        if not failures:
            raise RankDied(f"every rank exited during {what}")
        rank, failure = min(failures.items())
        if failure.exitcode < 0:
            how = f"was killed by {failure.signal_name()}"
        else:
            message = failure.message
            if isinstance(message, dict):
                message = message.get("message", "")
            how = f"exited with code {failure.exitcode}" + (
                f": {str(message).strip().splitlines()[0]}" if str(message).strip() else ""
            )
        raise RankDied(f"rank {rank} (pid {failure.pid}) {how} during {what}")

    def close(self) -> None:
        """Ask the ranks to stop, give them ``STOP_GRACE_S``, then kill what is left. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for requests in self._requests:
            with contextlib.suppress(OSError, ValueError):
                requests.put(None)
        with contextlib.suppress(Exception):
            self._context.wait(timeout=STOP_GRACE_S, period=POLL_S)
        self._context.close(timeout=STOP_GRACE_S)
        for channel in (*self._requests, self._replies):
            # a dead reader must not keep this process from exiting on a full pipe
            channel.cancel_join_thread()
            channel.close()
        shutil.rmtree(self._root, ignore_errors=True)


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Keep this process's signal handlers across the launcher's start (it installs its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {name: signal.getsignal(getattr(signal, name)) for name in _LAUNCHER_SIGNALS}
    try:
        yield
    finally:
        for name, handler in kept.items():
            signal.signal(getattr(signal, name), handler)
