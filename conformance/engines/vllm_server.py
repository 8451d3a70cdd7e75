"""The ``vllm-server`` engine: vLLM's OpenAI-compatible server, spoken to over HTTP.

By default the harness starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1
and a free port, in its own process group, and stops that group at the end (``close``, or at
interpreter exit after a failure or Ctrl-C). With the option ``url`` it attaches to a server
the user runs and starts and stops nothing.

Requests go to ``/v1/completions`` with token-id prompts: ``echo`` + ``prompt_logprobs`` to
score, ``logprobs`` to sample, ``return_tokens_as_token_ids`` so tokens come back as ids.
"""

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
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.engines import _vllm_common as common
from conformance.engines.base import Completion, Engine, EngineConfig, SamplingSpec
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

#: seconds a started server may take to answer (≈40 s measured on 2 busy cores)
START_TIMEOUT_S = float(os.environ.get("TIM_VLLM_START_TIMEOUT", "600"))
#: seconds one request may take
REQUEST_TIMEOUT_S = 600.0
#: log lines quoted when the server fails to start
LOG_TAIL_LINES = 15


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _token_id(token: str) -> int:
    """``"token_id:42"`` (``return_tokens_as_token_ids``) → 42."""
    return int(token.rpartition(":")[2])


def _flags(args: dict[str, Any]) -> list[str]:
    """``vllm.LLM`` keyword arguments as server command-line flags."""
    flags = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


class _Server:
    """A vLLM server process this harness started, with its log in a private folder."""

    def __init__(self, config: EngineConfig, options: dict[str, Any]) -> None:
        self.root = tempfile.mkdtemp(prefix="tim-vllm-server-")
        self.log_path = Path(self.root) / "server.log"
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = common.engine_args(config, options)
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *_flags(args),
        ]
        env = {
            **os.environ,
            **common.environment(self.root, enforce_eager=options["enforce_eager"]),
        }
        with self.log_path.open("wb") as log:
            # a session of its own: stopping the group stops every process vLLM spawned
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        atexit.register(self.stop)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise EngineUnavailable(
                    f"the vLLM server exited with code {code} before answering: {self.log_tail()}",
                    "fix the cause in the server log above, or check the install (tox -e vllm)",
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise EngineUnavailable(
            f"the vLLM server did not answer within {START_TIMEOUT_S:.0f} s: {tail}",
            "raise TIM_VLLM_START_TIMEOUT or look at the server log",
        )

    def stop(self) -> None:
        """Terminate the process group, escalate to SIGKILL, reap; then drop the folder."""
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
        else:
            # the leader is gone; children it left in the group must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


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

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options = common.parse_options(self.name, config.options, extra={"url": str})
        self._server: _Server | None = None
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
            self.url = url.rstrip("/")
            self._model_id, self._max_model_len = self._describe(attached=True)
            return
        if common.vllm_version() is None:
            raise EngineUnavailable("vllm is not installed", common.INSTALL_HINT)
        self._server = _Server(config, self.options)
        self.url = self._server.url
        try:
            self._server.wait_ready()
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
        request = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps({"model": self._model_id, **body}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                return json.load(reply)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code < 500:
                raise UsageError(
                    f"the vLLM server rejected a request (HTTP {exc.code}): {detail}",
                    "fix the request (lengths, sampling values) or the server's settings",
                ) from None
            raise EngineCrashed(
                f"the vLLM server at {self.url} failed (HTTP {exc.code}): {detail}",
                "check the server log; what was measured is kept",
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise EngineCrashed(self._death(exc), "what was measured is kept; rerun") from None

    def _death(self, exc: BaseException) -> str:
        if self._server is not None and self._server.process.poll() is not None:
            return (
                f"the vLLM server (pid {self._server.process.pid}) died with code "
                f"{self._server.process.returncode}: {self._server.log_tail()}"
            )
        return f"the vLLM server at {self.url} stopped answering ({exc})"

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
