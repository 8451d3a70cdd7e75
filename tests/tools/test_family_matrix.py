"""The family matrix's bookkeeping (tools/family_matrix.py): what a cell records from a run, a
finished cell read instead of rerun, the table and its lines for cells that did not pass."""

from __future__ import annotations

import json

from test_rl_tools import load_tool

matrix = load_tool("family_matrix")


def failing_check() -> dict:
    """A failing check as report.json holds it: a bound of 0.01 on abs_diff_max, the sampled
    tokens' |Δ| 0, 0.02 (position 70), 0.5 (position 90), 0.005 (position 3)."""
    return {
        "name": "test_prefill_parity",
        "status": "fail",
        "message": "abs_diff_max 0.5 > 0.01\nmore",
        "thresholds": {"abs_diff_max": 0.01},
        "violations": [
            {"metric": "abs_diff_mean", "value": 0.1, "threshold": 0.001, "bound": "max"},
            {"metric": "abs_diff_max", "value": 0.5, "threshold": 0.01, "bound": "max"},
        ],
        "samples": {
            "lp_train": [-1.0, -2.0, -3.0, -4.0],
            "lp_infer": [-1.0, -2.02, -3.5, -4.005],
            "position": [10, 70, 90, 3],
        },
    }


def test_a_failing_check_names_its_largest_token_breach_and_where_the_tokens_left_the_bound():
    found = matrix.failure(failing_check())
    assert found.breach == "abs_diff_max: 0.5 > 0.01"
    assert (found.first_position, found.max_position) == (70, 90)
    assert abs(found.max_diff - 0.5) < 1e-12


def test_a_check_that_errored_names_its_message_first_line():
    check = {**failing_check(), "status": "error", "violations": [], "samples": None}
    found = matrix.failure(check)
    assert (found.breach, found.first_position, found.max_position) == (
        "abs_diff_max 0.5 > 0.01",
        None,
        None,
    )


def test_a_run_that_wrote_no_report_is_incomplete_with_its_last_line(tmp_path):
    (tmp_path / "certify.log").write_text("$ certify ...\nengine refused: head size 16\n\n")
    cell = matrix.read_cell("gemma2", "vllm", "float32", 2, 3.0, tmp_path)
    assert (cell.verdict, cell.reason, cell.report) == (
        "incomplete",
        "engine refused: head size 16",
        None,
    )


def test_a_run_killed_midway_is_incomplete_with_its_last_exception_line(tmp_path):
    log = "Traceback (most recent call last):\nRuntimeError: scheduler died\nKilled\n"
    (tmp_path / "certify.log").write_text(log)
    cell = matrix.read_cell("bamba", "sglang", "bfloat16", -9, 3.0, tmp_path)
    assert cell.reason == (
        "killed by signal 9 before writing a report; last line: RuntimeError: scheduler died"
    )


def test_a_finished_cell_is_read_not_rerun(tmp_path):
    run = tmp_path / "runs" / "cohere-vllm-float32"
    run.mkdir(parents=True)
    (run / "cell.json").write_text(json.dumps({"rc": 2, "seconds": 90.0}))
    (run / "certify.log").write_text("engine refused: no CohereForCausalLM\n")
    # an interpreter that cannot run: a rerun would record its failed start instead
    again = matrix.run_cell("cohere", "vllm", "float32", "/no/python", tmp_path, 5, 10.0)
    assert (again.rc, again.seconds, again.reason) == (
        2,
        90.0,
        "engine refused: no CohereForCausalLM",
    )


def test_the_table_has_a_column_per_engine_and_precision_run_and_a_line_per_other_cell():
    cells = [
        matrix.Cell("granite", "hf-generate", "float32", 0, 60.0, "pass"),
        matrix.Cell("granite", "vllm", "float32", 1, 120.0, "fail",
                    failures=[matrix.failure(failing_check())], release="vllm 0.32.0"),
        matrix.Cell("mistral", "hf-generate", "float32", 0, 6.0, "pass",
                    unreached=["sliding_window"]),
        matrix.Cell("gemma2", "vllm", "float32", 2, 30.0, "incomplete", "engine failed to start"),
    ]  # fmt: skip
    text = matrix.render(
        cells, "python tools/family_matrix.py --work W", 5, ["bamba × vllm × bfloat16"]
    )
    assert "| family | hf-generate float32 | vllm float32 |" in text
    assert "| gemma2 | — | incomplete (0.5 min) |" in text
    assert "| granite | passed (1.0 min) | NOT CERTIFIED (2.0 min) |" in text
    assert "| mistral | passed (0.1 min; not reached: sliding_window) | — |" in text
    assert "- gemma2 × vllm × float32: incomplete (exit 2): engine failed to start" in text
    assert "first past abs_diff_max at 70" in text and "vllm 0.32.0" in text
    assert text.endswith("Not run yet (1): bamba × vllm × bfloat16.\n")
