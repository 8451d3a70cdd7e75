"""The family matrix of docs/families.md: every architecture family × engine × precision, on a
cheap selection of suites.

For each family (make-model's ``--arch``, built once into ``--work``/models), engine and
precision (engine and backend alike), one ``certify --model M --engine E --engine-dtype D
--backend-dtype D`` of :data:`SUITES` at ``--examples`` a property, under the model's own
profile: calibrated by the family's first cell and cached in ``--work``/cache, where every
engine's cell finds it (the hf-generate cell runs first, so the reference stack calibrates it).
A suites-only run is not a certificate: the table names the selection. Each engine runs from
the interpreter its option names (a virtual environment holding that engine); for a cell that
ends incomplete (an engine refusing a family: exit 2) the table gives the report's one-line
reason, or where it wrote no report the last exception line the run printed (``--verbose``:
pytest's whole output goes to the cell's certify.log).

    PYTHONPATH=. python tools/family_matrix.py --work /tmp/families \\
        --vllm-python /tmp/engines/vllm/bin/python --sglang-python /tmp/engines/sglang/bin/python

Writes ``matrix.md`` (the table and one line per cell that did not pass) and ``matrix.json``
(every cell) into ``--out``; ``--collect`` writes them from the finished cells alone, naming
the rest. A cell already run (its ``cell.json`` in ``--work``) is read, not rerun, so an
interrupted matrix resumes; delete a cell's folder to run it again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.metric_table import metric
from conformance.models import ARCHS, make_model
from conformance.report.schema import FAILED

ENGINES = ("hf-generate", "vllm", "sglang")
DTYPES = ("float32", "bfloat16")
#: the plain decoders and the first MoE: the families before issue 56
PLAIN = ("llama", "qwen2", "qwen3", "qwen3-moe")
#: prefill, sampled rollouts and decode against a whole-sequence forward: what a family's
#: features change, at a cost that fits 2 CPU cores
SUITES = ("prefill_parity", "rollout_parity", "decode_vs_prefill")
#: SGLang's CPU engine imports CPU kernels PyPI ships no build of (tox -e sglang sets the same)
STANDIN = Path(__file__).resolve().parents[1] / "tests" / "support" / "sgl_kernel_cpu"
VERDICTS = {"pass": "passed", "fail": "NOT CERTIFIED", "incomplete": "incomplete"}


@dataclass
class Failure:
    """One failing check: its first violation, and where in the sequences it showed."""

    check: str
    status: str
    breach: str
    #: the smallest sampled position whose |Δ log p| is past the check's abs_diff_max bound
    first_position: int | None = None
    #: the sampled position of the largest |Δ log p|, and that |Δ|
    max_position: int | None = None
    max_diff: float | None = None


@dataclass
class Cell:
    arch: str
    engine: str
    dtype: str
    rc: int
    seconds: float
    verdict: str
    reason: str | None = None
    failures: list[Failure] = field(default_factory=list)
    #: the model's features no check of the selection reached (report.json's coverage)
    unreached: list[str] = field(default_factory=list)
    release: str | None = None
    report: str | None = None

    def label(self) -> str:
        return VERDICTS.get(self.verdict, self.verdict)


def failure(check: dict[str, Any]) -> Failure:
    """What a failing check of a report shows: its abs_diff_max violation, else its first (or
    its message)."""
    violations = check.get("violations") or []
    if violations:
        # the largest token's |Δ log p| says more than the first metric listed (the mean)
        v = next((v for v in violations if v["metric"] == "abs_diff_max"), violations[0])
        breach = f"{v['metric']}: {metric(v['metric']).relation(v['value'], v['threshold'])}"
    else:
        lines = (check.get("message") or "").strip().splitlines()
        breach = lines[0] if lines else check["status"]
    samples = check.get("samples") or {}
    bound = (check.get("thresholds") or {}).get("abs_diff_max")
    diffs = [
        (abs(t - i), int(p))
        for t, i, p in zip(
            samples.get("lp_train", []),
            samples.get("lp_infer", []),
            samples.get("position", []),
            strict=True,
        )
    ]
    found = Failure(check["name"], check["status"], breach)
    if diffs:
        found.max_diff, found.max_position = max(diffs)
        past = [p for d, p in diffs if bound is not None and d > bound]
        found.first_position = min(past) if past else None
    return found


def error_line(log: str) -> str | None:
    """The line that says why a run wrote no report: the last exception line (an engine that
    kills its own process leaves its traceback last but not at the end), else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (errors or lines or [None])[-1]


def read_cell(arch: str, engine: str, dtype: str, rc: int, seconds: float, run: Path) -> Cell:
    """The cell a finished certify in ``run`` makes: from its report.json, else its log."""
    report_path = run / "report.json"
    if not report_path.is_file():
        reason = error_line((run / "certify.log").read_text()) or f"exit {rc}, no output"
        if rc < 0:
            reason = f"killed by signal {-rc} before writing a report; last line: {reason}"
        return Cell(arch, engine, dtype, rc, seconds, "incomplete", reason)
    report = json.loads(report_path.read_text())
    failed = [failure(c) for c in report["checks"] if c["status"] in FAILED]
    release = report["stack"].get("engine_info", {}).get("release") or {}
    torch = report["stack"].get("versions", {}).get("torch")
    named = (
        f"{release.get('package')} {release.get('installed')} (torch {torch})" if release else None
    )
    unreached = [f["name"] for f in report.get("coverage") or [] if not f["reached_by"]]
    return Cell(
        arch, engine, dtype, rc, seconds, report["verdict"], report.get("reason"), failed,
        unreached, named, str(report_path),
    )  # fmt: skip


def model_of(arch: str, work: Path) -> Path:
    """The family's model, built once (in a side folder renamed into place when complete)."""
    final = work / "models" / arch
    if not final.is_dir():
        building = work / "models" / f".{arch}-building"
        if building.exists():
            for path in building.iterdir():
                path.unlink()
            building.rmdir()
        make_model(building, arch=arch)
        building.rename(final)
    return final


def finished(arch: str, engine: str, dtype: str, work: Path) -> Cell | None:
    """The cell as it ran before in ``work``, or None. ``cell.json`` keeps what only the run
    knew (exit code, seconds); the rest is read from its report."""
    run = work / "runs" / f"{arch}-{engine}-{dtype}"
    if not (run / "cell.json").is_file():
        return None
    saved = json.loads((run / "cell.json").read_text())
    return read_cell(arch, engine, dtype, saved["rc"], saved["seconds"], run)


def run_cell(
    arch: str, engine: str, dtype: str, python: str, work: Path, examples: int, timeout: float
) -> Cell:
    """One cell: read from ``--work`` where it ran before, else certified now."""
    cell = finished(arch, engine, dtype, work)
    if cell is not None:
        return cell
    run = work / "runs" / f"{arch}-{engine}-{dtype}"
    run.mkdir(parents=True, exist_ok=True)
    (run / "report.json").unlink(missing_ok=True)  # a cut-short run's, never read as this one's
    command = [
        python, "-m", "conformance", "certify", "--model", str(model_of(arch, work)),
        "--engine", engine, "--engine-dtype", dtype, "--backend-dtype", dtype,
        *[a for s in SUITES for a in ("--suite", s)], "--examples", str(examples),
        "--out", str(run), "--verbose",
    ]  # fmt: skip
    env = {**os.environ, "TIM_CONFORMANCE_CACHE": str(work / "cache")}
    if engine == "sglang":
        env.setdefault("TIM_SGL_KERNEL_STANDIN", str(STANDIN))
    started = time.monotonic()
    with (run / "certify.log").open("w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        try:
            rc = subprocess.call(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            rc = 124
            log.write(f"family_matrix: stopped after the cell timeout of {timeout:.0f} s\n")
    seconds = time.monotonic() - started
    (run / "cell.json").write_text(json.dumps({"rc": rc, "seconds": seconds}) + "\n")
    return read_cell(arch, engine, dtype, rc, seconds, run)


def summary(cell: Cell) -> str:
    """A table cell: the verdict, minutes, and any feature the selection left unreached."""
    measured = cell.verdict != "incomplete"  # a run that measured nothing reached nothing
    unreached = f"; not reached: {', '.join(cell.unreached)}" if measured and cell.unreached else ""
    return f"{cell.label()} ({cell.seconds / 60:.1f} min{unreached})"


def detail(cell: Cell) -> str:
    """One line for a cell that did not pass: what it showed."""
    head = f"- {cell.arch} × {cell.engine} × {cell.dtype}: {cell.label()} (exit {cell.rc})"
    if cell.verdict == "incomplete" or not cell.failures:
        return f"{head}: {cell.reason or 'no reason recorded'}"
    parts = []
    for f in cell.failures:
        where = ""
        if f.max_position is not None:
            where = f"; largest sampled |Δ log p| {f.max_diff:.3g} at position {f.max_position}"
            if f.first_position is not None:
                where += f", first past abs_diff_max at {f.first_position}"
        parts.append(f"{f.check} {f.breach}{where}")
    return f"{head}: " + "; ".join(parts)


def render(cells: list[Cell], command: str, examples: int, pending: list[str] | None = None) -> str:
    """The matrix as markdown: the selection, the table, one line per cell that did not pass,
    and the cells not run yet (``--collect`` of an unfinished matrix)."""
    by_key = {(c.arch, c.engine, c.dtype): c for c in cells}
    columns = [(e, d) for e in ENGINES for d in DTYPES if any(k[1:] == (e, d) for k in by_key)]
    archs = list(dict.fromkeys(c.arch for c in cells))
    releases = sorted({c.release for c in cells if c.release})
    lines = [
        f"Selection: `--suite {' --suite '.join(SUITES)} --examples {examples}` per cell, engine "
        "and backend in the column's precision, each family under its own profile: a suites-only "
        "run, not a certificate. Releases: " + ", ".join(releases) + ".",
        "",
        f"Regenerate: `{command}`",
        "",
        "| family | " + " | ".join(f"{e} {d}" for e, d in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for arch in archs:
        row = [summary(by_key[arch, e, d]) if (arch, e, d) in by_key else "—" for e, d in columns]
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    others = [detail(c) for c in cells if c.verdict != "pass"]
    if others:
        lines += ["", "Cells that did not pass:", "", *others]
    if pending:
        lines += ["", f"Not run yet ({len(pending)}): {', '.join(pending)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/evidence/families"))
    parser.add_argument("--arch", action="append", choices=list(ARCHS))
    parser.add_argument("--engine", action="append", choices=ENGINES)
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--cell-timeout", type=float, default=1800.0)
    parser.add_argument(
        "--collect", action="store_true", help="run nothing: the table of the finished cells"
    )
    for engine in ENGINES:
        parser.add_argument(
            f"--{engine}-python", default=sys.executable, help=f"interpreter that has {engine}"
        )
    args = parser.parse_args()
    archs = args.arch or [a for a in ARCHS if a not in PLAIN]
    engines = [e for e in ENGINES if e in (args.engine or ENGINES)]
    flags = [a for a in sys.argv[1:] if a != "--collect"]
    command = shlex.join(["PYTHONPATH=.", "python", "tools/family_matrix.py", *flags])
    print(f"regenerate: {command}", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    pending: list[str] = []
    for dtype in args.dtype or DTYPES:
        for arch in archs:
            for engine in engines:  # hf-generate first: the reference stack calibrates
                python = getattr(args, f"{engine.replace('-', '_')}_python")
                if args.collect:
                    cell = finished(arch, engine, dtype, args.work)
                    if cell is None:
                        pending.append(f"{arch} × {engine} × {dtype}")
                        continue
                else:
                    cell = run_cell(
                        arch, engine, dtype, python, args.work, args.examples, args.cell_timeout
                    )
                print(detail(cell) if cell.verdict != "pass" else f"- {arch} × {engine} × "
                      f"{dtype}: {summary(cell)}", flush=True)  # fmt: skip
                cells.append(cell)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.md").write_text(render(cells, command, args.examples, pending))
    (args.out / "matrix.json").write_text(
        json.dumps(
            {"command": command, "suites": list(SUITES), "examples": args.examples,
             "families": {a: ARCHS[a].features for a in archs},
             "cells": [asdict(c) for c in cells], "not_run": pending},
            indent=1,
        ) + "\n"
    )  # fmt: skip
    print(f"wrote {args.out / 'matrix.md'} and {args.out / 'matrix.json'}\nregenerate: {command}")


if __name__ == "__main__":
    main()
