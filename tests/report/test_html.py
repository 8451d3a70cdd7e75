"""The HTML report: content, escaping of every data string, self-containedness, size bounds."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from conformance.errors import UsageError
from conformance.metrics import rho_by_prob_bin as torch_rho_by_prob_bin
from conformance.report import Report, load_report, render_html, write_html
from conformance.report.plots import MAX_POINTS
from conformance.report.schema import Violation
from conformance.report.stats import histogram, pearson, pool_samples, quantile, rho_by_prob_bin

from .reports import SUITES, make_report, measure

HOSTILE = [
    '<script>alert("x")</script>',
    '"><img src=x onerror=alert(1)>',
    "</title><u>underlined</u>",
]


class Dom(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def bf16_report() -> Report:
    return make_report(torch.bfloat16)


def test_failing_report_shows_verdict_tables_reproducer_and_plots(bf16_report: Report) -> None:
    dom = Dom(render_html(bf16_report))
    text = " ".join(dom.text)
    assert "NOT CERTIFIED" in text
    ids = {attrs.get("id") for _, attrs in dom.tags}
    assert {"verdict", *(f"suite-{s}" for s in SUITES)} <= ids
    failing = [c for c in bf16_report.checks if c.status == "fail"]
    assert failing, "bf16 logits must break the fp32-like thresholds"
    assert failing[0].worst_case is not None and failing[0].worst_case["replay"] in text
    assert bf16_report.command in text
    # the fraction-of-bound chart, then per suite its token plots (bf16's π scatter sits within
    # a pixel of y = x, so it is named instead of drawn), each with its bound
    page = render_html(bf16_report)
    closeness = page[page.index('id="closeness"') : page.index('id="suite-')]
    assert closeness.count("<svg") == 1
    for suite in SUITES:
        section = page[page.index(f'id="suite-{suite}"') :]
        section = section[: section.index("</section>")]
        assert section.count("<svg") == 3
        # abs_diff_max's bound on the |log ρ| histogram and by position (no ρ bound here)
        assert section.count('class="ref"') == 2 and section.count("bound 0.0001<") == 2
        assert "π_train vs π_infer not drawn: every token within" in section


def test_passing_and_incomplete_verdicts() -> None:
    report = make_report(torch.float32)
    assert report.verdict == "pass"
    assert "CERTIFIED" in render_html(report) and "NOT CERTIFIED" not in render_html(report)
    report.verdict, report.reason = "incomplete", "engine 'vllm-server' died mid-run"
    text = " ".join(Dom(render_html(report)).text)
    assert "INCOMPLETE" in text and "engine 'vllm-server' died mid-run" in text


def test_every_data_string_is_escaped(bf16_report: Report) -> None:
    report = copy.deepcopy(bf16_report)
    evil = " ".join(HOSTILE)
    check = next(c for c in report.checks if c.status == "fail")
    check.message = evil
    check.name = evil
    check.suite = evil
    check.metrics[evil] = 1.0
    check.thresholds[evil] = 0.5
    check.violations.append(Violation(metric=evil, value=1.0, threshold=0.5, bound="max"))
    assert check.worst_case is not None
    check.worst_case["prompt_text"] = evil
    check.worst_case["replay"] = evil
    report.command = evil
    report.reason = evil
    report.stack["model"]["path"] = evil
    report.stack["env"] = {evil: evil}
    report.profile.name = evil
    report.rl = {"mismatch_alarm": {"fired": True, "step": 3, "reason": evil}}
    page = render_html(report, rl_curves=[{"step": 1, evil: 2.0}, {"step": 2, evil: 3.0}])
    dom = Dom(page)
    tags = {tag for tag, _ in dom.tags}
    assert "script" not in tags and "img" not in tags and "u" not in tags
    assert not [(t, a) for t, a in dom.tags for name in a if name.startswith("on")]
    # the hostile strings survive as text, intact
    text = "".join(dom.text)
    for s in HOSTILE:
        assert s in text


def test_page_requests_nothing_from_any_host(bf16_report: Report) -> None:
    page = render_html(bf16_report)
    dom = Dom(page)
    urls = [v for _, attrs in dom.tags for k, v in attrs.items() if k in ("src", "href") and v]
    assert all(u.startswith(("#", "data:")) for u in urls), urls
    assert not re.search(r"url\(|@import|https?://", page)


def test_plots_downsample_deterministically() -> None:
    report = make_report(torch.bfloat16, checks_per_suite=1)
    # fp8 logits: a mismatch the π scatter shows (bf16's sits within a pixel of y = x)
    many = measure(torch.float8_e4m3fn, seed=7, batch=40, seq=200)
    report.checks[0].samples = {
        "lp_train": many.lp_train.flatten().tolist(),
        "lp_infer": many.lp_infer.flatten().tolist(),
    }
    page = render_html(report)
    assert page == render_html(report)
    scatter = re.search(r'<path class="pt" d="([^"]*)"', page)
    assert scatter is not None
    assert scatter.group(1).count("h0") == MAX_POINTS
    assert f"{MAX_POINTS} of {40 * 200} shown" in page


def test_rl_section_marks_alarm_and_collapse_on_present_curves(bf16_report: Report) -> None:
    report = copy.deepcopy(bf16_report)
    report.rl = {
        "mismatch_alarm": {"fired": True, "step": 12, "reason": "rho_std rose 3x"},
        "collapse": {"fired": False, "step": None},
    }
    # the smoke run nests the mismatch metrics of a step under "mismatch"
    curves = [
        {"step": s, "reward": s / 30, "seconds": 0.3, "mismatch": {"rho_std": 1e-3 * 1.1**s}}
        for s in range(30)
    ]
    page = render_html(report, rl_curves=curves)
    rl = page[page.index('id="rl"') :]
    # reward and mismatch only: absent keys and uncurated ones (seconds) draw nothing
    assert re.findall(r"<title>([^<]*)</title>", rl) == ["reward", "mismatch (std ρ)"]
    assert rl.count("alarm @ 12") == 2 and "collapse @" not in rl
    assert "rho_std rose 3x" in rl


def test_write_html_reads_rl_curves_next_to_the_page(tmp_path, bf16_report: Report) -> None:
    report = copy.deepcopy(bf16_report)
    report.rl = {"curves_path": "rl.jsonl"}
    (tmp_path / "rl.jsonl").write_text(
        '{"step": 0, "entropy": 1.0}\n{"step": 1, "entropy": 0.9}\n{"st'
    )
    page = write_html(report, tmp_path / "report.html").read_text()
    assert "<title>entropy</title>" in page


def test_load_report_rejects_bad_input_in_one_line(tmp_path) -> None:
    cases = {"missing.json": None, "bad.json": "{not json", "wrong.json": '{"schema": 99}'}
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_text(content)
        with pytest.raises(UsageError) as err:
            load_report(tmp_path / name)
        assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_stats_agree_with_independent_implementations() -> None:
    m = measure(torch.bfloat16, seed=3, batch=6, seq=50)
    samples = pool_samples(
        [{"lp_train": m.lp_train[m.mask].tolist(), "lp_infer": m.lp_infer[m.mask].tolist()}]
    )
    p_train = np.exp(samples.lp_train)
    p_infer = np.exp(samples.lp_infer)
    assert pearson(p_train.tolist(), p_infer.tolist()) == pytest.approx(
        np.corrcoef(p_train, p_infer)[0, 1], abs=1e-12
    )
    edges, counts = histogram(samples.log_ratio, 40)
    assert counts == np.histogram(samples.log_ratio, bins=40)[0].tolist()
    assert edges == pytest.approx(np.histogram_bin_edges(samples.log_ratio, bins=40).tolist())
    ordered = sorted(samples.log_ratio)
    assert quantile(ordered, 0.95) == pytest.approx(np.quantile(ordered, 0.95))
    ours = rho_by_prob_bin(samples)
    theirs = [b for b in torch_rho_by_prob_bin(m.lp_train, m.lp_infer, m.mask) if b["count"]]
    assert [(b.lo, b.hi, b.count) for b in ours] == [(b["lo"], b["hi"], b["count"]) for b in theirs]
    assert [b.mean for b in ours] == pytest.approx([b["mean"] for b in theirs], rel=1e-12)


def test_report_cli_writes_the_page_next_to_report_json(tmp_path, bf16_report: Report) -> None:
    from conformance.cli import main

    (tmp_path / "report.json").write_text(json.dumps(bf16_report.to_json()))
    assert main(["report", str(tmp_path / "report.json")]) == 0
    assert "NOT CERTIFIED" in (tmp_path / "report.html").read_text()
    assert main(["report", str(tmp_path / "report.json"), "-o", str(tmp_path / "x/r.html")]) == 0
    assert (tmp_path / "x/r.html").is_file()
    assert main(["report", str(tmp_path / "results.jsonl")]) == 2
