"""Checks that an engine server is really gone: its port closed, its process group empty."""

from __future__ import annotations

import socket
import time
from pathlib import Path


def port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


def free_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _state_and_group(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and process group, or ``None`` once it is gone."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    state, _ppid, group = stat.rpartition(")")[2].split()[:3]
    return state, int(group)


def live_group_members(pgid: int) -> list[int]:
    """Processes in a process group that are not zombies (those are their parent's to reap)."""
    members = []
    for entry in Path("/proc").iterdir():
        found = _state_and_group(entry.name) if entry.name.isdigit() else None
        if found is not None and found[1] == pgid and found[0] != "Z":
            members.append(int(entry.name))
    return members


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (not gone, not a zombie)."""
    return [pid for pid in pids if (found := _state_and_group(pid)) and found[0] != "Z"]


def all_end(pids: list[int], within_s: float = 10.0) -> bool:
    """Whether every one of ``pids`` has ended within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while running(pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def group_ends(pgid: int) -> bool:
    """Whether the group empties: a SIGKILLed process lingers until the kernel tears it down."""
    for _ in range(100):
        if not live_group_members(pgid):
            return True
        time.sleep(0.1)
    return False
