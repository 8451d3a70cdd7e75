"""The ``sglang-server`` engine: SGLang's HTTP server, spoken to with ``POST /generate``.

By default the harness starts ``python -m sglang.launch_server`` on 127.0.0.1 and a free port,
in its own process group, and stops that group at the end (``close``, or at interpreter exit
after a failure or Ctrl-C). With the option ``url`` (``--tim-engine-url``) it attaches to a
server the user runs and starts and stops nothing.

Requests carry token ids and the same fields as the offline engine's ``generate``
(``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import _sglang_common as common
from conformance.engines._server_engine import ServerEngine
from conformance.engines._server_process import command_flags
from conformance.engines.base import Completion, EngineConfig, Request, SamplingSpec, TokenBatch
from conformance.env import SGLANG_START_TIMEOUT
from conformance.errors import EngineUnavailable


class SGLangServerEngine(ServerEngine):
    name = "sglang-server"
    capabilities = common.CAPABILITIES
    label = "SGLang server"
    launch_hint = "python -m sglang.launch_server"
    start_timeout = SGLANG_START_TIMEOUT
    describe_path = "/model_info"
    #: set for a server the harness starts (an attached one is the user's)
    _env: Mapping[str, str] = {}
    _standin: str | None = None

    def __init__(self, config: EngineConfig) -> None:
        self._retractions = common.Retractions()
        super().__init__(config)

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return common.parse_options(cls.name, options, extra={"url": str})

    def start_options(self, options: dict[str, Any]) -> dict[str, Any]:
        if common.sglang_version() is None:
            raise EngineUnavailable("sglang is not installed", common.INSTALL_HINT)
        options = common.with_defaults(options)
        self._standin = common.kernel_standin(options["device"])
        self._env = common.environment(self.config, options)
        if self._standin:
            common.log.warning("sgl_kernel stand-in active (CPU test support): %s", self._standin)
            path = os.environ.get("PYTHONPATH")
            self._env["PYTHONPATH"] = os.pathsep.join(filter(None, [self._standin, path]))
        return options

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            *("-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port)),
            *command_flags(common.server_args(self.config, self.options), negatable=False),
        ]

    def environment(self, root: str) -> dict[str, str]:
        return self._env

    def _generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The server's replies to one ``POST /generate``, their retractions counted."""
        return self._retractions.add(self.post("/generate", body))

    # -- the Engine protocol ---------------------------------------------------------------
    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        return common.generate(prompts, spec, top_logprobs, self.options, self._generate)

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        # one POST /generate per request, several in flight, as rollout workers send them
        def send(request: Request) -> Completion:
            body = common.generate_request(
                [request.prompt], request.spec, request.top_logprobs, self.options
            )
            (reply,) = self._generate(body)
            return common.completion(request.prompt, reply, request.top_logprobs)

        return self.in_flight(send, requests)

    def score(self, sequences: TokenBatch) -> list[list[float]]:
        return common.scores(sequences, self._generate(common.score_request(sequences)))

    def preemptions(self) -> int | None:
        """Requests SGLang retracted in this engine's calls (their replies' counts)."""
        return self._retractions.count

    def info(self) -> dict[str, Any]:
        return {**super().info(), **common.describe(self.options, self._env, self._standin)}
