"""Tensor parallelism as an engine option: the declaration the suites read, the CPU thread
binding the harness sets for vLLM's workers, and the one-line errors — no engine started."""

from __future__ import annotations

import os

import pytest

from conformance.engines import ENGINES, EngineConfig
from conformance.engines import _vllm_common as vllm_common
from conformance.errors import UsageError

CORES = sorted(os.sched_getaffinity(0))


def test_vllm_engines_declare_tensor_parallelism():
    # importing the adapters does not import vLLM
    from conformance.engines.vllm import VLLMEngine
    from conformance.engines.vllm_server import VLLMServerEngine

    for cls in (VLLMEngine, VLLMServerEngine):
        setting = cls.capabilities.parallel
        assert setting.option == "tensor_parallel_size"
        assert setting.label == "tp_size"
        assert setting.size({"tensor_parallel_size": "2"}) == 2
        assert setting.size({}) == 1


def test_sglang_on_cpu_refuses_tensor_parallelism_in_one_line():
    from conformance.engines import _sglang_common as sglang_common

    assert sglang_common.PARALLEL.option == "tp_size"
    assert sglang_common.parse_options("sglang", {"tp_size": "1"}, extra={}) == {"tp_size": 1}
    with pytest.raises(UsageError) as caught:
        sglang_common.parse_options("sglang", {"device": "cpu", "tp_size": "2"}, extra={})
    message = str(caught.value)
    assert "tp_size=2" in message and "NCCL" in message and "\n" not in message


def test_engines_without_a_parallel_setting_declare_none():
    assert ENGINES.get("hf-generate").capabilities.parallel is None


@pytest.mark.parametrize("size", range(1, len(CORES) + 1))
def test_thread_binding_gives_each_worker_its_own_cores(size):
    groups = [g.split(",") for g in vllm_common.cpu_threads_bind(size).split("|")]
    assert len(groups) == size
    flat = [int(c) for g in groups for c in g]
    assert len(flat) == len(set(flat)) and set(flat) <= set(CORES)
    assert len({len(g) for g in groups}) == 1


def test_binding_is_set_only_above_size_one(tmp_path):
    one = vllm_common.environment(str(tmp_path), enforce_eager=True, tensor_parallel_size=1)
    two = vllm_common.environment(str(tmp_path), enforce_eager=True, tensor_parallel_size=2)
    assert vllm_common.THREADS_BIND not in one
    if len(CORES) >= 2:
        assert two[vllm_common.THREADS_BIND] == vllm_common.cpu_threads_bind(2)


def test_the_users_binding_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_common, "_USER_THREADS_BIND", "0-3|4-7")
    env = vllm_common.environment(str(tmp_path), enforce_eager=True, tensor_parallel_size=2)
    assert env[vllm_common.THREADS_BIND] == "0-3|4-7"


def test_more_workers_than_cores_is_one_line_before_anything_starts():
    from conformance.engines.vllm import VLLMEngine

    with pytest.raises(UsageError) as caught:
        VLLMEngine.check_options({"tensor_parallel_size": str(len(CORES) + 1)})
    message = str(caught.value)
    assert "tensor_parallel_size" in message and "fix:" in message and "\n" not in message


@pytest.mark.parametrize("value", ["0", "two"])
def test_a_bad_size_is_one_line(default_model, value):
    from conformance.engines.vllm_server import VLLMServerEngine

    with pytest.raises(UsageError, match="tensor_parallel_size"):
        VLLMServerEngine(EngineConfig(model=default_model, options={"tensor_parallel_size": value}))
