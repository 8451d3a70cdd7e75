"""A minimal headless-Chromium driver over the DevTools protocol on a pipe (no extra package).

``--remote-debugging-pipe`` makes Chromium read NUL-terminated JSON commands from fd 3 and
write replies and events to fd 4; that is all a test needs to load a page, evaluate
expressions in it, collect console errors and take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BINARY = shutil.which("chromium") or shutil.which("chromium-browser")
#: what CI and a developer run once to get the browser (Debian's package)
INSTALL = "apt-get update && apt-get install -y chromium"
#: a hung browser fails the test instead of hanging CI
TIMEOUT_S = 60


class Chromium:
    def __init__(self, width: int = 1200, height: int = 900) -> None:
        assert BINARY, f"chromium not installed ({INSTALL})"
        self._profile = tempfile.mkdtemp(prefix="tim-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_fds() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            # move both ends above 4 first: a pipe end may itself be fd 3 or 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self._proc = subprocess.Popen(
            [
                BINARY,
                "--headless",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds,
            close_fds=False,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def send(self, method: str, session: str | None = None, **params: Any) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def call(self, method: str, **params: Any) -> dict:
        """A command to the page's session."""
        return self.send(method, self._session, **params)

    def load(self, path: Path) -> float:
        """Navigate to a local file and wait for its load event; return the seconds it took."""
        start = time.perf_counter()
        seen = len(self.events)
        self.call("Page.navigate", url=path.resolve().as_uri())
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[seen:]):
            self.events.append(self._read())
        return time.perf_counter() - start

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (e.g. CSP violations)."""
        errors = []
        for event in self.events:
            params = event.get("params", {})
            method = event.get("method")
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args")))
            elif method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params.get("exceptionDetails")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(params["entry"].get("text", ""))
        return errors

    def screenshot(self, out: Path) -> Path:
        """The whole page as PNG."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, EOFError, TimeoutError):
            self.send("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chrome], [], [], TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"chromium sent nothing for {TIMEOUT_S} s")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise EOFError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
