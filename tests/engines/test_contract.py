"""The engine contract: every engine — built-in, test support, or your own ``module:Class`` — runs
the same protocol checks and precision controls, against the real engine and the transformers
forward. A new engine gets all of them by adding one line to ``SUBJECTS``.

Engines are started through :class:`HarnessSession`, as the harness starts them (registry,
guard, timing), once per subject and configuration; a subject's engines are closed before the
next subject's start. An engine whose package is not installed skips with the reason.

Protocol: score and generate shapes and alignment, top-k logprobs, seeds where the engine says
it is seeded, ``load_weights`` where offered, ``info()``, ``close`` idempotent and calls after it
refused by the guard. Controls: fp32 scores within the fp32 profile of the fp32 backend, a bf16
engine outside it and within bf16's, raw logprobs at any temperature, processed logprobs
flagged by their temperature signature, a server equal to its in-process twin, a server killed
mid-run raising ``EngineCrashed`` and leaving nothing behind.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.engine_tests import needs
from support.server_processes import free_url, group_ends, port_open

from conformance.backends.base import BackendConfig
from conformance.engines import ENGINES, Engine, EngineConfig, LogprobKind, SamplingSpec
from conformance.engines._server_engine import ServerEngine
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.profiles import load_profile
from conformance.session import HarnessSession
from conformance.stack import StackSpec

#: the default model's EOS id
EOS = 1


@dataclass(frozen=True)
class Subject:
    """An engine under the contract."""

    engine: str
    #: the package it needs (also its pytest marker, ``-m vllm``): skipped where not installed
    needs: str | None = None
    #: the in-process engine whose numbers this server engine must reproduce exactly
    twin: str | None = None

    def param(self) -> Any:
        marks = needs(self.needs) if self.needs else []
        return pytest.param(self, marks=marks, id=self.engine.rpartition(":")[2])


SUBJECTS = [
    Subject("hf-generate"),
    Subject("support.doc_engine:MicroBatchedEngine"),
    Subject("vllm", needs="vllm"),
    Subject("vllm-server", needs="vllm", twin="vllm"),
    Subject("sglang", needs="sglang"),
    Subject("sglang-server", needs="sglang", twin="sglang"),
]


class Stack:
    """One subject's engines, started on first use through a harness session each."""

    def __init__(self, subject: Subject, model: Path) -> None:
        self.subject = subject
        self.model = model
        self._sessions: dict[tuple[str, str, LogprobKind], HarnessSession] = {}

    def engine(
        self, *, dtype: str = "float32", logprobs: LogprobKind = LogprobKind.RAW, twin: bool = False
    ) -> Any:
        name = self.subject.twin if twin else self.subject.engine
        assert name is not None
        key = (name, dtype, logprobs)
        if key not in self._sessions:
            spec = StackSpec(engine=name, model=self.model, engine_dtype=dtype, logprobs=logprobs)
            self._sessions[key] = HarnessSession(spec, seed=0, report_dir=None, command="")
        return self._sessions[key].engine

    def forget(self, **config: Any) -> None:
        """Close and drop an engine (a test that killed or closed it)."""
        key = (self.subject.engine, config.get("dtype", "float32"), LogprobKind.RAW)
        self._sessions.pop(key).close()

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


@pytest.fixture(scope="module", params=[subject.param() for subject in SUBJECTS])
def stack(request: pytest.FixtureRequest, default_model: Path) -> Iterator[Stack]:
    started = Stack(request.param, default_model)
    yield started
    started.close()


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 48))] for _ in range(12)]


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


def server_pid(engine: Any) -> int:
    pid = engine.info().get("pid")
    if pid is None:
        pytest.skip(f"engine {engine.name!r} runs no server the harness starts")
    return pid


# -- the twin first: SGLang on CPU does not honour seeds, so a server and its in-process twin
# sample alike only while both have drawn the same random numbers since they started ---------
def test_a_server_gives_exactly_its_in_process_twins_numbers(stack: Stack, sequences) -> None:
    if stack.subject.twin is None:
        pytest.skip(f"{stack.subject.engine} has no in-process twin")
    server, twin = stack.engine(), stack.engine(twin=True)
    assert server.score(sequences) == twin.score(sequences)
    for temperature in (1.0, 0.7):
        spec = SamplingSpec(max_new_tokens=6, temperature=temperature, seed=7)
        over_http = server.generate(sequences, spec, top_logprobs=2)
        local = twin.generate(sequences, spec, top_logprobs=2)
        assert [c.tokens for c in over_http] == [c.tokens for c in local]
        assert [c.logprobs for c in over_http] == [c.logprobs for c in local]
        assert [c.top_logprobs for c in over_http] == [c.top_logprobs for c in local]


# -- options, before anything starts ---------------------------------------------------------
def test_an_unknown_option_is_one_line_listing_the_valid_ones(stack: Stack) -> None:
    engine_class = ENGINES.get(stack.subject.engine)
    with pytest.raises(UsageError, match="valid options") as error:
        engine_class(EngineConfig(model=stack.model, options={"no_such_option": "1"}))
    assert "no_such_option" in str(error.value) and "\n" not in str(error.value)


def server_engine_class(stack: Stack) -> type[ServerEngine]:
    engine_class = ENGINES.get(stack.subject.engine)
    if not issubclass(engine_class, ServerEngine):
        pytest.skip(f"{stack.subject.engine} is not a server engine")
    return engine_class


def test_a_url_where_nothing_answers_is_one_line_naming_it(stack: Stack) -> None:
    engine_class = server_engine_class(stack)
    url = free_url()
    with pytest.raises(EngineUnavailable) as error:
        engine_class(EngineConfig(model=stack.model, options={"url": url}))
    assert url in str(error.value) and "\n" not in str(error.value)


def test_options_next_to_a_url_are_a_usage_error(stack: Stack) -> None:
    engine_class = server_engine_class(stack)
    knob, declared = next(iter(engine_class.KNOBS.items()))
    options = {"url": free_url(), knob: declared.values[0]}
    with pytest.raises(UsageError, match="cannot change a server you started"):
        engine_class(EngineConfig(model=stack.model, options=options))


def test_a_server_that_cannot_start_is_one_line_quoting_its_log(
    stack: Stack, tmp_path: Path
) -> None:
    engine_class = server_engine_class(stack)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    with pytest.raises(EngineUnavailable, match="exited with code") as error:
        engine_class(EngineConfig(model=broken))
    assert "\n" not in str(error.value)


# -- the protocol -------------------------------------------------------------------------------
def test_score_gives_n_minus_1_finite_logprobs_per_sequence(stack: Stack, sequences) -> None:
    rows = stack.engine().score(sequences)
    assert [len(row) for row in rows] == [len(s) - 1 for s in sequences]
    assert all(math.isfinite(lp) and lp <= 0 for row in rows for lp in row)


def test_generate_gives_one_aligned_completion_per_prompt_in_order(stack: Stack, sequences) -> None:
    prompts = sequences[:5]
    completions = stack.engine().generate(prompts, SamplingSpec(max_new_tokens=7, seed=1))
    assert [c.prompt for c in completions] == prompts
    for completion in completions:
        assert len(completion.tokens) == len(completion.logprobs) == 7
        assert all(0 <= t < 384 for t in completion.tokens)
        assert all(math.isfinite(lp) and lp <= 0 for lp in completion.logprobs)
        assert completion.finish_reason == "length" and completion.top_logprobs is None


def test_top_logprobs_rank_the_sampled_distribution(stack: Stack, sequences) -> None:
    rollouts = stack.engine().generate(
        sequences[:2], SamplingSpec(max_new_tokens=4, seed=2), top_logprobs=5
    )
    for completion in rollouts:
        assert completion.top_logprobs is not None
        for token, logprob, top in zip(
            completion.tokens, completion.logprobs, completion.top_logprobs, strict=True
        ):
            assert len(top) == 5
            assert logprob <= max(top.values())
            if token in top:
                assert top[token] == pytest.approx(logprob, abs=1e-6)


def test_sampled_logprobs_equal_the_engines_own_scoring(stack: Stack, sequences) -> None:
    engine = stack.engine()
    rollouts = engine.generate(sequences[:6], SamplingSpec(max_new_tokens=8, seed=3))
    scored = sampled_tail(engine.score([c.sequence for c in rollouts]), rollouts)
    assert metrics(scored, [c.logprobs for c in rollouts])["abs_diff_max"] < 1e-4


def test_a_stopped_rollout_keeps_its_stop_token_and_its_logprob(stack: Stack, sequences) -> None:
    engine = stack.engine()
    # 16 stop ids: about one step in thirty ends a rollout, so 12 rollouts of 24 tokens mix
    # both endings (all alike about one run in 5,000)
    stops, budget = tuple(range(3, 384, 24)), 24
    spec = SamplingSpec(max_new_tokens=budget, seed=5, ignore_eos=False, stop_token_ids=stops)
    rollouts = engine.generate(sequences, spec)
    assert {c.finish_reason for c in rollouts} == {"stop", "length"}
    ending = {*stops, EOS}
    for c in rollouts:
        assert len(c.tokens) == len(c.logprobs) and not ending & set(c.tokens[:-1])
        assert c.tokens[-1] in ending if c.finish_reason == "stop" else len(c.tokens) == budget
    scored = sampled_tail(engine.score([c.sequence for c in rollouts]), rollouts)
    assert metrics(scored, [c.logprobs for c in rollouts])["abs_diff_max"] < 1e-4


def test_a_seed_reproduces_the_rollouts(stack: Stack, sequences) -> None:
    engine = stack.engine()
    if not engine.info().get("seeded", True):
        pytest.skip(f"engine {engine.name!r} says its rollouts are not seed-reproducible")
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    first = engine.generate(sequences[:4], spec)
    again = engine.generate(sequences[:4], spec)
    assert [c.tokens for c in first] == [c.tokens for c in again]
    assert [c.logprobs for c in first] == [c.logprobs for c in again]


def test_load_weights_makes_the_engine_score_like_the_new_model(
    stack: Stack, default_model: Path, tmp_path: Path, sequences
) -> None:
    from safetensors.torch import load_file

    from conformance.backends.hf import HFBackend
    from conformance.models import inspect_model, make_model

    engine = stack.engine()
    if type(engine.inner).load_weights is Engine.load_weights:
        pytest.skip(f"engine {engine.name!r} does not take new weights")
    info = inspect_model(default_model)
    other = tmp_path / "other"
    make_model(
        other,
        arch=info.arch,
        seed=1,
        vocab=info.vocab_size,
        layers=info.num_layers,
        hidden=info.hidden_size,
    )
    backend = HFBackend(BackendConfig(model=other))
    try:
        before = engine.score(sequences)
        engine.load_weights(load_file(other / "model.safetensors"))
        after = engine.score(sequences)
        expected = backend.recompute(sequences).logprobs
    finally:
        # the subject's engine goes on with the default model for the tests after this one
        engine.load_weights(load_file(default_model / "model.safetensors"))
        backend.close()
    assert not violated("fp32", metrics(expected, after))
    assert metrics(expected, before)["abs_diff_max"] > 1e-2


def test_info_names_the_engine_and_is_json(stack: Stack) -> None:
    engine = stack.engine()
    info = engine.info()
    assert info["engine"] == engine.name == type(engine.inner).name
    assert (info["dtype"], info["logprobs"]) == ("float32", "raw")
    # it goes into report.json and the certificate's fingerprint as it is
    assert json.loads(json.dumps(info)) == info


# -- precision controls -------------------------------------------------------------------------
def test_fp32_scores_are_within_the_fp32_profile_of_the_fp32_backend(
    stack: Stack, hf, sequences
) -> None:
    measured = metrics(hf.recompute(sequences).logprobs, stack.engine().score(sequences))
    assert not violated("fp32", measured), measured


def test_a_bf16_engine_fails_the_fp32_profile_and_passes_bf16(stack: Stack, hf, sequences) -> None:
    engine = stack.engine(dtype="bfloat16")
    measured = metrics(hf.recompute(sequences).logprobs, engine.score(sequences))
    assert "abs_diff_max" in violated("fp32", measured), measured
    assert not violated("bf16", measured), measured


def test_sampled_logprobs_are_raw_at_any_temperature(stack: Stack, hf, sequences) -> None:
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=5)
    rollouts = stack.engine().generate(sequences[:6], spec)
    raw = sampled_tail(hf.recompute([c.sequence for c in rollouts]).logprobs, rollouts)
    assert not violated("fp32", metrics(raw, [c.logprobs for c in rollouts]))


def test_processed_logprobs_carry_the_temperature_signature(stack: Stack, hf, sequences) -> None:
    """processed = log_softmax(logits / T) at the sampled token, not log_softmax(logits)."""
    engine = stack.engine(logprobs=LogprobKind.PROCESSED)
    rollouts = engine.generate(
        sequences[:6], SamplingSpec(max_new_tokens=6, temperature=0.7, seed=5)
    )
    seqs = [c.sequence for c in rollouts]
    processed = [c.logprobs for c in rollouts]
    scaled = sampled_tail(hf.recompute(seqs, temperature=0.7).logprobs, rollouts)
    raw = sampled_tail(hf.recompute(seqs).logprobs, rollouts)
    to_scaled = metrics(scaled, processed)["abs_diff_max"]
    assert to_scaled < 1e-4
    # the bias a trainer would see if it took these for raw logprobs
    assert metrics(raw, processed)["abs_diff_mean"] > 100 * to_scaled


# -- the end of an engine: last, as they close the subject's engines ----------------------------
def test_close_is_idempotent_and_the_guard_refuses_calls_after_it(stack: Stack, sequences) -> None:
    engine = stack.engine(dtype="bfloat16")
    engine.close()
    engine.close()
    with pytest.raises(EngineCrashed, match="closed"):
        engine.score(sequences[:1])
    stack.forget(dtype="bfloat16")


def test_attaching_to_a_running_server_gives_its_numbers(stack: Stack, sequences) -> None:
    engine_class = server_engine_class(stack)
    server = stack.engine()
    attached = engine_class(EngineConfig(model=Path("unused"), options={"url": server.url}))
    try:
        assert attached.score(sequences) == server.score(sequences)
        assert attached.info()["attached"] is True
        assert attached.knobs() == {}
    finally:
        attached.close()
    # closing an attached engine leaves the user's server running
    assert port_open(server.url)


def test_a_server_killed_mid_run_is_engine_crashed_and_leaves_nothing(
    stack: Stack, sequences
) -> None:
    """Kills only the server's leader: its children stay behind until the engine is closed,
    which must stop the whole process group."""
    engine = stack.engine()
    pid, url = server_pid(engine), engine.url
    assert len(engine.score(sequences)) == len(sequences)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineCrashed, match="exited with code -9"):
        engine.score(sequences)
    with pytest.raises(EngineCrashed, match="dead"):
        engine.score(sequences)
    stack.forget()
    assert group_ends(pid), f"processes of the server's group {pid} outlived its engine"
    assert not port_open(url)
    assert not Path(f"/proc/{pid}").exists(), f"server {pid} was never reaped"
