"""The engine contract's checks, against the real engine and the transformers fp32 forward.

Protocol: options refused in one line, score and generate shapes and alignment, top-k
log-probs, seeds where the engine says it is seeded, n samples per prompt where declared, a
mixed batch of requests each under its own parameters,
``load_weights`` where offered, a parallel setting where declared, ``info()``,
``close`` idempotent and calls after it refused by the guard. Controls: fp32 scores within the
fp32 profile of the fp32 backend, a bf16 engine outside it and within bf16's, raw log-probs at
any temperature, processed log-probs flagged by their temperature signature.

Engines start through a :class:`~conformance.started_stack.StartedStack`, as certify starts
them (registry, guard, timing), once per configuration. A configuration the engine refuses with
:class:`~conformance.engines.Unsupported`, and a call it declares unsupported, skip with the
engine's own reason. A test module uses the checks by importing them (``from
conformance.contract.checks import *``) next to a ``subject`` fixture giving a
:class:`Subject`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

from conformance.backends.base import BackendConfig
from conformance.engines import (
    ENGINES,
    Engine,
    LogprobKind,
    Request,
    SamplingSpec,
    Unsupported,
)
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError
from conformance.guard import start
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.models import inspect_model, make_model
from conformance.profiles import load_profile
from conformance.stack import StackSpec
from conformance.started_stack import StartedStack

if TYPE_CHECKING:
    from conformance.backends import Backend
    from conformance.guard import Guarded

_T = TypeVar("_T")

__all__ = [
    "Subject",
    "hf",
    "sequences",
    "test_a_bf16_engine_fails_the_fp32_profile_and_passes_bf16",
    "test_a_parallel_setting_is_an_option_the_engine_takes_and_reports",
    "test_a_seed_reproduces_the_rollouts",
    "test_an_unknown_option_is_one_line_naming_it",
    "test_close_is_idempotent_and_the_guard_refuses_calls_after_it",
    "test_fp32_scores_are_within_the_fp32_profile_of_the_fp32_backend",
    "test_generate_gives_one_aligned_completion_per_prompt_in_order",
    "test_info_names_the_engine_and_is_json",
    "test_load_weights_makes_the_engine_score_like_the_new_model",
    "test_mixed_requests_are_each_served_under_their_own_parameters",
    "test_n_samples_per_prompt_are_prompt_major_distinct_and_seeded",
    "test_processed_logprobs_carry_the_temperature_signature",
    "test_sampled_logprobs_are_raw_at_any_temperature",
    "test_sampled_logprobs_equal_the_engines_own_scoring",
    "test_score_gives_n_minus_1_finite_logprobs_per_sequence",
    "test_top_logprobs_rank_the_sampled_distribution",
]


class Subject:
    """One engine under the contract (``name``: registered, or ``module:Class``), its engines
    started on first use through a harness session each."""

    def __init__(
        self,
        name: str,
        model: Path,
        *,
        options: dict[str, str] | None = None,
        twin: str | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.options = options or {}
        #: the in-process engine whose numbers this server engine must reproduce exactly
        self.twin = twin
        self._sessions: dict[tuple[str, str, LogprobKind, str], StartedStack] = {}

    def engine(
        self,
        *,
        dtype: str = "float32",
        logprobs: LogprobKind = LogprobKind.RAW,
        twin: bool = False,
        instance: str = "",
        skip: bool = True,
    ) -> Guarded[Engine] | None:
        """The engine in this configuration, started once (another ``instance`` starts another
        one); a configuration it refuses as unsupported skips the calling check with the
        engine's reason (with ``skip`` false: gives ``None``)."""
        name = self.twin if twin else self.name
        assert name is not None
        key = (name, dtype, logprobs, instance)
        if key not in self._sessions:
            spec = StackSpec(
                engine=name,
                model=self.model,
                engine_dtype=dtype,
                logprobs=logprobs,
                engine_options=self.options,
            )
            self._sessions[key] = StartedStack(spec)
        try:
            # the started stack's engine, guarded
            return cast("Guarded[Engine]", self._sessions[key].engine)
        except EngineUnavailable as exc:
            if isinstance(exc.__cause__, Unsupported):
                self._sessions.pop(key)
                if not skip:
                    return None
                pytest.skip(f"engine {name!r} declares: {exc.__cause__}")
            raise

    def forget(self, *, dtype: str = "float32", instance: str = "") -> None:
        """Close and drop an engine (a check that killed or closed it)."""
        self._sessions.pop((self.name, dtype, LogprobKind.RAW, instance)).close()

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 48))] for _ in range(12)]


@pytest.fixture(scope="module")
def hf(subject: Subject) -> Iterator[Guarded[Backend]]:
    """The transformers fp32 forward every engine is measured against."""
    with closing(start("backend", "hf", BackendConfig(model=subject.model))) as backend:
        yield backend


def metrics(reference: list[Any], measured: list[list[float]]) -> dict[str, float]:
    ref, mask = stack_ragged([list(map(float, row)) for row in reference])
    got, got_mask = stack_ragged(measured)
    assert got_mask.equal(mask), "engine and reference score different numbers of positions"
    return mismatch_metrics(ref, got, mask)


def violated(profile: str, measured: dict[str, float]) -> set[str]:
    return {v.metric for v in load_profile(profile).check(measured)}


def sampled_tail(rows: list[Any], completions: list[Any]) -> list[Any]:
    """Each row's entries at the completion's sampled positions."""
    return [row[-len(c.tokens) :] for row, c in zip(rows, completions, strict=True)]


def unless_unsupported(call: Callable[[], _T], what: str) -> _T:
    """``call()``, or a skip with the engine's reason when it declares ``what`` unsupported."""
    try:
        return call()
    except NotImplementedError as exc:
        pytest.skip(f"{what}: the engine declares: {str(exc).splitlines()[0]}")


# -- options, before anything starts ---------------------------------------------------------
def test_an_unknown_option_is_one_line_naming_it(subject: Subject) -> None:
    with pytest.raises(UsageError) as error:
        ENGINES.get(subject.name).check_options({"no_such_option": "1"})
    message = str(error.value)
    assert "no_such_option" in message and "\n" not in message, (
        f"check_options() must refuse an option it does not take in one line naming it: {message}"
    )


# -- the protocol -------------------------------------------------------------------------------
def test_score_gives_n_minus_1_finite_logprobs_per_sequence(subject: Subject, sequences) -> None:
    rows = subject.engine().score(sequences)
    assert [len(row) for row in rows] == [len(s) - 1 for s in sequences], (
        "score() must return n − 1 log-probs per sequence of n tokens"
    )
    assert all(math.isfinite(lp) and lp <= 0 for row in rows for lp in row), (
        "score() must return finite log-probs <= 0"
    )


def test_generate_gives_one_aligned_completion_per_prompt_in_order(
    subject: Subject, sequences
) -> None:
    prompts = sequences[:5]
    completions = subject.engine().generate(prompts, SamplingSpec(max_new_tokens=7, seed=1))
    assert [c.prompt for c in completions] == prompts, (
        "generate() must return one completion per prompt, in order, each with its prompt"
    )
    for completion in completions:
        assert len(completion.tokens) == len(completion.logprobs) == 7, (
            "generate() with ignore_eos must sample max_new_tokens tokens, a log-prob each"
        )
        assert all(0 <= t < 384 for t in completion.tokens), "generate() sampled no vocab id"
        assert all(math.isfinite(lp) and lp <= 0 for lp in completion.logprobs), (
            "generate() must report finite log-probs <= 0"
        )
        assert completion.finish_reason == "length" and completion.top_logprobs is None, (
            "generate() without top_logprobs must give finish_reason 'length' and no top-k"
        )


def test_top_logprobs_rank_the_sampled_distribution(subject: Subject, sequences) -> None:
    rollouts = unless_unsupported(
        lambda: subject.engine().generate(
            sequences[:2], SamplingSpec(max_new_tokens=4, seed=2), top_logprobs=5
        ),
        "top-k log-probs",
    )
    for completion in rollouts:
        assert completion.top_logprobs is not None, "generate(top_logprobs=5) gave no top-k"
        for token, logprob, top in zip(
            completion.tokens, completion.logprobs, completion.top_logprobs, strict=True
        ):
            assert len(top) == 5, "generate(top_logprobs=5) must give 5 entries per token"
            assert logprob <= max(top.values()), "a sampled token beats the top-1 log-prob"
            if token in top:
                assert top[token] == pytest.approx(logprob, abs=1e-6), (
                    "a sampled token's top-k log-prob must equal its reported log-prob"
                )


def test_sampled_logprobs_equal_the_engines_own_scoring(subject: Subject, sequences) -> None:
    engine = subject.engine()
    rollouts = engine.generate(sequences[:6], SamplingSpec(max_new_tokens=8, seed=3))
    scored = sampled_tail(engine.score([c.sequence for c in rollouts]), rollouts)
    measured = metrics(scored, [c.logprobs for c in rollouts])["abs_diff_max"]
    assert measured < 1e-4, f"generate()'s log-probs must equal score()'s: {measured}"


def test_a_stopped_rollout_keeps_its_stop_token_and_its_logprob(
    subject: Subject, sequences
) -> None:
    engine = subject.engine()
    # 16 stop ids: about one step in thirty ends a rollout, so 12 rollouts of 24 tokens mix
    # both endings (all alike about one run in 5,000)
    stops, budget = tuple(range(3, 384, 24)), 24
    spec = SamplingSpec(max_new_tokens=budget, seed=5, ignore_eos=False, stop_token_ids=stops)
    rollouts = engine.generate(sequences, spec)
    assert {c.finish_reason for c in rollouts} == {"stop", "length"}, (
        "generate() must report finish_reason 'stop' for a rollout a stop id ended, "
        "'length' for one that reached max_new_tokens"
    )
    ending = spec.stops_at(inspect_model(subject.model).eos_token_id)
    for c in rollouts:
        assert len(c.tokens) == len(c.logprobs) and not ending & set(c.tokens[:-1]), (
            "generate() must end a rollout at its first stop id, a log-prob per token"
        )
        assert c.tokens[-1] in ending if c.finish_reason == "stop" else len(c.tokens) == budget, (
            "a stopped rollout must keep its stop token (and its log-prob) as its last token"
        )
    scored = sampled_tail(engine.score([c.sequence for c in rollouts]), rollouts)
    measured = metrics(scored, [c.logprobs for c in rollouts])["abs_diff_max"]
    assert measured < 1e-4, f"a stop token's log-prob must equal score()'s: {measured}"


def test_a_seed_reproduces_the_rollouts(subject: Subject, sequences) -> None:
    engine = subject.engine()
    if not engine.info().get("seeded", True):
        pytest.skip(f"engine {engine.name!r} says its rollouts are not seed-reproducible")
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    first = engine.generate(sequences[:4], spec)
    again = engine.generate(sequences[:4], spec)
    same = "generate() with one seed must sample the same {} twice (or info()['seeded'] False)"
    assert [c.tokens for c in first] == [c.tokens for c in again], same.format("tokens")
    assert [c.logprobs for c in first] == [c.logprobs for c in again], same.format("log-probs")


def test_n_samples_per_prompt_are_prompt_major_distinct_and_seeded(
    subject: Subject, sequences
) -> None:
    engine = subject.engine()
    if not engine.capabilities.parallel_sampling:
        pytest.skip(
            f"engine {engine.name!r} does not declare capabilities.parallel_sampling "
            "(SamplingSpec.n)"
        )
    prompts, n = sequences[:3], 4
    spec = SamplingSpec(max_new_tokens=8, seed=13, n=n)
    children = engine.generate(prompts, spec)
    assert [c.prompt for c in children] == [p for p in prompts for _ in range(n)], (
        "generate() with n must return n completions per prompt, prompt-major, each with its prompt"
    )
    for group in range(len(prompts)):
        tokens = {tuple(c.tokens) for c in children[group * n : (group + 1) * n]}
        # 8 tokens of a random model at temperature 1: two equal children about 1e-16
        assert len(tokens) == n, "a request's n children must be distinct draws, not one repeated"
    scored = sampled_tail(engine.score([c.sequence for c in children]), children)
    measured = metrics(scored, [c.logprobs for c in children])["abs_diff_max"]
    assert measured < 1e-4, f"every child's log-probs must equal score()'s: {measured}"
    if engine.info().get("seeded", True):
        again = engine.generate(prompts, spec)
        assert [c.tokens for c in again] == [c.tokens for c in children], (
            "a seeded request with n samples must repeat all n"
        )


def test_mixed_requests_are_each_served_under_their_own_parameters(
    subject: Subject, sequences
) -> None:
    engine = subject.engine()
    stops = tuple(range(3, 384, 24))
    specs = [
        SamplingSpec(max_new_tokens=6, seed=21),
        SamplingSpec(max_new_tokens=3, temperature=0.7, top_k=20, seed=22),
        SamplingSpec(max_new_tokens=9, top_p=0.9, seed=23, ignore_eos=False, stop_token_ids=stops),
        SamplingSpec(max_new_tokens=4, temperature=1.3, seed=24),
    ]
    requests = [
        Request(prompt, spec, top_logprobs=5 * (i % 2))
        for i, (prompt, spec) in enumerate(zip(sequences, specs, strict=False))
    ]
    # the guard holds each answer to its request: its prompt, its own length and stop ids, a
    # log-prob per token, top log-probs exactly where asked
    served = engine.generate_requests(requests)
    for request, completion in zip(requests, served, strict=True):
        if request.top_logprobs:
            assert all(len(top) == 5 for top in completion.top_logprobs), (
                "generate_requests() must give a request asking top_logprobs=5 five per token"
            )
    scored = sampled_tail(engine.score([c.sequence for c in served]), served)
    measured = metrics(scored, [c.logprobs for c in served])["abs_diff_max"]
    assert measured < 1e-4, f"every request's log-probs must equal score()'s: {measured}"
    if engine.info().get("seeded", True):
        alone = [engine.generate_requests([r])[0].tokens for r in requests]
        assert alone == [c.tokens for c in served], (
            "a seeded request must sample the same tokens in a mixed batch as served alone"
        )


def test_load_weights_makes_the_engine_score_like_the_new_model(
    subject: Subject, tmp_path: Path, sequences
) -> None:
    from safetensors.torch import load_file

    engine = subject.engine()
    if type(engine.inner).load_weights is Engine.load_weights:
        pytest.skip(f"engine {engine.name!r} does not take new weights (no load_weights())")
    info = inspect_model(subject.model)
    other = tmp_path / "other"
    make_model(
        other,
        arch=info.arch,
        seed=1,
        vocab=info.vocab_size,
        layers=info.num_layers,
        hidden=info.hidden_size,
    )
    with closing(start("backend", "hf", BackendConfig(model=other))) as backend:
        try:
            before = engine.score(sequences)
            unless_unsupported(
                lambda: engine.load_weights(load_file(other / "model.safetensors")), "weight sync"
            )
            after = engine.score(sequences)
            expected = backend.recompute(sequences).logprobs
        finally:
            # the subject's engine goes on with its model for the checks after this one
            engine.load_weights(load_file(subject.model / "model.safetensors"))
    assert not violated("fp32", metrics(expected, after)), (
        "after load_weights() the engine must score like a model holding the new weights"
    )
    assert metrics(expected, before)["abs_diff_max"] > 1e-2


def test_info_names_the_engine_and_is_json(subject: Subject) -> None:
    engine = subject.engine()
    info = engine.info()
    assert info["engine"] == engine.name == type(engine.inner).name, (
        "info()['engine'] must be the engine's name"
    )
    assert (info["dtype"], info["logprobs"]) == ("float32", "raw"), (
        "info() must give the dtype and logprobs kind it runs (the base class's info() does)"
    )
    # it goes into report.json and the certificate's fingerprint as it is
    assert json.loads(json.dumps(info)) == info, "info() must be JSON as it is"
    artefacts = dict(engine.inner.artefacts())
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in artefacts.items()), (
        "artefacts() must map names to digests (strings)"
    )


def test_a_parallel_setting_is_an_option_the_engine_takes_and_reports(subject: Subject) -> None:
    engine_class = ENGINES.get(subject.name)
    setting = engine_class.capabilities.parallel
    if setting is None:
        pytest.skip(
            f"engine {subject.name!r} declares no parallel setting (capabilities.parallel None)"
        )
    # the harness sets it as an option, and reads its size back from info() for the fingerprint
    engine_class.check_options({setting.option: str(setting.default)})
    info = subject.engine().info()
    assert info.get("parallel", {}).get(setting.label) == setting.size(subject.options), (
        f"info()['parallel'] must give {setting.label} (the base class's info() does)"
    )


# -- precision controls -------------------------------------------------------------------------
def test_fp32_scores_are_within_the_fp32_profile_of_the_fp32_backend(
    subject: Subject, hf, sequences
) -> None:
    measured = metrics(hf.recompute(sequences).logprobs, subject.engine().score(sequences))
    assert not violated("fp32", measured), measured


def test_a_bf16_engine_fails_the_fp32_profile_and_passes_bf16(
    subject: Subject, hf, sequences
) -> None:
    engine = subject.engine(dtype="bfloat16")
    measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
    assert "abs_diff_max" in violated("fp32", measured), (
        f"an engine started in bfloat16 must compute in it: {measured}"
    )
    assert not violated("bf16", measured), measured


def test_sampled_logprobs_are_raw_at_any_temperature(subject: Subject, hf, sequences) -> None:
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=5)
    rollouts = subject.engine().generate(sequences[:6], spec)
    raw = sampled_tail(hf.recompute([c.sequence for c in rollouts]).logprobs, rollouts)
    assert not violated("fp32", metrics(raw, [c.logprobs for c in rollouts])), (
        "generate() must report raw log_softmax(logits) log-probs at any temperature and top-p"
    )


def test_processed_logprobs_carry_the_temperature_signature(
    subject: Subject, hf, sequences
) -> None:
    """processed = log_softmax(logits / T) at the sampled token, not log_softmax(logits)."""
    engine = subject.engine(logprobs=LogprobKind.PROCESSED)
    rollouts = engine.generate(
        sequences[:6], SamplingSpec(max_new_tokens=6, temperature=0.7, seed=5)
    )
    seqs = [c.sequence for c in rollouts]
    processed = [c.logprobs for c in rollouts]
    scaled = sampled_tail(hf.recompute(seqs, temperature=0.7).logprobs, rollouts)
    raw = sampled_tail(hf.recompute(seqs).logprobs, rollouts)
    to_scaled = metrics(scaled, processed)["abs_diff_max"]
    assert to_scaled < 1e-4, "processed log-probs must be log_softmax(logits / T)"
    # the bias a trainer would see if it took these for raw logprobs
    assert metrics(raw, processed)["abs_diff_mean"] > 100 * to_scaled


# -- the end of an engine: not the fp32 one the other checks use --------------------------------
def test_close_is_idempotent_and_the_guard_refuses_calls_after_it(
    subject: Subject, sequences
) -> None:
    # the bf16 engine the precision control started, else an fp32 engine of its own
    dtype, instance = "bfloat16", ""
    engine = subject.engine(dtype=dtype, skip=False)
    if engine is None:
        dtype, instance = "float32", "closed"
        engine = subject.engine(instance=instance)
    engine.close()
    engine.close()
    with pytest.raises(EngineCrashed, match="closed"):
        engine.score(sequences[:1])
    subject.forget(dtype=dtype, instance=instance)
