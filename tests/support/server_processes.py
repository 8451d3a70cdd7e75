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


def live_group_members(pgid: int) -> list[int]:
    """Processes in a process group that are not zombies (those are their parent's to reap)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def group_ends(pgid: int) -> bool:
    """Whether the group empties: a SIGKILLed process lingers until the kernel tears it down."""
    for _ in range(100):
        if not live_group_members(pgid):
            return True
        time.sleep(0.1)
    return False
