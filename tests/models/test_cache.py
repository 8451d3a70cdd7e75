"""default_model / cached_model: built once into the cache, reused, safe against a racing build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.errors import ModelError
from conformance.models import cache, default_model, inspect_model
from conformance.models.cache import DEFAULT_MODEL, cached_model


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """Folders the (real) make_model is asked to build, with the cache under tmp_path."""
    monkeypatch.setenv("TIM_CONFORMANCE_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []
    real = cache.make_model

    def counting(out_dir: Path, **arguments: object) -> object:
        calls.append(out_dir)
        return real(out_dir, **arguments)

    monkeypatch.setattr(cache, "make_model", counting)
    return calls


def test_default_model_is_built_once_then_reused(builds: list[Path], tmp_path: Path) -> None:
    first = default_model()
    assert first.parent == tmp_path / "cache" / "models"
    weights = (first / "model.safetensors").stat().st_mtime_ns
    assert default_model() == first
    assert len(builds) == 1
    assert (first / "model.safetensors").stat().st_mtime_ns == weights
    info = inspect_model(first)
    assert (info.arch, info.vocab_size, info.hidden_size) == ("qwen2", 384, 64)
    # only the finished folder is left: the temporary build folder was renamed into place
    assert [p.name for p in first.parent.iterdir()] == [first.name]


def test_a_build_that_loses_the_race_uses_the_winners_folder(
    builds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real: Callable[..., object] = cache.make_model

    def rival_finishes_first(out_dir: Path, **arguments: object) -> object:
        monkeypatch.setattr(cache, "make_model", real)
        winner = cached_model(**DEFAULT_MODEL)
        (winner / "winner").touch()
        return real(out_dir, **arguments)

    monkeypatch.setattr(cache, "make_model", rival_finishes_first)
    path = default_model()
    assert (path / "winner").exists()
    assert len(builds) == 2
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    inspect_model(path)


def test_other_arguments_get_their_own_folder(builds: list[Path]) -> None:
    other = cached_model(**{**DEFAULT_MODEL, "seed": 1})
    assert other != default_model()
    assert len(builds) == 2


def test_an_unwritable_cache_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TIM_CONFORMANCE_CACHE", str(blocker))
    with pytest.raises(ModelError, match="TIM_CONFORMANCE_CACHE"):
        default_model()


def test_cache_root_defaults_to_the_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIM_CONFORMANCE_CACHE", raising=False)
    assert cache.cache_root() == Path.home() / ".cache" / "tim-conformance"
