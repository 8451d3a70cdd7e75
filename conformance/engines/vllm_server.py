"""The ``vllm-server`` engine: vLLM's OpenAI-compatible server, spoken to over HTTP.

By default the harness starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1
and a free port, in its own process group, and stops that group at the end (``close``, or at
interpreter exit after a failure or Ctrl-C). With the option ``url`` it attaches to a server
the user runs and starts and stops nothing.

Requests go to ``/v1/completions`` with token-id prompts: ``echo`` + ``prompt_logprobs`` to
score, ``logprobs`` to sample, ``return_tokens_as_token_ids`` so tokens come back as ids.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import _vllm_common as common
from conformance.engines import _vllm_internals as internals
from conformance.engines._server_engine import ServerEngine
from conformance.engines._server_process import command_flags
from conformance.engines.base import Completion, EngineConfig, Request, SamplingSpec, TokenBatch
from conformance.env import VLLM_START_TIMEOUT
from conformance.errors import EngineUnavailable


def _token_id(token: str) -> int:
    """``"token_id:42"`` (``return_tokens_as_token_ids``) → 42."""
    return int(token.rpartition(":")[2])


#: the module a started server runs: vLLM's API server, with the AMX permission its CPU kernels
#: assume (``_vllm_serve``)
SERVE_MODULE = "conformance.engines._vllm_serve"

#: prefill token budget of a started CPU server unless the user sets ``max_num_batched_tokens``
SERVER_PREFILL_BUDGET = 4096


class VLLMServerEngine(ServerEngine):
    name = "vllm-server"
    capabilities = common.CAPABILITIES
    label = "vLLM server"
    launch_hint = f"python -m {internals.API_SERVER_MODULE}"
    start_timeout = VLLM_START_TIMEOUT
    describe_path = "/v1/models"
    known_start_failures = common.KNOWN_IMPORT_FAILURES

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        # the server's counters run from its start; an attached one may have served before
        self._preempted_before = self._preempted()
        self._refusal = common.speculation_refusal(self.options)

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return common.parse_options(cls.name, options, extra={"url": str})

    def start_options(self, options: dict[str, Any]) -> dict[str, Any]:
        import torch

        if common.vllm_version() is None:
            raise EngineUnavailable("vllm is not installed", common.INSTALL_HINT)
        if internals.api_server_module() is None:
            raise EngineUnavailable(
                f"vllm {common.vllm_version()} has no {internals.API_SERVER_MODULE} to serve with",
                f"install a vLLM release the harness supports ({common.INSTALL_HINT})",
            )
        if not torch.cuda.is_available() and options.get("enable_chunked_prefill", True):
            # seeded batches must be cut to the prefill budget (``_seeded_chunk``), and the HTTP
            # API does not say which budget vLLM chose: a server we start gets one we know
            options.setdefault("max_num_batched_tokens", SERVER_PREFILL_BUDGET)
        return options

    def command(self, port: int) -> list[str]:
        # the server's flags take as JSON what the offline API takes as a dict
        # (``--speculative-config``)
        args = {
            key: json.dumps(value) if isinstance(value, dict) else value
            for key, value in common.engine_args(self.config, self.options).items()
        }
        return [
            sys.executable,
            *("-m", SERVE_MODULE, "--host", "127.0.0.1", "--port"),
            str(port),
            *command_flags(args, negatable=True),
        ]

    def environment(self, root: str) -> dict[str, str]:
        return common.environment(
            root,
            enforce_eager=self.options["enforce_eager"],
            tensor_parallel_size=common.PARALLEL.size(self.options),
        )

    @property
    def _model(self) -> dict[str, Any]:
        return self.served["data"][0]

    def _seeded_chunk(self) -> int | None:
        """The prefill budget seeded requests must fit in (``common.seeded_groups``): an explicit
        ``max_num_batched_tokens`` with chunked prefill on, for a server on this CPU-only machine.
        vLLM's default budget is thousands of tokens; an attached server's is not ours to know."""
        import torch

        if torch.cuda.is_available() or not self.options.get("enable_chunked_prefill", True):
            return None
        return self.options.get("max_num_batched_tokens")

    def _check_lengths(self, lengths: list[int], extra: int) -> None:
        common.check_lengths(
            lengths, int(self._model.get("max_model_len") or sys.maxsize), extra=extra
        )

    def _complete(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        reply = self.post("/v1/completions", {"model": self._model["id"], **body})
        return sorted(reply["choices"], key=lambda choice: choice["index"])

    # -- the Engine protocol ---------------------------------------------------------------
    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        lengths = [len(p) for p in prompts]
        self._check_lengths(lengths, spec.max_new_tokens)
        # n children per prompt, each prefilling it (see the in-process engine)
        groups = common.seeded_groups(
            [n * spec.n for n in lengths], spec.seed, self._seeded_chunk()
        )
        # /v1/completions numbers a batch's choices prompt-major: prompt i's n at i·n + j
        choices = [
            choice
            for g in groups
            for choice in self._sample([prompts[i] for i in g], spec, top_logprobs)
        ]
        children = [prompt for prompt in prompts for _ in range(spec.n)]
        return [
            self._completion(prompt, choice, top_logprobs)
            for prompt, choice in zip(children, choices, strict=True)
        ]

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        # one /v1/completions request per Request, several in flight, as rollout workers send
        # them: the server batches requests of different parameters; groups that fit the
        # prefill budget go one after another (``common.seeded_groups``: every request is seeded)
        for request in requests:
            self._check_lengths([len(request.prompt)], request.spec.max_new_tokens)
        groups = common.seeded_groups([len(r.prompt) for r in requests], 0, self._seeded_chunk())

        def send(request: Request) -> Completion:
            (choice,) = self._sample([request.prompt], request.spec, request.top_logprobs)
            return self._completion(request.prompt, choice, request.top_logprobs)

        return [c for g in groups for c in self.in_flight(send, [requests[i] for i in g])]

    @staticmethod
    def _completion(prompt: Sequence[int], choice: dict[str, Any], top_logprobs: int) -> Completion:
        logprobs = choice["logprobs"]
        top = None
        if top_logprobs:
            # the sampled token is listed too, even when outside the top k
            top = [
                dict(
                    sorted(
                        ((_token_id(t), lp) for t, lp in ranked.items()), key=lambda item: -item[1]
                    )[:top_logprobs]
                )
                for ranked in logprobs["top_logprobs"]
            ]
        return Completion(
            prompt=list(prompt),
            tokens=[_token_id(t) for t in logprobs["tokens"]],
            logprobs=[float(lp) for lp in logprobs["token_logprobs"]],
            top_logprobs=top,
            finish_reason=choice.get("finish_reason") or "length",
        )

    def _sample(
        self, prompts: TokenBatch, spec: SamplingSpec, top_logprobs: int
    ) -> list[dict[str, Any]]:
        # the server runs this machine's vLLM (an attached one takes no speculative_config)
        if self._refusal is not None:
            raise self._refusal
        return self._complete(
            {
                "prompt": [list(p) for p in prompts],
                "max_tokens": spec.max_new_tokens,
                "temperature": spec.temperature,
                "top_p": spec.top_p,
                "top_k": spec.top_k,
                "min_p": spec.min_p,
                # one seed per request, as the in-process engine does
                "seed": spec.seed,
                **{k: v for k, v in common.stop_params(spec).items() if k != "detokenize"},
                "logprobs": top_logprobs,
                "return_tokens_as_token_ids": True,
                **common.parallel_params(spec),
            }
        )

    def score(self, sequences: TokenBatch) -> list[list[float]]:
        self._check_lengths([len(s) for s in sequences], 1)
        choices = self._complete(
            {
                "prompt": [list(s) for s in sequences],
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
        )
        return [
            # entry 0 is None: the first token has no prefix
            [
                ranked[str(t)]["logprob"]
                for t, ranked in zip(seq[1:], choice["prompt_logprobs"][1:], strict=True)
            ]
            for seq, choice in zip(sequences, choices, strict=True)
        ]

    def _preempted(self) -> int | None:
        try:
            exposition = self._get("/metrics", read=lambda reply: reply.read().decode())
        except EngineUnavailable:
            return None
        return common.exposed_preemptions(exposition)

    def preemptions(self) -> int | None:
        """Requests the server preempted since this engine started (its ``/metrics``
        ``vllm:num_preemptions_total``); None where the server exposes no such counter."""
        now, before = self._preempted(), self._preempted_before
        return None if now is None or before is None else now - before

    def info(self) -> dict[str, Any]:
        return {**super().info(), "vllm": common.vllm_version()}
