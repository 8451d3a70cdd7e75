"""The embedded default model: built on first use into a cache folder, reused afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from conformance.errors import ModelError
from conformance.models.build import make_model

#: bump when the recipe (init, tokenizer corpus, config) changes, so caches rebuild
FORMAT_VERSION = 2
#: the model every run uses when no --model is given
DEFAULT_MODEL = {"arch": "qwen2", "seed": 0, "vocab": 384, "layers": 2, "hidden": 64}


def cache_root() -> Path:
    """``$TIM_CONFORMANCE_CACHE``, else ``~/.cache/tim-conformance``."""
    configured = os.environ.get("TIM_CONFORMANCE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tim-conformance"


def default_model() -> Path:
    """Folder of the default model (``DEFAULT_MODEL``), built on first use."""
    return cached_model(**DEFAULT_MODEL)


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
            "set TIM_CONFORMANCE_CACHE to a writable folder",
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
