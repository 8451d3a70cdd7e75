"""The embedded default model: built on first use into a cache folder, reused afterwards."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from conformance.env import CACHE
from conformance.errors import ModelError
from conformance.models.build import make_model

#: bump when the recipe (init, tokenizer corpus, config) changes, so caches rebuild
FORMAT_VERSION = 2
#: the model every run uses when no --model is given
DEFAULT_MODEL = {"arch": "qwen2", "seed": 0, "vocab": 384, "layers": 2, "hidden": 64}
#: the models the harness ships, built on first use: ``--model embedded:NAME`` names one
EMBEDDED_MODELS = {
    "default": DEFAULT_MODEL,
    # 4 experts, top 2 (make-model's qwen3-moe recipe): routes flip between bf16 and fp32
    "moe": {"arch": "qwen3-moe", "seed": 0, "vocab": 384, "layers": 2, "hidden": 64},
}
EMBEDDED_PREFIX = "embedded:"


def cache_root() -> Path:
    """``$TIM_CONFORMANCE_CACHE``, else ``~/.cache/tim-conformance``."""
    configured = CACHE.get()
    return Path(configured) if configured else Path.home() / ".cache" / "tim-conformance"


def default_model() -> Path:
    """Folder of the default model (``DEFAULT_MODEL``), built on first use."""
    return cached_model(**DEFAULT_MODEL)


def model_folder(text: str) -> Path:
    """The folder a ``--model`` value names: ``embedded:NAME`` for a shipped model (built on
    first use), else a path, made absolute: the stack a report and its certificate record names
    the same folder from wherever it is read (``tim-conformance check``, a replay)."""
    if not text.startswith(EMBEDDED_PREFIX):
        return Path(text).expanduser().absolute()
    name = text.removeprefix(EMBEDDED_PREFIX)
    if name not in EMBEDDED_MODELS:
        raise ModelError(
            f"unknown embedded model {name!r}",
            f"use one of: {', '.join(EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS)}, or a folder",
        )
    return cached_model(**EMBEDDED_MODELS[name])


def cached_model(*, arch: str, seed: int, vocab: int, layers: int, hidden: int) -> Path:
    """Folder of the ``make_model`` model with these arguments, built on first use.

    The model is built in a private temporary folder and renamed into place, so a folder under
    its final name is always complete, and two processes building at once both end up with it.
    """
    name = f"{arch}-v{vocab}-l{layers}-h{hidden}-s{seed}-r{FORMAT_VERSION}"
    final = cache_root() / "models" / name
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as exc:
        raise ModelError(
            f"cannot write the model cache {final.parent}: {exc.strerror}",
            f"set {CACHE.name} to a writable folder",
        ) from None
    try:
        make_model(building, arch=arch, seed=seed, vocab=vocab, layers=layers, hidden=hidden)
        building.rename(final)
    except OSError:
        # another process renamed its complete build into place first
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final
