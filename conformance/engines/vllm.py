"""The ``vllm`` engine: vLLM's offline ``LLM`` API in this process (token-id prompts, eager).

Sampled-token logprobs come from the sampler (``logprobs_mode`` raw or processed); scoring
uses ``prompt_logprobs``, which vLLM always computes from the raw logits.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from conformance.engines import _vllm_common as common
from conformance.engines import _vllm_internals as internals
from conformance.engines.base import (
    Completion,
    Engine,
    EngineConfig,
    Request,
    SamplingSpec,
    TokenBatch,
)

#: in-process engines not yet closed (vLLM's distributed state is shared between them)
_OPEN: set[int] = set()


class VLLMEngine(Engine):
    name = "vllm"
    # the option value that keeps the prefix cache on (vLLM V1's default for these models), for
    # the weight-sync suite's cache property; the server engine takes no new weights
    capabilities = replace(common.CAPABILITIES, prefix_cache={"enable_prefix_caching": "true"})

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        common.parse_options(cls.name, options, extra={})

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options = common.parse_options(self.name, config.options, extra={})
        self._root = tempfile.mkdtemp(prefix="tim-vllm-")
        atexit.register(shutil.rmtree, self._root, True)
        # vLLM reads these while importing and starting, so they go in before either
        os.environ.update(
            common.environment(
                self._root,
                enforce_eager=self.options["enforce_eager"],
                tensor_parallel_size=common.PARALLEL.size(self.options),
            )
        )
        try:
            from vllm import LLM
        except (ImportError, RuntimeError) as exc:
            raise common.import_failure(exc) from exc
        internals.grant_amx_tiles()
        # with a KV budget, log stats on: its preemption counter is what preemptions() reads
        self._counts = common.KV_BUDGET_OPTION in self.options
        self._llm: Any = LLM(
            **common.engine_args(config, self.options), disable_log_stats=not self._counts
        )
        _OPEN.add(id(self))
        # vLLM's counters live in one registry per process: counted from this engine's start
        self._preempted_before = self._preempted()
        self._config = internals.vllm_config(self._llm)
        self._max_model_len: int = (
            self._config.model_config.max_model_len
            if self._config is not None
            else self.options.get("max_model_len", sys.maxsize)
        )
        self._seeded_chunk = self._prefill_chunk()
        self._refusal = common.speculation_refusal(self.options)

    def _preempted(self) -> int:
        return common.count_preemptions(self._llm.get_metrics()) if self._counts else 0

    def preemptions(self) -> int | None:
        """Requests vLLM preempted since this engine started (``vllm:num_preemptions`` from
        ``LLM.get_metrics()``); None without a KV budget, where log stats stay off."""
        return self._preempted() - self._preempted_before if self._counts else None

    def _prefill_chunk(self) -> int | None:
        """The prefill chunk seeded CPU requests must fit in (see ``seeded_groups``): vLLM's
        resolved budget, or where that cannot be read the one the options set."""
        if self._config is None:
            chunked, budget = (
                self.options.get("enable_chunked_prefill", True),
                self.options.get("max_num_batched_tokens"),
            )
        else:
            scheduler = self._config.scheduler_config
            chunked, budget = scheduler.enable_chunked_prefill, scheduler.max_num_batched_tokens
        return budget if internals.is_cpu() and chunked else None

    def _run(self, prompts: TokenBatch, params: Any) -> list[Any]:
        from vllm.inputs import TokensPrompt

        # vLLM returns the outputs in prompt order
        return self._llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )

    def _params(self, spec: SamplingSpec, top_logprobs: int) -> Any:
        """vLLM's ``SamplingParams`` for ``spec``: the one place a spec becomes them."""
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            min_p=spec.min_p,
            # one seed per request: a prompt's rollout does not depend on its batch-mates
            seed=spec.seed,
            logprobs=top_logprobs,
            **common.stop_params(spec),
            **common.parallel_params(spec),
        )

    def _sample(self, prompts: TokenBatch, params: Sequence[Any], n: int) -> list[Any]:
        """vLLM's outputs for ``prompts``, prompt ``i`` under ``params[i]``, submitted in groups
        no seeded prefill is split in (``common.seeded_groups``); refused where the engine
        cannot sample under its speculation (``common.speculation_refusal``)."""
        if self._refusal is not None:
            raise self._refusal
        common.check_lengths([len(p) for p in prompts], self._max_model_len)
        # each prompt with its own request's new tokens
        common.check_lengths(
            [len(p) + q.max_tokens for p, q in zip(prompts, params, strict=True)],
            self._max_model_len,
        )
        # every request carries a seed (``SamplingSpec.seed``); each of a request's n children
        # is a request of its own in vLLM's scheduler (v1's ParentRequest), each prefilling the
        # prompt: n prompts' worth of the token budget
        groups = common.seeded_groups([len(p) * n for p in prompts], 0, self._seeded_chunk)
        return [
            out
            for g in groups
            for out in self._run([prompts[i] for i in g], [params[i] for i in g])
        ]

    @staticmethod
    def _completion(prompt: Sequence[int], sample: Any, top_logprobs: int) -> Completion:
        tokens = list(sample.token_ids)
        return Completion(
            prompt=list(prompt),
            tokens=tokens,
            logprobs=[ranked[t].logprob for t, ranked in zip(tokens, sample.logprobs, strict=True)],
            top_logprobs=[
                {t: lp.logprob for t, lp in ranked.items() if lp.rank <= top_logprobs}
                for ranked in sample.logprobs
            ]
            if top_logprobs
            else None,
            finish_reason=sample.finish_reason or "length",
        )

    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        params = self._params(spec, top_logprobs)
        outputs = self._sample(prompts, [params] * len(prompts), spec.n)
        return [
            self._completion(prompt, sample, top_logprobs)
            for prompt, sample in common.children(prompts, outputs, spec.n)
        ]

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        # one LLM.generate call, each request with its own SamplingParams: vLLM schedules them
        # in one batch, its sampler applying per-request temperature, top-k/top-p, seed and
        # logprobs
        prompts = [r.prompt for r in requests]
        params = [self._params(r.spec, r.top_logprobs) for r in requests]
        outputs = self._sample(prompts, params, 1)
        return [
            self._completion(r.prompt, sample, r.top_logprobs)
            for r, (_, sample) in zip(requests, common.children(prompts, outputs, 1), strict=True)
        ]

    def score(self, sequences: TokenBatch) -> list[list[float]]:
        from vllm import SamplingParams

        common.check_lengths([len(s) for s in sequences], self._max_model_len, extra=1)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        return [
            # entry 0 is None: the first token has no prefix
            [ranked[t].logprob for t, ranked in zip(seq[1:], out.prompt_logprobs[1:], strict=True)]
            for seq, out in zip(sequences, self._run(sequences, params), strict=True)
        ]

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy a transformers-named state dict into the running model (RL weight sync).

        vLLM's worker ``reload_weights`` maps checkpoint names onto its fused layers and redoes
        the CPU kernels' weight repacking (a plain ``model.load_weights`` would write into
        parameters already repacked away). The engine runs in this process, so the tensors
        are passed by reference. Cached prefixes hold the old weights' keys and values.
        """
        internals.reload_weights(self._llm, state_dict.items())
        self._llm.reset_prefix_cache()

    def info(self) -> dict[str, Any]:
        info = super().info()
        info["vllm"] = common.vllm_version()
        config = self._config
        if self._llm is not None and config is None:
            info["knobs"] = dict(self.options)
        elif self._llm is not None:
            info["knobs"] = {
                "enforce_eager": config.model_config.enforce_eager,
                "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
                "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                "enable_prefix_caching": config.cache_config.enable_prefix_caching,
                "max_num_seqs": config.scheduler_config.max_num_seqs,
                "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
                "max_model_len": config.model_config.max_model_len,
                "logprobs_mode": config.model_config.logprobs_mode,
                "kv_cache_dtype": config.cache_config.cache_dtype,
            }
            if config.speculative_config is not None:
                info["knobs"]["speculative_config"] = self.options["speculative_config"]
            if self._counts:
                cache = config.cache_config
                # one block is the pool's null block (see kv_budget_args)
                blocks = cache.num_gpu_blocks_override - 1
                info["knobs"]["kv_cache_tokens"] = blocks * cache.block_size
        return info

    def close(self) -> None:
        if getattr(self, "_llm", None) is None:
            return
        llm, self._llm = self._llm, None
        _OPEN.discard(id(self))
        self._config = None
        if _OPEN:
            # shutdown() also tears down vLLM's process-wide distributed state, which the
            # engines still open here use: free this one's model and cache, leave the rest;
            # tensor-parallel workers are processes of this engine's own, stopped with it
            internals.release(llm, workers=common.PARALLEL.size(self.options) > 1)
        else:
            internals.shutdown(llm)
        del llm
        gc.collect()
        shutil.rmtree(self._root, ignore_errors=True)
