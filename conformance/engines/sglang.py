"""The ``sglang`` engine: SGLang's offline ``sglang.Engine`` driven from this process.

SGLang runs its scheduler (model, KV cache, sampler, logprob processing) in a spawned
subprocess; this process holds the tokenizer-manager side. Prompts go in as token ids.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import _sglang_common as common
from conformance.engines import _sglang_internals as internals
from conformance.engines.base import (
    Completion,
    Engine,
    EngineConfig,
    Request,
    SamplingSpec,
    TokenBatch,
)
from conformance.errors import EngineCrashed, EngineUnavailable


class SGLangEngine(Engine):
    name = "sglang"
    capabilities = common.CAPABILITIES

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        common.parse_options(cls.name, options, extra={})

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._engine: Any = None
        self._retractions = common.Retractions()
        self._watch = _ChildWatch()
        parsed = common.parse_options(self.name, config.options, extra={})
        if common.sglang_version() is None:
            raise EngineUnavailable("sglang is not installed", common.INSTALL_HINT)
        self.options = common.with_defaults(parsed)
        self._standin = common.kernel_standin(self.options["device"])
        if self._standin:
            common.activate_standin(self._standin)
        self._env = common.environment(config, self.options)
        # read by the scheduler subprocess when it starts, so set before the engine is built
        common.apply_environment(self._env)
        try:
            import sglang
        except ImportError as exc:
            raise EngineUnavailable(
                f"sglang cannot be imported ({exc})", common.INSTALL_HINT
            ) from exc
        import psutil

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            self._engine = sglang.Engine(
                **common.server_args(config, self.options), custom_sigquit_handler=self._watch
            )
        except (RuntimeError, EngineCrashed) as exc:
            _stop([p for p in psutil.Process().children(recursive=True) if p.pid not in before])
            raise EngineUnavailable(
                f"SGLang's engine failed to start ({str(exc).splitlines()[0]})",
                f"the scheduler's traceback is in {SCHEDULER_OUTPUT}; check the install (tox -e "
                "sglang)",
            ) from exc
        #: this engine's scheduler and detokenizer processes, which ``close`` stops
        self._children = [
            p for p in psutil.Process().children(recursive=True) if p.pid not in before
        ]
        self._watch.loop = getattr(self._engine, "loop", None)
        internals.keep_handlers(
            self._engine, {signal.SIGTERM: sigterm, signal.SIGQUIT: self._watch}
        )

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``sglang.Engine.<method>(...)``; a call a failed child cut short is a crash."""
        try:
            return getattr(self._engine, method)(*args, **kwargs)
        except RuntimeError as exc:
            if self._watch.failed:
                raise self._watch.crash() from exc
            raise

    def _run(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        """The engine's replies to ``request``, their retractions counted."""
        return self._retractions.add(self._call("generate", **request))

    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        return common.generate(prompts, spec, top_logprobs, self.options, self._run)

    def preemptions(self) -> int | None:
        """Requests SGLang retracted in this engine's calls (their replies' counts)."""
        return self._retractions.count

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        # one Engine.generate call, per-request lists of sampling params and top-logprob counts:
        # SGLang's scheduler batches the requests together
        replies = self._run(common.mixed_request(requests, self.options))
        return [
            common.completion(r.prompt, reply, r.top_logprobs)
            for r, reply in zip(requests, replies, strict=True)
        ]

    def score(self, sequences: TokenBatch) -> list[list[float]]:
        return common.scores(sequences, self._run(common.score_request(sequences)))

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy a transformers-named state dict into the running model (RL weight sync).

        ``update_weights_from_tensor`` hands the tensors to the scheduler process, whose model
        maps checkpoint names onto its fused layers; the prefix cache is flushed with it. SGLang
        takes updates only inside a begin/end weight-update session.
        """
        self._call("begin_weight_update")
        try:
            success, message = self._call("update_weights_from_tensor", list(state_dict.items()))
        finally:
            self._call("end_weight_update")
        if not success:
            raise EngineCrashed(f"SGLang did not take the new weights: {message}", "check names")

    def info(self) -> dict[str, Any]:
        return {**super().info(), **common.describe(self.options, self._env, self._standin)}

    def close(self) -> None:
        """Stop this engine's processes only.

        ``sglang.Engine.shutdown`` kills every child of this process: other SGLang engines'
        schedulers (whose watchdogs then SIGQUIT this process) and servers the harness started.
        """

        if self._engine is None:
            return
        engine, self._engine = self._engine, None
        # SGLang registered shutdown for interpreter exit, with the same blanket kill
        internals.detach(engine)
        internals.release_ipc(engine)
        _stop(self._children)


#: where SGLang's scheduler writes why it failed: its processes write to this one's stderr
SCHEDULER_OUTPUT = "this process's error output (certify: pytest.log in the report folder)"


class _ChildWatch:
    """SIGQUIT's handler while an SGLang engine lives in this process. SGLang's children send
    it when one fails, and SGLang's own handler then kills this process's whole tree, the
    harness with it, before the report is written. Here the start or call in progress fails as
    a crash instead, and the run ends incomplete with what it measured: raised where the signal
    lands, or, inside a call (the engine's event loop running, which would swallow an
    exception), by stopping the loop, which ends the call."""

    def __init__(self) -> None:
        #: the engine's event loop, once it has started
        self.loop: Any = None
        self.failed = False

    def __call__(self, signum: int, frame: object) -> None:
        self.failed = True
        if self.loop is not None and self.loop.is_running():
            self.loop.stop()
            return
        raise self.crash()

    @staticmethod
    def crash() -> EngineCrashed:
        return EngineCrashed(
            "a process of the SGLang engine failed and signalled this one (SIGQUIT)",
            f"its traceback is in {SCHEDULER_OUTPUT}; what was measured is kept",
        )


def _stop(processes: list[Any]) -> None:
    """Terminate ``processes``, then kill those left after 15 s, and reap them."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=15)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=15)
