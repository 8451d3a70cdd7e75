"""A started stack's fingerprint: what report.json records of it and a certificate pins down
(the spec's engine, backend, dtypes and logprobs kind, the model, what the engine and backend
said of themselves, the host's versions and device, the numerics environment), and its hash."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conformance.host import device_info, package_versions

if TYPE_CHECKING:
    from conformance.models import ModelInfo
    from conformance.stack import StackSpec

#: environment variables that change numerics (or which kernels run), recorded in fingerprints
NUMERICS_ENV_PREFIXES = (
    "VLLM_",
    "SGLANG_",
    "TORCH",
    "PYTORCH_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_TF32",
    "OMP_NUM_THREADS",
    "MKL_",
    "ONEDNN_",
    "DNNL_",
    "FLASH_ATTENTION",
    # which CPU kernels ATen dispatches to, OpenMP's and OpenBLAS's threads, NCCL's reduction
    # algorithm, SGLang's kernel switches and Triton's fp32 dot precision
    "ATEN_CPU_CAPABILITY",
    "KMP_",
    "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "SGL_",
    "TRITON_F32_DEFAULT",
)
#: endings of those variables that only say where something lives: torch sets
#: TORCHINDUCTOR_CACHE_DIR itself, to a folder named after the user, once inductor loads; the vLLM
#: adapter points VLLM_RPC_BASE_PATH at a temporary folder of each engine's
_LOCATIONS = ("_CACHE_DIR", "_CACHE_ROOT", "_BASE_PATH")
#: those an engine sets afresh at every start, naming that start, not its numerics: vLLM's
#: distributed-init and shared-memory names, SGLang's run id (the time and a random number)
_START_NAMES = frozenset(
    {"VLLM_DIST_IDENT", "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME", "SGLANG_RUN_ID"}
)
#: engine- and backend-info fields that differ between two runs of the same stack (a server's
#: port and pid, the rank processes' pids)
VOLATILE_INFO = frozenset({"url", "port", "pid", "pids"})


def numerics_env() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(NUMERICS_ENV_PREFIXES)
        and not k.endswith(_LOCATIONS)
        and k not in _START_NAMES
    }


def parallelism(engine_info: dict[str, Any], backend_info: dict[str, Any]) -> dict[str, Any]:
    """How the stack splits its models, from each component's ``parallel`` info: the size of its
    declared parallel setting under its label (the engine's ``tp_size``, the backend's
    ``world_size``) and, for a sharded backend, its process group and mixed-precision policy. A
    component that declares no parallel setting runs in one piece and adds nothing."""
    return {**engine_info.get("parallel", {}), **backend_info.get("parallel", {})}


def fingerprint(
    spec: StackSpec,
    model_info: ModelInfo,
    engine_info: dict[str, Any],
    backend_info: dict[str, Any],
) -> dict[str, Any]:
    """The stack as recorded in report.json; ``fingerprint`` hashes all of it but the path."""
    stack = {
        "engine": spec.engine,
        "backend": spec.backend,
        "engine_dtype": spec.engine_dtype,
        "backend_dtype": spec.backend_dtype,
        "logprobs": spec.logprobs.value,
        "model": {
            "path": str(model_info.path),
            "sha256": model_info.sha256,
            "arch": model_info.arch,
            "vocab_size": model_info.vocab_size,
        },
        "parallelism": parallelism(engine_info, backend_info),
        "engine_info": engine_info,
        "backend_info": backend_info,
        "versions": package_versions(),
        "device": device_info(),
        "env": numerics_env(),
        "python_executable": sys.executable,
    }
    return {"fingerprint": stack_fingerprint(stack), **stack}


def stack_fingerprint(stack: Mapping[str, Any]) -> str:
    """The hash of a recorded stack (report.json's, or a certificate's without its volatile
    fields) over all of it but where it runs from: the Python executable, the model's path and
    the info fields that differ between runs (``VOLATILE_INFO``). ``tim-conformance check``
    recomputes a certificate's fingerprint with it, so an edited stack or fingerprint shows."""
    hashed = {k: v for k, v in stack.items() if k not in ("fingerprint", "python_executable")}
    hashed["model"] = {k: v for k, v in stack["model"].items() if k != "path"}
    for key in ("engine_info", "backend_info"):
        hashed[key] = {k: v for k, v in stack[key].items() if k not in VOLATILE_INFO}
    canonical = json.dumps(hashed, sort_keys=True, default=str).encode()
    return hashlib.sha256(canonical).hexdigest()
