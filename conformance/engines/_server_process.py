"""An engine server process the harness starts and must stop: bound to 127.0.0.1 on a free
port, in a process group of its own, logged to a private folder, stopped by group at the end
(``stop``, or at interpreter exit after a failure or Ctrl-C), and reaped."""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

#: log lines quoted when the server fails to start or dies
LOG_TAIL_LINES = 15


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """Start ``command(port)`` with ``env(root)`` added to this process's environment.

    ``label`` names the server in messages (``"SGLang server"``); ``root`` is the private
    folder (log, caches), removed by ``stop``.
    """

    def __init__(
        self,
        label: str,
        command: Callable[[int], list[str]],
        env: Callable[[str], Mapping[str, str]],
        *,
        prefix: str,
    ) -> None:
        self.label = label
        self.root = tempfile.mkdtemp(prefix=prefix)
        self.log_path = Path(self.root) / "server.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._stopped = False
        with self.log_path.open("wb") as log:
            # a session of its own: stopping the group stops every process the server spawned
            self.process = subprocess.Popen(
                command(port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env(self.root)},
                start_new_session=True,
            )
        atexit.register(self.stop)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())

    def died(self, wait_s: float = 0.0) -> str | None:
        """A one-line account of the server's death, or ``None`` if it still runs after
        ``wait_s`` seconds (a dying server may drop connections before it exits)."""
        try:
            code = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        pid = self.process.pid
        return f"the {self.label} (pid {pid}) exited with code {code}: {self.log_tail()}"

    def wait_ready(self, health: str, timeout_s: float, *, timeout_env: str) -> None:
        """Poll ``health`` until it answers 200; stop the server and raise if it never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            death = self.died()
            if death is not None:
                self.stop()
                raise EngineUnavailable(
                    f"{death} (before answering)",
                    "fix the cause in the server log above, or check the install",
                )
            try:
                with urllib.request.urlopen(self.url + health, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise EngineUnavailable(
            f"the {self.label} did not answer within {timeout_s:.0f} s: {tail}",
            f"raise {timeout_env} or look at the server log",
        )

    def stop(self) -> None:
        """Terminate the process group, escalate to SIGKILL, reap; then drop the folder. Once:
        the group's id may belong to other processes after that."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.process.poll() is None:
            for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # the leader is gone; children it left in the group must not outlive it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def command_flags(args: Mapping[str, Any], *, negatable: bool) -> list[str]:
    """Keyword arguments as ``--kebab-case`` flags. A false boolean is ``--no-flag`` where the
    server's parser accepts that (vLLM), else left out (SGLang's switches)."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags += [flag] if value else (["--no-" + flag[2:]] if negatable else [])
        else:
            flags += [flag, str(value)]
    return flags


def post_json(
    url: str,
    body: Mapping[str, Any],
    *,
    label: str,
    timeout_s: float,
    death: Callable[[], str],
    log: Callable[[], str],
) -> Any:
    """POST ``body`` as JSON and return the decoded reply. A 4xx is the request's fault
    (``UsageError``); a 5xx or a dropped connection is the server's (``EngineCrashed``, with
    ``death()`` saying what happened to it, or the tail of its ``log()`` where it lives on: a
    started server's log goes with its folder when the run ends)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        if exc.code < 500:
            raise UsageError(
                f"the {label} rejected a request (HTTP {exc.code}): {detail}",
                "fix the request (lengths, sampling values) or the server's settings",
            ) from None
        tail = log()
        raise EngineCrashed(
            f"the {label} at {url} failed (HTTP {exc.code}): {detail}"
            + (f"; its log ends: {tail}" if tail else ""),
            "check the server's log; what was measured is kept",
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise EngineCrashed(
            death() or f"the {label} at {url} stopped answering ({exc})",
            "what was measured is kept; rerun",
        ) from None
