"""The reproduction's bookkeeping: every experiment is a valid run; blocks rewritten in place."""

from __future__ import annotations

import pytest

from conformance.rl.calibrate import REGIMES, cases
from conformance.rl.loop import RunConfig
from conformance.rl.reproduce import FIGURES, STUDIES, run_dir, spread, write_blocks


def test_every_experiment_is_a_valid_run_with_its_own_folder(tmp_path):
    folders, by_name = set(), {}
    for study in STUDIES:
        assert set(study.plotted) <= {e.name for e in study.experiments}
        assert set(study.columns) <= set(FIGURES)
        for e in study.experiments:
            assert by_name.setdefault(e.name, e) == e  # a shared row is one configuration
            config = e.config(0)  # raises UsageError on a bad grid, before hours of runs
            assert config.steps == e.steps
            folders.add(run_dir(tmp_path, e, 0))
    assert len(folders) == len({e.name for s in STUDIES for e in s.experiments})


def test_every_calibration_case_is_a_valid_run_with_its_own_name():
    for case in cases(60):
        RunConfig(scenario=case.scenario, steps=60, **REGIMES[case.regime])
    names = [c.name for c in cases(60)]
    assert len(names) == len(set(names))


def test_spread_is_mean_and_range_over_seeds():
    assert spread([1.0, 2.0, 3.0]) == "2 (1–3)"
    assert spread([0.5]) == "0.5"
    assert spread([float("nan")]) == "—"


def test_write_blocks_replaces_only_the_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- reproduce:a -->\nold\n<!-- /reproduce:a -->\nverdict stays\n")
    write_blocks(doc, {"a": "| new |"})
    assert doc.read_text() == (
        "intro\n<!-- reproduce:a -->\n| new |\n<!-- /reproduce:a -->\nverdict stays\n"
    )
    with pytest.raises(SystemExit, match="reproduce:b"):
        write_blocks(doc, {"b": "x"})
