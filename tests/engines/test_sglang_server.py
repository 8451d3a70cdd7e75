"""The ``sglang-server`` engine against a real SGLang server (tox -e sglang): the same numbers as
the in-process engine, and the server never outlives the engine, even when a test body fails
or the server dies mid-run.

A server start takes one to two minutes on two busy cores: the module starts one server and
one in-process engine, and its last test kills that server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_processes import free_url, group_ends, live_group_members, port_open

from conformance.engines import EngineConfig, SamplingSpec
from conformance.errors import EngineCrashed, EngineUnavailable, UsageError

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="sglang is not installed (run tox -e sglang, or pip install 'sglang==0.5.23')",
)


def server_engine(model: Path, **options: str):
    from conformance.engines.sglang_server import SGLangServerEngine

    return SGLangServerEngine(EngineConfig(model=model, options=options))


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
    from conformance.engines.sglang import SGLangEngine

    engine = SGLangEngine(EngineConfig(model=default_model))
    yield engine
    engine.close()


def test_a_url_that_does_not_answer_is_one_line_naming_it(default_model: Path) -> None:
    url = free_url()
    with pytest.raises(EngineUnavailable) as error:
        server_engine(default_model, url=url)
    assert url in str(error.value)
    assert "\n" not in str(error.value)


def test_options_next_to_a_url_are_a_usage_error(default_model: Path) -> None:
    with pytest.raises(UsageError, match="max_total_tokens"):
        server_engine(default_model, url=free_url(), max_total_tokens="512")


def test_unknown_option_is_a_usage_error_listing_the_valid_ones(default_model: Path) -> None:
    with pytest.raises(UsageError, match="url"):
        server_engine(default_model, port="8000")


@pytest.mark.sglang
@needs_sglang
def test_a_server_that_cannot_start_is_engine_unavailable_with_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    with pytest.raises(EngineUnavailable, match="exited with code") as error:
        server_engine(broken)
    assert "\n" not in str(error.value)


@pytest.mark.sglang
@needs_sglang
def test_server_and_in_process_engine_score_identically(server, in_process, sequences) -> None:
    assert server.score(sequences) == in_process.score(sequences)


@pytest.mark.sglang
@needs_sglang
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


@pytest.mark.sglang
@needs_sglang
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


@pytest.mark.sglang
@needs_sglang
def test_a_server_dying_mid_run_raises_engine_crashed_and_nothing_is_left(
    server, sequences
) -> None:
    """Runs last in this module: it kills the module's server (a start costs minutes).

    Only the leader is killed; its scheduler child stays behind until the failing body's
    ``with`` exit closes the engine, which must stop the whole group.
    """
    process = server._server.process
    url = server.url
    assert server.info()["knobs"]["max_total_tokens"] == 2048
    assert len(live_group_members(process.pid)) >= 2
    with pytest.raises(EngineCrashed, match="exited with code"), server as engine:
        assert len(engine.score(sequences)) == len(sequences)
        os.kill(process.pid, signal.SIGKILL)
        engine.score(sequences)
    assert process.returncode == -signal.SIGKILL
    assert group_ends(process.pid)
    assert not port_open(url)
    with pytest.raises(EngineCrashed, match="closed"):
        server.score(sequences)
