"""What every engine behind an HTTP server shares: start the server (or attach to the user's with
the option ``url``), describe it, POST JSON to it, and stop it — once, in ``close``.

A subclass says how its server is launched (``command``, ``environment``), which options it
takes, and how its requests and replies look; an attached server is the user's to configure,
so it takes no other options and offers no knobs.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from conformance.engines._server_process import ServerProcess, post_json
from conformance.engines.base import Engine, EngineConfig
from conformance.env import EnvVar
from conformance.errors import EngineUnavailable, UsageError

#: seconds one request may take
REQUEST_TIMEOUT_S = 600.0
#: requests a mixed batch keeps in flight at once, as a pool of rollout workers does
IN_FLIGHT = 16

T = TypeVar("T")
R = TypeVar("R")


class ServerEngine(Engine):
    """An engine spoken to over HTTP; ``self.served`` holds what ``describe_path`` answered."""

    #: the server in messages, e.g. ``"vLLM server"``
    label: ClassVar[str]
    #: how a user starts one, named when nothing answers at a given url
    launch_hint: ClassVar[str]
    #: the variable holding how long a started server may take to answer
    start_timeout: ClassVar[EnvVar]
    health_path: ClassVar[str] = "/health"
    #: a GET that describes the served model (its id, context length)
    describe_path: ClassVar[str]
    #: text in a failed start's log → the fix for it
    known_start_failures: ClassVar[Mapping[str, str]] = {}

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._server: ServerProcess | None = None
        options = self.parse_options(config.options)
        url = options.pop("url", None)
        if url is not None:
            given = sorted(set(config.options) - {"url"})
            if given:
                raise UsageError(
                    f"{self.name} option(s) {given} cannot change a server you started",
                    "start your server with those settings, or drop url to let the harness "
                    "start one",
                )
            self.options: dict[str, Any] = {}
            # an attached server's settings are the user's, not ours to vary; it is split as its
            # owner chose, unknown here, and its KV memory is the owner's to bound
            self.capabilities = replace(
                self.capabilities, knobs={}, parallel=None, kv_budget_option=None
            )
            self.url = url.rstrip("/")
            self.served = self._get(self.describe_path)
            return
        self.options = self.start_options(options)
        self._server = ServerProcess(
            self.label, self.command, self.environment, prefix=f"tim-{self.name}-"
        )
        self.url = self._server.url
        try:
            self._server.wait_ready(
                self.health_path,
                float(self.start_timeout.get() or 0),
                timeout_env=self.start_timeout.name,
            )
            self.served = self._get(self.describe_path)
        except EngineUnavailable as exc:
            self._server.stop()
            fixes = [fix for text, fix in self.known_start_failures.items() if text in exc.problem]
            raise EngineUnavailable(exc.problem, fixes[0] if fixes else exc.fix) from None
        except BaseException:
            self._server.stop()
            raise

    # -- what a subclass says about its server ------------------------------------------------
    @classmethod
    @abstractmethod
    def parse_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Typed options, ``url`` among them when given; a bad one is a ``UsageError``."""

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        cls.parse_options(options)

    def start_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options a started server runs with (defaults filled in, installation checked)."""
        return options

    @abstractmethod
    def command(self, port: int) -> list[str]:
        """The command line that serves ``self.config.model`` on 127.0.0.1:``port``."""

    @abstractmethod
    def environment(self, root: str) -> dict[str, str]:
        """Variables added to the server's environment; ``root`` is its private folder."""

    # -- HTTP ---------------------------------------------------------------------------------
    def _get(self, path: str, read: Callable[[Any], Any] = json.load) -> Any:
        """``read`` of the server's answer to ``GET path`` (its JSON by default)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as reply:
                return read(reply)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            fix = (
                f"start one there ({self.launch_hint}) or drop --tim-engine-url"
                if self._server is None
                else "see the server log"
            )
            raise EngineUnavailable(
                f"no {self.label} answers at {self.url} ({reason})", fix
            ) from None

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        server = self._server
        return post_json(
            self.url + path,
            body,
            label=self.label,
            timeout_s=REQUEST_TIMEOUT_S,
            death=lambda: (server.died(wait_s=2.0) if server is not None else None) or "",
            log=lambda: server.log_tail() if server is not None else "",
        )

    def in_flight(self, send: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``send(item)`` for every item, up to ``IN_FLIGHT`` of them in flight at once (one
        connection each: the server batches what is waiting), the answers in item order; the
        first request to fail raises its error here."""
        if len(items) <= 1:
            return [send(item) for item in items]
        with ThreadPoolExecutor(min(IN_FLIGHT, len(items)), thread_name_prefix=self.name) as pool:
            return list(pool.map(send, items))

    # -- the Engine protocol ------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "url": self.url,
            "attached": self._server is None,
            # like the url, volatile: certificates ignore it; it names the process to watch
            "pid": self._server.process.pid if self._server is not None else None,
            "knobs": dict(self.options),
        }

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
