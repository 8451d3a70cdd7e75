"""Precision names as users type them, and the formats an engine's KV cache may hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.errors import UsageError

if TYPE_CHECKING:
    import torch

#: canonical name → accepted spellings
_ALIASES = {
    "float32": ("float32", "fp32", "f32"),
    "bfloat16": ("bfloat16", "bf16"),
    "float16": ("float16", "fp16", "half", "f16"),
}
DTYPE_NAMES = tuple(_ALIASES)


def dtype_spellings() -> list[str]:
    """Each precision with its other accepted spellings, as ``--help`` and a refusal list them.

    >>> dtype_spellings()[1]
    'bfloat16 (bf16)'
    """
    return [f"{name} ({', '.join(spellings[1:])})" for name, spellings in _ALIASES.items()]


def canonical_dtype(name: str) -> str:
    """Return ``float32``, ``bfloat16`` or ``float16`` for any accepted spelling."""
    lowered = name.strip().lower()
    for canonical, spellings in _ALIASES.items():
        if lowered in spellings:
            return canonical
    raise UsageError(f"unknown dtype {name!r}", f"use one of: {', '.join(dtype_spellings())}")


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, canonical_dtype(name))


#: the formats an engine's KV cache may hold keys and values in (vLLM's ``kv_cache_dtype``
#: names) → the name of torch's dtype of that format (``conformance.floor.KV_CACHE_FORMATS``
#: holds the dtypes; named here so that what takes a format needs no torch)
KV_FORMATS = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}

#: an engine's ``kv_cache_dtype`` option value (vLLM's and SGLang's spelling) → the format its
#: cache holds (a :data:`KV_FORMATS` name; ``fp8`` is e4m3 on both); ``auto`` and the rest keep
#: the model's precision
ENGINE_KV_FORMATS = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def engine_kv_format(option: object) -> str | None:
    """The format an engine's ``kv_cache_dtype`` option value stores its cache in; None where
    it keeps the model's precision.

    >>> engine_kv_format("fp8"), engine_kv_format("auto"), engine_kv_format(None)
    ('fp8_e4m3', None, None)
    """
    return ENGINE_KV_FORMATS.get(str(option)) if option is not None else None
