"""The Engine protocol: what an inference engine (vLLM, SGLang, transformers ``generate``) must do.

An engine samples rollouts and reports the log-probability of each token it sampled; it can
also score given sequences (per-token log-probability given the prefix, one prefill).

Token positions: for a sequence ``s`` of length n, ``score`` returns n − 1 values, entry ``t``
being ``log p(s[t + 1] | s[: t + 1])``. Position 0 has no prefix and is never scored.
"""

from __future__ import annotations

import enum
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from conformance.errors import Unsupported, UsageError
from conformance.parallel import ParallelSetting
from conformance.releases import ReleaseRange
from conformance.routing import Routes
from conformance.sampling import STATED_ORDER, SamplerOrder

#: token-id sequences: the prompts of a batch, or the sequences to score
TokenBatch = Sequence[Sequence[int]]


class LogprobKind(enum.StrEnum):
    """Which distribution a reported log-probability belongs to."""

    #: log softmax of the model's logits — what a trainer recomputes; the default
    RAW = "raw"
    #: after temperature / top-k / top-p renormalisation — biases ratios by log(S)
    PROCESSED = "processed"


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample. ``top_k = 0``, ``top_p = 1.0`` and ``min_p = 0.0`` mean "off"; how they
    compose is ``conformance.sampling``'s stated sampler (or the engine's declared
    ``capabilities.sampler_order``).

    ``n`` samples per prompt (a GRPO group from one request, as vLLM's ``SamplingParams.n``,
    SGLang's ``n`` and transformers' ``num_return_sequences`` fork it): ``generate`` returns
    ``len(prompts) · n`` completions, prompt-major (prompt ``i``'s children at ``i·n`` to
    ``i·n + n − 1``), each child an independent draw; a seeded request repeats all of them.

    A rollout ends at ``max_new_tokens`` (``finish_reason`` ``"length"``) or, unless
    ``ignore_eos``, at the model's EOS, at any id in ``stop_token_ids`` or once its text ends in
    one of the ``stop`` strings (``"stop"``). A stopped rollout's tokens and log-probs include
    the token that stopped it: the trainer recomputes, and trains on, that token too.
    """

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    #: keep only tokens at least ``min_p`` times as likely as the most likely one; engines that
    #: do not declare ``capabilities.min_p`` are only ever given 0
    min_p: float = 0.0
    #: fixed-length rollouts: nothing ends a rollout before ``max_new_tokens``
    ignore_eos: bool = True
    #: ids besides the model's EOS that end a rollout (RL stacks list several, EOS among them)
    stop_token_ids: tuple[int, ...] = ()
    #: texts that end a rollout once its detokenized text contains one (engines with a
    #: tokenizer); the ids and log-probs of every token up to the one completing it are returned
    stop: tuple[str, ...] = ()
    #: samples per prompt (see above); engines that do not declare
    #: ``capabilities.parallel_sampling`` are only ever given 1
    n: int = 1

    def __post_init__(self) -> None:
        # lists are accepted, as a user writes them; the spec stays hashable
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens={self.max_new_tokens}", "use max_new_tokens >= 1")
        if self.n < 1:
            raise UsageError(f"n={self.n}", "use n >= 1 samples per prompt")
        if self.temperature <= 0:
            raise UsageError(f"temperature={self.temperature}", "use a temperature > 0")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p={self.top_p}", "use 0 < top_p <= 1")
        if self.top_k < 0:
            raise UsageError(f"top_k={self.top_k}", "use top_k >= 0 (0 = off)")
        if not 0 <= self.min_p <= 1:
            raise UsageError(f"min_p={self.min_p}", "use 0 <= min_p <= 1 (0 = off)")
        if self.ignore_eos and (self.stop_token_ids or self.stop):
            raise UsageError(
                "stop_token_ids/stop given with ignore_eos=True (rollouts that never stop)",
                "pass ignore_eos=False to stop rollouts, or drop the stop ids and strings",
            )
        if any(t < 0 for t in self.stop_token_ids) or not all(self.stop):
            raise UsageError(
                f"stop_token_ids={list(self.stop_token_ids)} stop={list(self.stop)}",
                "use token ids >= 0 and non-empty stop strings",
            )

    def as_dict(self) -> dict[str, Any]:
        """Every field, as JSON holds it (the tuples as lists)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}

    def stops_at(self, eos_token_id: int | None) -> frozenset[int]:
        """The ids that end a rollout under this spec, given the model's EOS."""
        if self.ignore_eos:
            return frozenset()
        return frozenset(self.stop_token_ids) | ({eos_token_id} - {None})


@dataclass
class Completion:
    """One sampled continuation and the engine's log-probability of each sampled token."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    #: per sampled position, the engine's top-k ``{token_id: logprob}``, when asked for
    top_logprobs: list[dict[int, float]] | None = None
    #: ``"stop"`` (a stop id or string ended it; its last token is the one that did) or
    #: ``"length"`` (it has ``max_new_tokens`` tokens)
    finish_reason: str = "length"
    #: where an MoE model routed the sequence's tokens (``conformance.routing``: one entry per
    #: scored position of ``sequence``), from engines that report it; None otherwise
    routes: Routes | None = None

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.tokens


@dataclass(frozen=True)
class Request:
    """One request of a mixed batch (``Engine.generate_requests``): a prompt, how to sample it
    (``spec.n`` must be 1) and how many top log-probs per sampled token to report (0: none), as
    an RL rollout server receives them — rollouts next to evaluation or scoring traffic, each
    request with its own seed, some asking for top-k log-probs."""

    prompt: tuple[int, ...]
    spec: SamplingSpec = field(default_factory=SamplingSpec)
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        # a list is accepted, as a user writes it; the request stays hashable
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        if self.spec.n != 1:
            raise UsageError(
                f"a Request with n={self.spec.n}", "send n = 1 per request (or n requests)"
            )
        if self.top_logprobs < 0:
            raise UsageError(f"top_logprobs={self.top_logprobs}", "use top_logprobs >= 0")

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt),
            "sampling": self.spec.as_dict(),
            "top_logprobs": self.top_logprobs,
        }


def parameter_groups(requests: Sequence[Request]) -> list[list[int]]:
    """Indices of ``requests`` sharing one (spec, top_logprobs), in order of first appearance:
    the batches an engine that cannot mix parameters serves them in."""
    groups: dict[tuple[SamplingSpec, int], list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault((request.spec, request.top_logprobs), []).append(index)
    return list(groups.values())


@dataclass(frozen=True)
class Knob:
    """An engine option meant to change speed, not numbers, and the values the knob suite tries
    (strings, as ``EngineConfig.options`` takes them).

    ``requires`` holds options that must be set alongside any of these values (vLLM's prefill
    budget may only drop below the context length with chunked prefill on); every variant engine
    holding one of the values sets them too.
    """

    values: tuple[str, ...]
    requires: Mapping[str, str] = field(default_factory=dict)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine declares beyond the protocol's methods, in one value: which suites run on
    it, how they sample it and which variants they start. Every field defaults to what the
    protocol assumes of an engine that says nothing, so an engine declares only what differs
    (``EngineCapabilities(min_p=True)``, or ``dataclasses.replace`` of its parent's)."""

    #: the engine's knobs: option name → the values to try. The knob suite starts a few variant
    #: engines that together hold every value (``conformance.knobs``); declaring them here is all
    #: an engine does to have them varied
    knobs: Mapping[str, Knob] = field(default_factory=dict)
    #: the option that splits the model over devices, for engines that have one: the
    #: parallelism suite compares the stack with a variant at size 1, ``info()`` records the size
    parallel: ParallelSetting | None = None
    #: the releases of the package it drives that it supports (``conformance.releases``):
    #: ``certify`` refuses older ones and warns on newer ones before anything starts
    releases: ReleaseRange | None = None
    #: option values that keep the engine's prefix cache on, for engines that have one (the
    #: weight-sync suite holds a sync to reset it): a stack whose options turn it off gets a
    #: variant engine with these
    prefix_cache: Mapping[str, str] = field(default_factory=dict)
    #: option values under which the engine matches stop strings, for engines that do so only
    #: with an option on (a loaded tokenizer): the stop-string suite runs on a variant with these
    stop_strings: Mapping[str, str] = field(default_factory=dict)
    #: why the engine's completions carry no MoE routes (``Completion.routes``), or None where
    #: they do on an MoE model: the routing suite skips with this reason
    no_routes: str | None = "the engine does not report the experts it routed to"
    #: whether ``generate`` takes ``SamplingSpec.n > 1`` on the engine's own parallel-sampling
    #: path; the harness gives an engine that does not declare it ``n = 1`` and the prompt
    #: repeated n times instead (``conformance.suite_support.sample_groups``)
    parallel_sampling: bool = False
    #: how the engine's sampler composes top-k and top-p (``conformance.sampling``): an engine
    #: that does not follow the stated sampler (min-p, then top-k, then top-p over the
    #: renormalised rest) declares its own order here, and its sampled tokens are held to that
    sampler_order: SamplerOrder = STATED_ORDER
    #: whether ``generate`` applies ``SamplingSpec.min_p``; the suites give ``min_p > 0`` only to
    #: an engine that declares it (the sampler-fidelity suite's min-p spec skips otherwise)
    min_p: bool = False
    #: the ``--engine-option`` that bounds the engine's KV cache, its value a number of tokens
    #: (the adapter turns it into the engine's own setting: vLLM's block count, SGLang's
    #: ``max_total_tokens``). The preemption suite starts a variant whose budget is smaller than
    #: its batch needs, so that requests are preempted or retracted and recomputed. None: the
    #: engine's KV memory cannot be bounded, and that suite skips saying so
    kv_budget_option: str | None = None
    #: option values that variant sets with the budget, for engines whose admission must be
    #: told to fill the budget as a long-running one does (SGLang's reservation for a fresh
    #: engine keeps its batches small enough never to retract)
    kv_budget_requires: Mapping[str, str] = field(default_factory=dict)
    #: whether ``generate_requests`` serves requests with different sampling specs and
    #: top-logprob counts together, in one batch (vLLM's per-request ``SamplingParams``, SGLang's
    #: per-request lists, a server with several requests in flight); the base implementation
    #: serves one ``generate`` batch per parameter set instead, which the mixed-requests suite
    #: says (``suites/test_mixed_requests.py``)
    mixed_requests: bool = False

    def __post_init__(self) -> None:
        # a dict the declaring module keeps cannot change what the harness reads
        for name in ("knobs", "prefix_cache", "stop_strings", "kv_budget_requires"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))


#: the class attributes engines declared their capabilities as before ``capabilities`` → the
#: field each is now; a class declaring one still works for one release, with a
#: ``DeprecationWarning`` naming the field
DEPRECATED_ATTRIBUTES: Mapping[str, str] = MappingProxyType(
    {
        "KNOBS": "knobs",
        "parallel": "parallel",
        "RELEASES": "releases",
        "PREFIX_CACHE": "prefix_cache",
        "STOP_STRINGS": "stop_strings",
        "NO_ROUTES": "no_routes",
        "PARALLEL_SAMPLING": "parallel_sampling",
        "SAMPLER_ORDER": "sampler_order",
        "MIN_P": "min_p",
        "KV_BUDGET_OPTION": "kv_budget_option",
        "KV_BUDGET_REQUIRES": "kv_budget_requires",
        "MIXED_REQUESTS": "mixed_requests",
    }
)


@dataclass
class EngineConfig:
    """What every engine is built from. ``options`` holds engine-specific knobs."""

    model: Path
    dtype: str = "float32"
    logprobs: LogprobKind = LogprobKind.RAW
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)


class Engine(ABC):
    """An inference engine behind one protocol. Start it once; ``close`` it always."""

    #: registry name, e.g. ``"vllm"``
    name: ClassVar[str]
    #: what the engine declares beyond its methods (see :class:`EngineCapabilities`); the
    #: adapters of one engine family share one value
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = {a: f for a, f in DEPRECATED_ATTRIBUTES.items() if a in cls.__dict__}
        for attribute, name in declared.items():
            warnings.warn(
                f"{cls.__qualname__}.{attribute} is deprecated and read for one more release: "
                f"declare capabilities = EngineCapabilities({name}=...) instead "
                "(conformance.engines.EngineCapabilities)",
                DeprecationWarning,
                # the class statement: this hook, then ABCMeta.__new__, then the class's module
                stacklevel=3,
            )
        if declared:
            cls.capabilities = replace(
                cls.capabilities, **{name: cls.__dict__[a] for a, name in declared.items()}
            )

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Raise ``UsageError`` for options (``--engine-option KEY=VALUE`` strings) this engine
        does not take or cannot parse, without starting anything, so a typo is one line before
        any test runs. An engine that takes options overrides this; by default it takes none."""
        if options:
            raise UsageError(
                f"engine {cls.name!r} takes no options (got {', '.join(sorted(options))})",
                "drop --engine-option",
            )

    @abstractmethod
    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        """Sample ``spec.n`` completions per prompt (one unless the engine declares
        ``capabilities.parallel_sampling``); return them prompt-major, in prompt order.

        Each ``Completion.logprobs[i]`` is the engine's log-probability of ``tokens[i]``,
        of the kind given by ``config.logprobs``.
        """

    def generate_requests(self, requests: Sequence[Request]) -> list[Completion]:
        """One completion per request (each ``n = 1``), in request order, each sampled under its
        own ``spec`` and reporting its own ``top_logprobs`` (``None`` where it asks for none).

        This implementation serves the requests one ``generate`` batch per distinct (spec,
        top_logprobs), never mixed; an engine that batches different parameters together
        overrides it and declares ``capabilities.mixed_requests``.
        """
        completions: list[Completion | None] = [None] * len(requests)
        for group in parameter_groups(requests):
            first = requests[group[0]]
            served = self.generate(
                [requests[i].prompt for i in group], first.spec, top_logprobs=first.top_logprobs
            )
            for index, completion in zip(group, served, strict=True):
                completions[index] = completion
        return [c for c in completions if c is not None]

    @abstractmethod
    def score(self, sequences: TokenBatch) -> list[list[float]]:
        """Per-token log-probabilities of given sequences (raw), n − 1 values per sequence."""

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the engine's weights in place (RL weight sync)."""
        raise Unsupported(
            f"engine {self.name!r} cannot take new weights",
            "implement load_weights() or choose an engine that can (hf-generate, vllm, sglang)",
        )

    def preemptions(self) -> int | None:
        """How many times, since it started, the engine evicted a running request's KV cache to
        make room (vLLM's preemptions, SGLang's retractions) and later recomputed it from the
        prompt and the tokens sampled so far; None where the engine cannot tell."""
        return None

    def artefacts(self) -> Mapping[str, str]:
        """What the engine built from the model that its numbers depend on, name → digest (a
        converted model folder's hash, a compiled-graph cache key): recorded in the stack
        fingerprint as ``engine_info.artefacts``, so a certificate pins them and ``tim-conformance
        check`` sees them change. None by default."""
        return {}

    def knobs(self) -> Mapping[str, Knob]:
        """The knobs this engine can vary: its declared ``capabilities.knobs`` (none where the
        engine cannot be restarted with other options, e.g. a server the user runs)."""
        return self.capabilities.knobs

    def info(self) -> dict[str, Any]:
        """What identifies this engine in a stack fingerprint: versions, knobs, device."""
        info: dict[str, Any] = {
            "engine": self.name,
            "dtype": self.config.dtype,
            "logprobs": self.config.logprobs.value,
        }
        declared = self.capabilities
        if declared.parallel is not None:
            info["parallel"] = {
                declared.parallel.label: declared.parallel.size(self.config.options)
            }
        if declared.releases is not None:
            info["release"] = declared.releases.describe()
        if declared.sampler_order is not STATED_ORDER:
            # the stated order is every engine's unless declared: only a departure is recorded
            info["sampler_order"] = declared.sampler_order.value
        return info

    def close(self) -> None:
        """Release everything the engine holds (processes, ports, memory). Idempotent."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DEPRECATED_ATTRIBUTES",
    "Completion",
    "Engine",
    "EngineCapabilities",
    "EngineConfig",
    "Knob",
    "LogprobKind",
    "Request",
    "SamplingSpec",
    "TokenBatch",
    "parameter_groups",
]
