"""The layer contract covers the whole package: a module left out of every layer is held to no
order at all, so a new module must be placed in one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import conformance

REPO = Path(__file__).resolve().parents[2]


def _layered() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = (c["layers"] for c in config["contracts"] if c["type"] == "layers")
    return [name.strip() for layer in layers for name in layer.split(":")]


def test_every_module_of_the_package_sits_in_one_layer() -> None:
    package = Path(conformance.__file__).parent
    modules = {
        f"conformance.{path.stem if path.is_file() else path.name}"
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem not in {"__init__", "__main__"})
        or (path.is_dir() and (path / "__init__.py").is_file())
    }
    layered = _layered()
    assert sorted(modules - set(layered)) == []
    assert len(layered) == len(set(layered)), "a module sits in two layers"
