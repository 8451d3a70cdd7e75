"""The ``vllm-server`` engine: vLLM's OpenAI-compatible server, spoken to over HTTP.

By default the harness starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1
and a free port, in its own process group, and stops that group at the end (``close``, or at
interpreter exit after a failure or Ctrl-C). With the option ``url`` it attaches to a server
the user runs and starts and stops nothing.

Requests go to ``/v1/completions`` with token-id prompts: ``echo`` + ``prompt_logprobs`` to
score, ``logprobs`` to sample, ``return_tokens_as_token_ids`` so tokens come back as ids.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import _vllm_common as common
from conformance.engines._server_process import ServerProcess, command_flags, post_json
from conformance.engines.base import Completion, Engine, EngineConfig, SamplingSpec
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

#: seconds a started server may take to answer (≈40 s measured on 2 busy cores)
START_TIMEOUT_ENV = "TIM_VLLM_START_TIMEOUT"
START_TIMEOUT_S = float(os.environ.get(START_TIMEOUT_ENV, "600"))
#: seconds one request may take
REQUEST_TIMEOUT_S = 600.0


def _token_id(token: str) -> int:
    """``"token_id:42"`` (``return_tokens_as_token_ids``) → 42."""
    return int(token.rpartition(":")[2])


def _start_server(config: EngineConfig, options: dict[str, Any]) -> ServerProcess:
    args = common.engine_args(config, options)
    return ServerProcess(
        "vLLM server",
        lambda port: [
            sys.executable,
            *("-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port"),
            str(port),
            *command_flags(args, negatable=True),
        ],
        lambda root: common.environment(
            root,
            enforce_eager=options["enforce_eager"],
            tensor_parallel_size=common.PARALLEL.size(options),
        ),
        prefix="tim-vllm-server-",
    )


def _seeded_chunk(options: dict[str, Any]) -> int | None:
    """The prefill budget seeded requests must fit in (``common.seeded_groups``): an explicit
    ``max_num_batched_tokens`` with chunked prefill on, for a server on this CPU-only machine.
    vLLM's default budget is thousands of tokens; an attached server's is not ours to know."""
    import torch

    if "url" in options or torch.cuda.is_available():
        return None
    if not options.get("enable_chunked_prefill", True):
        return None
    return options.get("max_num_batched_tokens")


class VLLMServerEngine(Engine):
    name = "vllm-server"
    parallel = common.PARALLEL

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        common.parse_options(cls.name, options, extra={"url": str})

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options = common.parse_options(self.name, config.options, extra={"url": str})
        self._server: ServerProcess | None = None
        self._closed = False
        self._seeded_chunk = _seeded_chunk(self.options)
        url = self.options.pop("url", None)
        if url is not None:
            ignored = sorted(set(config.options) - {"url"})
            if ignored:
                raise UsageError(
                    f"vllm-server option(s) {ignored} cannot change a server you started",
                    "start your server with those settings, or drop url to let the harness "
                    "start one",
                )
            self.parallel = None  # an attached server is split as its owner chose, unknown here
            self.url = url.rstrip("/")
            self._model_id, self._max_model_len = self._describe(attached=True)
            return
        if common.vllm_version() is None:
            raise EngineUnavailable("vllm is not installed", common.INSTALL_HINT)
        self._server = _start_server(config, self.options)
        self.url = self._server.url
        try:
            self._server.wait_ready("/health", START_TIMEOUT_S, timeout_env=START_TIMEOUT_ENV)
            self._model_id, self._max_model_len = self._describe(attached=False)
        except BaseException:
            self._server.stop()
            raise

    # -- HTTP ------------------------------------------------------------------------------
    def _describe(self, *, attached: bool) -> tuple[str, int]:
        """The served model's id and context length, from ``/v1/models``."""
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as reply:
                model = json.load(reply)["data"][0]
        except (OSError, http.client.HTTPException, ValueError, LookupError) as exc:
            if attached:
                raise EngineUnavailable(
                    f"no vLLM server answers at {self.url} ({exc})",
                    "start one there (python -m vllm.entrypoints.openai.api_server) or drop "
                    "--tim-engine-url",
                ) from None
            raise
        return model["id"], int(model.get("max_model_len") or sys.maxsize)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise EngineCrashed(f"engine {self.name!r} was closed", "start a new engine")
        server = self._server
        return post_json(
            self.url + "/v1/completions",
            {"model": self._model_id, **body},
            label="vLLM server",
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
        common.check_lengths(
            [len(p) for p in prompts], self._max_model_len, extra=spec.max_new_tokens
        )
        groups = common.seeded_groups([len(p) for p in prompts], spec.seed, self._seeded_chunk)
        choices = [
            choice
            for g in groups
            for choice in self._sample([prompts[i] for i in g], spec, top_logprobs)
        ]
        completions = []
        for prompt, choice in zip(prompts, choices, strict=True):
            logprobs = choice["logprobs"]
            completions.append(
                Completion(
                    prompt=list(prompt),
                    tokens=[_token_id(t) for t in logprobs["tokens"]],
                    logprobs=[float(lp) for lp in logprobs["token_logprobs"]],
                    top_logprobs=[
                        # the sampled token is listed too, even when outside the top k
                        dict(
                            sorted(
                                ((_token_id(t), lp) for t, lp in ranked.items()),
                                key=lambda item: -item[1],
                            )[:top_logprobs]
                        )
                        for ranked in logprobs["top_logprobs"]
                    ]
                    if top_logprobs
                    else None,
                    finish_reason=choice.get("finish_reason") or "length",
                )
            )
        return completions

    def _sample(
        self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, top_logprobs: int
    ) -> list[dict[str, Any]]:
        reply = self._post(
            {
                "prompt": [list(p) for p in prompts],
                "max_tokens": spec.max_new_tokens,
                "temperature": spec.temperature,
                "top_p": spec.top_p,
                "top_k": spec.top_k,
                # one seed per request, as the in-process engine does
                "seed": spec.seed,
                "ignore_eos": spec.ignore_eos,
                "logprobs": top_logprobs,
                "return_tokens_as_token_ids": True,
            }
        )
        return sorted(reply["choices"], key=lambda choice: choice["index"])

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        common.check_lengths([len(s) for s in sequences], self._max_model_len, extra=1)
        reply = self._post(
            {
                "prompt": [list(s) for s in sequences],
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
        )
        choices = sorted(reply["choices"], key=lambda choice: choice["index"])
        return [
            # entry 0 is None: the first token has no prefix
            [
                ranked[str(t)]["logprob"]
                for t, ranked in zip(seq[1:], choice["prompt_logprobs"][1:], strict=True)
            ]
            for seq, choice in zip(sequences, choices, strict=True)
        ]

    def knobs(self) -> dict[str, tuple[Any, ...]]:
        # an attached server's settings are the user's, not ours to vary
        return dict(common.KNOBS) if self._server is not None else {}

    def info(self) -> dict[str, Any]:
        info = super().info()
        info["vllm"] = common.vllm_version()
        info["url"] = getattr(self, "url", None)
        info["attached"] = self._server is None
        # like the url, volatile: certificates ignore it; it names the process to watch or stop
        info["pid"] = self._server.process.pid if self._server is not None else None
        info["knobs"] = dict(self.options)
        return info

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.stop()
