"""The RL tools' bookkeeping (tools/rl_reproduce.py, tools/rl_detector_record.py): every
experiment is a valid run; generated blocks are rewritten in place.

The tools are scripts in ``tools/``, not part of the installed package, so they are loaded
here by path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conformance.rl.loop import RunConfig

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str) -> ModuleType:
    """Import ``tools/<name>.py`` as module ``name`` (once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        assert spec is not None and spec.loader is not None, f"no tools/{name}.py"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up in sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


reproduce = load_tool("rl_reproduce")
record = load_tool("rl_detector_record")


def test_every_experiment_is_a_valid_run_with_its_own_folder(tmp_path):
    folders, by_name = set(), {}
    for study in reproduce.STUDIES:
        assert set(study.plotted) <= {e.name for e in study.experiments}
        assert set(study.columns) <= set(reproduce.FIGURES)
        for e in study.experiments:
            assert by_name.setdefault(e.name, e) == e  # a shared row is one configuration
            config = e.config(0)  # raises UsageError on a bad grid, before hours of runs
            assert config.steps == e.steps
            folders.add(reproduce.run_dir(tmp_path, e, 0))
    assert len(folders) == len({e.name for s in reproduce.STUDIES for e in s.experiments})


def test_every_calibration_case_is_a_valid_run_with_its_own_name():
    for case in record.cases(60):
        RunConfig(scenario=case.scenario, steps=60, **record.REGIMES[case.regime])
    names = [c.name for c in record.cases(60)]
    assert len(names) == len(set(names))


def test_spread_is_mean_and_range_over_seeds():
    assert reproduce.spread([1.0, 2.0, 3.0]) == "2 (1–3)"
    assert reproduce.spread([0.5]) == "0.5"
    assert reproduce.spread([float("nan")]) == "—"


def test_write_blocks_replaces_only_the_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- reproduce:a -->\nold\n<!-- /reproduce:a -->\nverdict stays\n")
    reproduce.write_blocks(doc, {"a": "| new |"})
    assert doc.read_text() == (
        "intro\n<!-- reproduce:a -->\n| new |\n<!-- /reproduce:a -->\nverdict stays\n"
    )
    with pytest.raises(SystemExit, match="reproduce:b"):
        reproduce.write_blocks(doc, {"b": "x"})
