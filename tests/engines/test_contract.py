"""The engine contract over the project's engines: every built-in engine, the test-support
engines and the documentation's examples run the checks of :mod:`conformance.contract.checks`
(what ``tim-conformance contract --engine E`` runs on one engine), and the server engines run
the server checks below: a server equal to its in-process twin, a URL where nothing answers,
options next to a URL, a server that cannot start, attaching, and a server killed mid-run
raising ``EngineCrashed`` and leaving nothing behind. An engine whose package is not installed
skips with the reason; one that declares a capability unsupported skips that check with its own.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.engine_tests import needs, over_budget, started
from support.server_processes import free_url, group_ends, port_open

from conformance.contract.checks import Subject
from conformance.engines import ENGINES, EngineConfig, Request, SamplingSpec
from conformance.engines._server_engine import ServerEngine
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError


@dataclass(frozen=True)
class Case:
    """An engine under the contract."""

    engine: str
    #: the package it needs (also its pytest marker, ``-m vllm``): skipped where not installed
    needs: str | None = None
    #: the in-process engine whose numbers this server engine must reproduce exactly
    twin: str | None = None

    def param(self) -> Any:
        marks = needs(self.needs) if self.needs else []
        return pytest.param(self, marks=marks, id=self.engine.rpartition(":")[2])


CASES = [
    Case("hf-generate"),
    Case("support.doc_engine:LoopEngine"),
    Case("support.doc_engine:MicroBatchedEngine"),
    Case("vllm", needs="vllm"),
    Case("vllm-server", needs="vllm", twin="vllm"),
    Case("sglang", needs="sglang"),
    Case("sglang-server", needs="sglang", twin="sglang"),
]


@pytest.fixture(scope="module", params=[case.param() for case in CASES])
def subject(request: pytest.FixtureRequest, default_model: Path) -> Iterator[Subject]:
    started = Subject(request.param.engine, default_model, twin=request.param.twin)
    yield started
    started.close()


def server_pid(engine: Any) -> int:
    pid = engine.info().get("pid")
    if pid is None:
        pytest.skip(f"engine {engine.name!r} runs no server the harness starts")
    return pid


# -- the twin first: SGLang on CPU does not honour seeds, so a server and its in-process twin
# sample alike only while both have drawn the same random numbers since they started ---------
def test_a_server_gives_exactly_its_in_process_twins_numbers(subject: Subject, sequences) -> None:
    if subject.twin is None:
        pytest.skip(f"{subject.name} has no in-process twin")
    server, twin = subject.engine(), subject.engine(twin=True)
    assert server.score(sequences) == twin.score(sequences)
    for temperature in (1.0, 0.7):
        spec = SamplingSpec(max_new_tokens=6, temperature=temperature, seed=7)
        over_http = server.generate(sequences, spec, top_logprobs=2)
        local = twin.generate(sequences, spec, top_logprobs=2)
        assert [c.tokens for c in over_http] == [c.tokens for c in local]
        assert [c.logprobs for c in over_http] == [c.logprobs for c in local]
        assert [c.top_logprobs for c in over_http] == [c.top_logprobs for c in local]


def test_a_servers_requests_in_flight_give_its_twins_mixed_batch(
    subject: Subject, sequences
) -> None:
    """The server gets a mixed batch as requests in flight at once, its twin as one batch of
    per-request parameters: a seeded request's rollout is the same either way."""
    if subject.twin is None:
        pytest.skip(f"{subject.name} has no in-process twin")
    server, twin = subject.engine(), subject.engine(twin=True)
    if not server.info().get("seeded", True):
        pytest.skip(f"engine {server.name!r} does not honour seeds: concurrency decides its draws")
    requests = [
        Request(prompt, SamplingSpec(max_new_tokens=4 + i, top_k=20 * (i % 2), seed=30 + i), i % 3)
        for i, prompt in enumerate(sequences[:8])
    ]
    over_http, local = server.generate_requests(requests), twin.generate_requests(requests)
    assert [c.tokens for c in over_http] == [c.tokens for c in local]
    assert [c.logprobs for c in over_http] == [c.logprobs for c in local]
    assert [c.top_logprobs for c in over_http] == [c.top_logprobs for c in local]


# -- the contract's checks, after the twin (they draw random numbers on the subject's engines) --
from conformance.contract.checks import *  # noqa: E402, F403


# -- options, before anything starts ---------------------------------------------------------
def server_engine_class(subject: Subject) -> type[ServerEngine]:
    engine_class = ENGINES.get(subject.name)
    if not issubclass(engine_class, ServerEngine):
        pytest.skip(f"{subject.name} is not a server engine")
    return engine_class


def test_a_url_where_nothing_answers_is_one_line_naming_it(subject: Subject) -> None:
    engine_class = server_engine_class(subject)
    url = free_url()
    with pytest.raises(EngineUnavailable) as error:
        engine_class(EngineConfig(model=subject.model, options={"url": url}))
    assert url in str(error.value) and "\n" not in str(error.value)


def test_options_next_to_a_url_are_a_usage_error(subject: Subject) -> None:
    engine_class = server_engine_class(subject)
    knob, declared = next(iter(engine_class.capabilities.knobs.items()))
    options = {"url": free_url(), knob: declared.values[0]}
    with pytest.raises(UsageError, match="cannot change a server you started"):
        engine_class(EngineConfig(model=subject.model, options=options))


def test_a_server_that_cannot_start_is_one_line_quoting_its_log(
    subject: Subject, tmp_path: Path
) -> None:
    engine_class = server_engine_class(subject)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    with pytest.raises(EngineUnavailable, match="exited with code") as error:
        engine_class(EngineConfig(model=broken))
    assert "\n" not in str(error.value)


def test_a_kv_budget_makes_a_started_server_preempt_and_counts_it_over_http(
    subject: Subject,
) -> None:
    """The in-process engine's budget (``kv_budget_option`` and what it requires) on a server
    the harness starts: a batch needing 3.75 budgets is preempted or retracted, as the server
    reports (vLLM's ``/metrics``, SGLang's replies); the subject's server, with room, is not."""
    engine_class = server_engine_class(subject)
    declared = engine_class.capabilities
    assert declared.kv_budget_option is not None
    assert over_budget(subject.engine()) == 0
    options = {**declared.kv_budget_requires, declared.kv_budget_option: "256"}
    with started(subject.name, subject.model, options=options) as budgeted:
        assert over_budget(budgeted) > 0


# -- the end of a server: last, as it kills the subject's engine ----------------------------------
def test_attaching_to_a_running_server_gives_its_numbers(subject: Subject, sequences) -> None:
    engine_class = server_engine_class(subject)
    server = subject.engine()
    attached = engine_class(EngineConfig(model=Path("unused"), options={"url": server.url}))
    try:
        assert attached.score(sequences) == server.score(sequences)
        assert attached.info()["attached"] is True
        assert attached.knobs() == {}
        # its KV memory is its owner's: the preemption suite cannot bound it
        assert attached.capabilities.kv_budget_option is None
        # and it is split as its owner chose: no parallel setting the harness could vary
        assert attached.capabilities.parallel is None
    finally:
        attached.close()
    # closing an attached engine leaves the user's server running
    assert port_open(server.url)


def test_a_server_killed_mid_run_is_engine_crashed_and_leaves_nothing(
    subject: Subject, sequences
) -> None:
    """Kills only the server's leader: its children stay behind until the engine is closed,
    which must stop the whole process group."""
    engine = subject.engine()
    pid, url = server_pid(engine), engine.url
    assert len(engine.score(sequences)) == len(sequences)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineCrashed, match="exited with code -9"):
        engine.score(sequences)
    with pytest.raises(EngineCrashed, match="dead"):
        engine.score(sequences)
    subject.forget()
    assert group_ends(pid), f"processes of the server's group {pid} outlived its engine"
    assert not port_open(url)
    assert not Path(f"/proc/{pid}").exists(), f"server {pid} was never reaped"
