"""The ``sglang-server`` engine: SGLang's HTTP server, spoken to with ``POST /generate``.

By default the harness starts ``python -m sglang.launch_server`` on 127.0.0.1 and a free port,
in its own process group, and stops that group at the end (``close``, or at interpreter exit
after a failure or Ctrl-C). With the option ``url`` (``--tim-engine-url``) it attaches to a
server the user runs and starts and stops nothing.

Requests carry token ids and the same fields as the offline engine's ``generate``
(``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import _sglang_common as common
from conformance.engines._server_process import ServerProcess, command_flags, post_json
from conformance.engines.base import Completion, Engine, EngineConfig, SamplingSpec
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

#: seconds a started server may take to answer (≈2 min measured on 2 busy cores)
START_TIMEOUT_ENV = "TIM_SGLANG_START_TIMEOUT"
#: seconds one request may take
REQUEST_TIMEOUT_S = 600.0


class SGLangServerEngine(Engine):
    name = "sglang-server"
    parallel = common.PARALLEL

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        common.parse_options(cls.name, options, extra={"url": str})

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._server: ServerProcess | None = None
        self._closed = False
        parsed = common.parse_options(self.name, config.options, extra={"url": str})
        url = parsed.pop("url", None)
        self._env: dict[str, str] = {}
        self._standin: str | None = None
        if url is not None:
            if parsed:
                raise UsageError(
                    f"sglang-server option(s) {sorted(parsed)} cannot change a server you started",
                    "start your server with those settings, or drop url to let the harness "
                    "start one",
                )
            self.options: dict[str, Any] = {}
            self.parallel = None  # an attached server is split as its owner chose, unknown here
            self.url = url.rstrip("/")
            self._model_info = self._describe()
            return
        if common.sglang_version() is None:
            raise EngineUnavailable("sglang is not installed", common.INSTALL_HINT)
        self.options = common.with_defaults(parsed)
        self._standin = common.kernel_standin(self.options["device"])
        self._env = common.environment(config, self.options)
        if self._standin:
            common.log.warning("sgl_kernel stand-in active (CPU test support): %s", self._standin)
            path = os.environ.get("PYTHONPATH")
            self._env["PYTHONPATH"] = os.pathsep.join(filter(None, [self._standin, path]))
        args = common.server_args(config, self.options)
        self._server = ServerProcess(
            "SGLang server",
            lambda port: [
                sys.executable,
                *("-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port)),
                *command_flags(args, negatable=False),
            ],
            lambda _root: self._env,
            prefix="tim-sglang-server-",
        )
        self.url = self._server.url
        try:
            self._server.wait_ready(
                "/health",
                float(os.environ.get(START_TIMEOUT_ENV, "900")),
                timeout_env=START_TIMEOUT_ENV,
            )
            self._model_info = self._describe()
        except BaseException:
            self._server.stop()
            raise

    # -- HTTP ------------------------------------------------------------------------------
    def _describe(self) -> dict[str, Any]:
        """``/model_info`` of the server; a one-line error naming the URL if none answers."""
        try:
            with urllib.request.urlopen(self.url + "/model_info", timeout=10) as reply:
                return json.load(reply)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineUnavailable(
                f"no SGLang server answers at {self.url} ({reason})",
                "start one there (python -m sglang.launch_server) or drop --tim-engine-url",
            ) from None

    def _post(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        if self._closed:
            raise EngineCrashed(f"engine {self.name!r} was closed", "start a new engine")
        server = self._server
        return post_json(
            self.url + "/generate",
            body,
            label="SGLang server",
            timeout_s=REQUEST_TIMEOUT_S,
            death=lambda: (server.died(wait_s=2.0) if server is not None else None) or "",
        )

    # -- the Engine protocol ---------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        spec: SamplingSpec,
        *,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        replies = self._post(common.generate_request(prompts, spec, top_logprobs))
        return common.completions(prompts, replies, top_logprobs)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return common.scores(sequences, self._post(common.score_request(sequences)))

    def knobs(self) -> dict[str, tuple[Any, ...]]:
        # an attached server's settings are the user's, not ours to vary
        return dict(common.KNOBS) if self._server is not None else {}

    def info(self) -> dict[str, Any]:
        info = super().info()
        info["sglang"] = common.sglang_version()
        info["url"] = self.url
        info["attached"] = self._server is None
        info["knobs"] = dict(self.options)
        info["env"] = dict(self._env)
        info["sgl_kernel_standin"] = self._standin
        # SGLang applies sampling_seed only in deterministic-inference mode
        info["seeded"] = bool(self.options.get("enable_deterministic_inference"))
        return info

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.stop()
