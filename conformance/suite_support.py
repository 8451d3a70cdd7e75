"""What the suites share: drawing batches and rollout lengths sized to the model and the search
depth, aligning rollout positions, and describing a case so a failure can be replayed."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from conformance.chat_prompts import rendered_prompts
from conformance.depth import Depth
from conformance.engines.base import Completion, SamplingSpec
from conformance.routing import Routes
from conformance.strategies import (
    BATCH_KINDS,
    IGNORE_EOS,
    BatchKind,
    BatchShape,
    batch_shapes,
    log_sizes,
    sampling_specs,
    stop_token_ids,
    token_batches,
)

#: suites whose every measurement is rollout tokens as the engine decoded them against the
#: backend's recompute of them: a calibrated profile bounds them by the calibration's decoded
#: rollouts alone (``[suites.NAME]``), not also by its whole sequences scored in one prefill,
#: whose small systematic bias (k1 ≈ 0.0014 on a bf16 qwen3 model, 4× its rollouts') would
#: otherwise set the bound that a biased rollout must beat
ROLLOUT_SUITES = ("rollout_parity", "multi_turn", "stop_strings", "logprob_semantics", "routing")


def prompt_batches(
    model: Any,
    depth: Depth,
    *,
    max_new_tokens: int = 0,
    min_len: int = 1,
    max_batch: int | None = None,
    max_len: int | None = None,
    kinds: Sequence[BatchKind] = BATCH_KINDS,
) -> st.SearchStrategy[tuple[BatchShape, list[list[int]]]]:
    """Batches of prompts as large as ``depth`` reaches (``max_batch`` caps the size below it,
    ``max_len`` the prompt length) that fit the model's context, and the depth's token budget,
    together with ``max_new_tokens``. Where the model's tokenizer has a chat template
    (``model.chat_template``), the prompts mix random ids with chat-templated natural-language
    ones (:mod:`conformance.chat_prompts`), as RL feeds a trained model."""
    chat = getattr(model, "chat_template", False)
    return _prompt_batches(
        model.vocab_size,
        model.max_position_embeddings,
        tuple(model.special_token_ids),
        str(model.path) if chat else None,
        depth,
        max_new_tokens,
        min_len,
        depth.max_batch if max_batch is None else min(max_batch, depth.max_batch),
        max_len,
        tuple(kinds),
    )


# suites build their batch strategy inside each example (its size depends on a drawn rollout
# length); building a composite strategy reads its source (Hypothesis inspects it), which
# cost more than the draw itself
@functools.lru_cache(maxsize=1024)
def _prompt_batches(
    vocab_size: int,
    context: int,
    special_ids: tuple[int, ...],
    chat_model: str | None,
    depth: Depth,
    max_new_tokens: int,
    min_len: int,
    max_batch: int,
    max_len: int | None,
    kinds: tuple[BatchKind, ...],
) -> st.SearchStrategy[tuple[BatchShape, list[list[int]]]]:
    # an engine scores a sequence by generating one token after it (vLLM's prompt_logprobs),
    # so a prompt and its rollout, scored again, need one more position in the context
    limit = depth.prompt_limit(context, max_new_tokens + 1)
    if max_len is not None:
        limit = min(limit, max_len)
    shapes = batch_shapes(
        min_len=min_len,
        max_len=limit,
        max_batch=max_batch,
        kinds=kinds,
        max_tokens=depth.max_batch_tokens,
        new_tokens=max_new_tokens,
        group_size=depth.group_size,
    )
    chat = _chat_prompts(chat_model) if chat_model is not None else ()
    return token_batches(vocab_size, shape=shapes, special_ids=special_ids, chat_prompts=chat)


def chat_prompts(model: Any) -> tuple[tuple[int, ...], ...]:
    """The project's chat corpus rendered by ``model``'s chat template up to the assistant's
    turn (:mod:`conformance.chat_prompts`); none where its tokenizer has no template."""
    return _chat_prompts(str(model.path)) if getattr(model, "chat_template", False) else ()


@functools.lru_cache(maxsize=4)
def _chat_prompts(path: str) -> tuple[tuple[int, ...], ...]:
    """The corpus rendered by the chat template of the model in ``path``, once per model."""
    return rendered_prompts(_tokenizer(path))


def new_tokens(depth: Depth) -> st.SearchStrategy[int]:
    """Rollout lengths up to the depth's, log-uniform."""
    return log_sizes(1, depth.max_new_tokens)


def rollout_specs(model: Any, depth: Depth, **fixed: Any) -> st.SearchStrategy[SamplingSpec]:
    """Sampling specs as RL draws them: lengths up to the depth's, and rollouts that either run
    to the length or stop at the model's EOS and drawn stop ids (so a batch mixes both);
    ``fixed`` overrides any :func:`sampling_specs` argument."""
    return _rollout_specs(model.vocab_size, model.eos_token_id, depth, tuple(sorted(fixed.items())))


# built once per suite and arguments, as _prompt_batches is
@functools.lru_cache(maxsize=256)
def _rollout_specs(
    vocab_size: int, eos_token_id: int | None, depth: Depth, fixed: tuple[tuple[str, Any], ...]
) -> st.SearchStrategy[SamplingSpec]:
    drawn: dict[str, Any] = {
        "max_new_tokens": new_tokens(depth),
        "ignore_eos": IGNORE_EOS,
        "stop_token_ids": stop_token_ids(vocab_size, eos_token_id=eos_token_id),
    }
    return sampling_specs(**{**drawn, **dict(fixed)})


def sample_groups(
    engine: Any, prompts: Sequence[Sequence[int]], spec: SamplingSpec, recorder: Any = None
) -> list[Completion]:
    """``spec.n`` completions per prompt, prompt-major: from the engine's own parallel-sampling
    path where it declares one (``capabilities.parallel_sampling``), else one batch of the
    prompts per child, child ``c`` seeded ``seed + c`` (the streams vLLM derives for its
    children), which ``recorder`` is told of (the check's message says its own path went
    untested). The same
    seed for every copy of a prompt would repeat one rollout n times on any engine whose
    rollout depends on its seed and prompt alone, as the contract asks."""
    if spec.n == 1 or engine.capabilities.parallel_sampling:
        return engine.generate(prompts, spec)
    if recorder is not None:
        recorder.remark(
            f"engine {engine.name!r} does not declare capabilities.parallel_sampling: its groups "
            "were sampled as one seeded batch per child, not on its own n-samples path"
        )
    per_child = [
        engine.generate(prompts, replace(spec, n=1, seed=spec.seed + child))
        for child in range(spec.n)
    ]
    return [batch[i] for i in range(len(prompts)) for batch in per_child]


def caches_prefixes(engine: Any) -> bool:
    """Whether ``engine`` runs with its prefix cache on: false only where one of its options
    holds another value than ``capabilities.prefix_cache`` names (both server engines' defaults keep
    the cache on). An engine that declares no such option may cache or not, so it counts as
    caching: a suite then plans for a cache it cannot rule out."""
    options = engine.config.options
    return not any(
        k in options and str(options[k]).lower() != v
        for k, v in engine.capabilities.prefix_cache.items()
    )


def generated_rows(
    completions: Sequence[Completion], recomputed: Sequence[Any]
) -> tuple[list[list[float]], list[list[float]], list[list[int]]]:
    """Align a backend recompute of full sequences with the engine's sampled-token logprobs.

    Returns ``(lp_train, lp_infer, positions)`` over generated tokens only; ``positions`` counts
    from the first generated token, so plots of |Δlp| by position show drift along a rollout.
    """
    lp_train, lp_infer, positions = [], [], []
    for completion, row in zip(completions, recomputed, strict=True):
        start = len(completion.prompt) - 1
        values = row.tolist() if hasattr(row, "tolist") else list(row)
        lp_train.append(values[start : start + len(completion.tokens)])
        lp_infer.append(list(completion.logprobs))
        positions.append(list(range(len(completion.tokens))))
    return lp_train, lp_infer, positions


def agreeing_rows(
    ours: Sequence[Completion], theirs: Sequence[Completion]
) -> tuple[list[list[float]], list[list[float]]]:
    """Two engines' log-probs of their completions of the same requests, pair by pair, over
    the tokens both sampled alike: a log-prob is of its token given those before it, so the
    rows stop where the sampled tokens first differ."""
    mine, other = [], []
    for a, b in zip(ours, theirs, strict=True):
        same = next(
            (i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y),
            min(len(a.tokens), len(b.tokens)),
        )
        mine.append(list(a.logprobs[:same]))
        other.append(list(b.logprobs[:same]))
    return mine, other


def generated_routes(
    completions: Sequence[Completion], recomputed: Sequence[Routes]
) -> tuple[list[Any], list[Any]]:
    """The engine's and the backend's experts at the generated tokens (the positions
    :func:`generated_rows` aligns), per completion."""
    engine, backend = [], []
    for completion, routes in zip(completions, recomputed, strict=True):
        if completion.routes is None:
            raise ValueError("a completion without routes: the engine reports none")
        start = len(completion.prompt) - 1
        engine.append(completion.routes.tail(start).experts)
        backend.append(routes.tail(start).experts[: len(completion.tokens)])
    return engine, backend


def model_tokenizer(model: Any) -> Any:
    """The model folder's tokenizer; the running check skips, saying so, where it has none."""
    import pytest

    try:
        return _tokenizer(str(model.path))
    except (OSError, ValueError) as exc:
        pytest.skip(f"the model has no tokenizer ({str(exc).strip().splitlines()[0]})")


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
