"""``mismatch_metrics`` and friends against per-token brute-force definitions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.doctests import run_doctests

from conformance import metrics
from conformance.errors import NonFiniteLogprobs, UsageError
from conformance.metric_table import MISMATCH_METRICS, PROB_BIN_EDGES
from conformance.metrics import mismatch_metrics, rho_by_prob_bin, stack_ragged

#: what a masked position may hold: anything, the non-finite values included
JUNK = st.sampled_from([float("-inf"), float("inf"), float("nan"), 0.0, 7.5, -1e30])
LOGPROB = st.floats(min_value=-30.0, max_value=0.0)


@st.composite
def logprob_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return a strategy for ``(lp_train, lp_infer, mask)`` with junk at masked positions.

    The engine side is an exact copy, a tiny perturbation or an independent draw per token,
    so exact matches, near-exact and gross mismatch all occur. Shrinks towards one valid token
    with equal log-probs.
    """
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    lt, li, mask = [], [], []
    for _ in range(rows * cols):
        valid = draw(st.booleans())
        train = draw(LOGPROB)
        kind = draw(st.sampled_from(["same", "near", "other"]))
        infer = {
            "same": train,
            "near": min(0.0, train + draw(st.floats(-1e-6, 1e-6))),
            "other": draw(LOGPROB),
        }[kind]
        mask.append(valid)
        lt.append(train if valid else draw(JUNK))
        li.append(infer if valid else draw(JUNK))
    if not any(mask):
        only = draw(st.integers(0, rows * cols - 1))
        mask[only], lt[only], li[only] = True, draw(LOGPROB), draw(LOGPROB)

    def tensor(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).reshape(rows, cols)

    return tensor(lt), tensor(li), torch.tensor(mask).reshape(rows, cols)


def brute_force(lp_train: torch.Tensor, lp_infer: torch.Tensor, mask: torch.Tensor) -> dict:
    """Every metric by its textbook definition, one token at a time, in Python floats."""
    tokens, seq_sums, seq_scaled = [], [], []
    for row in range(mask.shape[0]):
        row_tokens = [
            (float(lp_train[row, col]), float(lp_infer[row, col]))
            for col in range(mask.shape[1])
            if mask[row, col]
        ]
        tokens += row_tokens
        if row_tokens:
            seq_sums.append(abs(sum(t - i for t, i in row_tokens)))
            seq_scaled.append(seq_sums[-1] / math.sqrt(len(row_tokens)))
    n = len(tokens)
    log_r = [t - i for t, i in tokens]
    rho = [math.exp(x) for x in log_r]
    p_train = [math.exp(t) for t, _ in tokens]
    p_infer = [math.exp(i) for _, i in tokens]
    abs_lr = sorted(abs(x) for x in log_r)
    pos = 0.99 * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    rho_mean = sum(rho) / n
    return {
        "abs_diff_mean": sum(abs_lr) / n,
        "abs_diff_p99": abs_lr[lo] + (pos - lo) * (abs_lr[hi] - abs_lr[lo]),
        "abs_diff_max": abs_lr[-1],
        "prob_diff_mean": sum(abs(a - b) for a, b in zip(p_train, p_infer, strict=True)) / n,
        "prob_diff_max": max(abs(a - b) for a, b in zip(p_train, p_infer, strict=True)),
        "rho_mean": rho_mean,
        "rho_std": math.sqrt(sum((r - rho_mean) ** 2 for r in rho) / n),
        "rho_max": max(rho),
        "rho_min": min(rho),
        "pcc": pearson(p_train, p_infer),
        "log_ppl_abs_diff": sum(seq_sums) / len(seq_sums),
        "log_ppl_abs_diff_per_sqrt_len": sum(seq_scaled) / len(seq_scaled),
        "k1": sum(-x for x in log_r) / n,
        "log_ratio_sum_per_sqrt_tokens": abs(sum(log_r)) / math.sqrt(n),
        "k2": sum(0.5 * x * x for x in log_r) / n,
        "k3": sum(r - 1 - x for r, x in zip(rho, log_r, strict=True)) / n,
        "chi2_token": sum(r * r for r in rho) / n - 1,
        "token_mult_prob_error": sum(math.exp(abs(x)) for x in log_r) / n,
        "exact_match_rate": sum(t == i for t, i in tokens) / n,
        "seq_log_ratio_abs_max": max(seq_sums),
        "seq_log_ratio_per_sqrt_len_max": max(seq_scaled),
        "nonfinite_tokens": 0.0,
    }


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson r, with the documented rule for a constant side (1.0 iff both the same constant)."""
    if len(set(x)) == 1 or len(set(y)) == 1:
        return 1.0 if len(set(x)) == len(set(y)) == 1 and x[0] == y[0] else 0.0
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def pcc_condition(x: list[float]) -> float:
    """How much rounding in the mean is amplified in the variance: mean(x²) / var(x)."""
    mean = sum(x) / len(x)
    var = sum((a - mean) ** 2 for a in x) / len(x)
    return sum(a * a for a in x) / len(x) / var if var else 1.0


@settings(max_examples=300, deadline=None)
@given(logprob_batches())
def test_every_metric_matches_its_brute_force_definition(batch) -> None:
    lp_train, lp_infer, mask = batch
    got = mismatch_metrics(lp_train, lp_infer, mask)
    want = brute_force(lp_train, lp_infer, mask)
    assert set(got) == set(MISMATCH_METRICS) == set(want)
    # ρ-based sums live on the scale of ρ²; the rest on the scale of 1
    valid_lr = (lp_train.double() - lp_infer.double())[mask]
    rho_scale = 1.0 + float(valid_lr.max().exp()) ** 2
    p_train = lp_train.double()[mask].exp().tolist()
    p_infer = lp_infer.double()[mask].exp().tolist()
    pcc_tol = 1e-9 * max(pcc_condition(p_train), pcc_condition(p_infer))
    for key in MISMATCH_METRICS:
        scale = rho_scale if key.startswith(("rho", "chi2", "k3", "token_mult")) else 1.0
        tol = pcc_tol if key == "pcc" else 1e-12 * scale
        assert math.isclose(got[key], want[key], rel_tol=1e-9, abs_tol=tol), (key, got, want)
        assert math.isfinite(got[key]), key


@settings(max_examples=100, deadline=None)
@given(logprob_batches(), st.data())
def test_masked_positions_never_contribute(batch, data) -> None:
    lp_train, lp_infer, mask = batch
    junk_t, junk_i = lp_train.clone(), lp_infer.clone()
    for row, col in (~mask).nonzero().tolist():
        junk_t[row, col] = data.draw(JUNK)
        junk_i[row, col] = data.draw(JUNK)
    assert mismatch_metrics(junk_t, junk_i, mask) == mismatch_metrics(lp_train, lp_infer, mask)


def test_identical_logprobs_are_a_perfect_match() -> None:
    lp = torch.log_softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(0)), -1)
    mask = torch.rand(4, 9, generator=torch.Generator().manual_seed(1)) < 0.7
    got = mismatch_metrics(lp, lp.clone(), mask)
    for key in ("abs_diff_mean", "abs_diff_p99", "abs_diff_max", "prob_diff_max", "rho_std"):
        assert got[key] == 0.0, key
    for key in ("k1", "k2", "k3", "chi2_token", "log_ppl_abs_diff", "seq_log_ratio_abs_max"):
        assert got[key] == 0.0, key
    for key in ("rho_mean", "rho_max", "rho_min", "token_mult_prob_error", "exact_match_rate"):
        assert got[key] == 1.0, key
    assert got["pcc"] == pytest.approx(1.0, abs=1e-15)


def test_pcc_of_a_constant_side() -> None:
    mask = torch.ones(1, 3, dtype=torch.bool)
    same = torch.full((1, 3), -0.7)
    assert mismatch_metrics(same, same.clone(), mask)["pcc"] == 1.0
    assert mismatch_metrics(same, same - 0.1, mask)["pcc"] == 0.0
    assert mismatch_metrics(same, torch.tensor([[-0.7, -0.6, -0.5]]), mask)["pcc"] == 0.0


def test_p99_over_many_chunks_matches_numpy() -> None:
    gen = torch.Generator().manual_seed(3)
    lp_train = -torch.rand(3000, 70, generator=gen) * 8
    lp_infer = lp_train + torch.randn(3000, 70, generator=gen) * 1e-3
    mask = torch.rand(3000, 70, generator=gen) < 0.6
    valid = (lp_train.double() - lp_infer.double())[mask].abs().numpy()
    got = mismatch_metrics(lp_train, lp_infer, mask)
    assert got["abs_diff_p99"] == pytest.approx(np.quantile(valid, 0.99), rel=1e-12)
    assert got["abs_diff_mean"] == pytest.approx(valid.mean(), rel=1e-12)


def test_p99_when_the_strided_sample_overestimates_the_tail() -> None:
    # every sampled position holds the largest value, so the sampled threshold keeps fewer
    # values than the 99th percentile needs and the exact fallback must take over
    lp_train = torch.full((1000, 1000), -1.0, dtype=torch.float64)
    lp_infer = lp_train - 0.1
    step = lp_train.numel() // 8192
    lp_infer.view(-1)[::step] = -4.0
    mask = torch.ones_like(lp_train, dtype=torch.bool)
    valid = (lp_train - lp_infer).abs().flatten().numpy()
    got = mismatch_metrics(lp_train, lp_infer, mask)["abs_diff_p99"]
    assert got == pytest.approx(np.quantile(valid, 0.99), rel=1e-12)


def test_docstring_examples_run() -> None:
    run_doctests(metrics)


@settings(max_examples=100, deadline=None)
@given(logprob_batches())
def test_rho_by_prob_bin_matches_brute_force(batch) -> None:
    lp_train, lp_infer, mask = batch
    edges = PROB_BIN_EDGES
    tokens = [
        (math.exp(float(lp_train[r, c])), math.exp(float(lp_train[r, c]) - float(lp_infer[r, c])))
        for r, c in mask.nonzero().tolist()
    ]
    got = rho_by_prob_bin(lp_train, lp_infer, mask)
    assert [(b["lo"], b["hi"]) for b in got] == list(itertools.pairwise(edges))
    for i, b in enumerate(got):
        last = i == len(got) - 1
        rhos = [r for p, r in tokens if b["lo"] <= p and (p <= b["hi"] if last else p < b["hi"])]
        assert b["count"] == len(rhos)
        if rhos:
            mean = sum(rhos) / len(rhos)
            std = math.sqrt(sum((r - mean) ** 2 for r in rhos) / len(rhos))
            assert b["mean"] == pytest.approx(mean, rel=1e-9)
            assert b["std"] == pytest.approx(std, rel=1e-9, abs=1e-12 * mean)
        else:
            assert b["mean"] is None and b["std"] is None
    assert sum(b["count"] for b in got) == len(tokens)  # π ∈ [0, 1] always lands in a bin


@given(st.lists(st.lists(LOGPROB, max_size=7), min_size=1, max_size=5))
def test_stack_ragged_round_trips(rows) -> None:
    values, mask = stack_ragged(rows)
    assert values.dtype == torch.float64 and mask.dtype == torch.bool
    assert values.shape == mask.shape == (len(rows), max(map(len, rows)))
    assert [values[i][mask[i]].tolist() for i in range(len(rows))] == rows
    assert not values[~mask].any()


def test_stack_ragged_accepts_tensors_exactly() -> None:
    row = torch.tensor([-0.1, -2.5], dtype=torch.bfloat16)
    values, mask = stack_ragged([row, torch.tensor([-1.0])])
    assert values[0].tolist() == row.double().tolist()
    assert mask.tolist() == [[True, True], [True, False]]


# --- errors ---------------------------------------------------------------------------------


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]])
    return lp, lp - 0.01, torch.ones(2, 3, dtype=torch.bool)


def test_empty_mask_is_an_error() -> None:
    lp_train, lp_infer, mask = _batch()
    with pytest.raises(NonFiniteLogprobs, match=r"mask of shape \(2, 3\) selects no token"):
        mismatch_metrics(lp_train, lp_infer, torch.zeros_like(mask))
    with pytest.raises(NonFiniteLogprobs, match="selects no token"):
        rho_by_prob_bin(lp_train, lp_infer, torch.zeros_like(mask))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("side", [0, 1])
def test_non_finite_tokens_are_counted_and_left_out(bad: float, side: int) -> None:
    batch = list(_batch())
    batch[side] = batch[side].clone()
    batch[side][1, 2] = bad
    batch[side][0, 1] = bad
    got = mismatch_metrics(*batch)
    finite = torch.ones(2, 3, dtype=torch.bool)
    finite[1, 2] = finite[0, 1] = False
    clean = mismatch_metrics(*_batch()[:2], finite)
    assert got["nonfinite_tokens"] == 2.0
    assert {k: v for k, v in got.items() if k != "nonfinite_tokens"} == {
        k: v for k, v in clean.items() if k != "nonfinite_tokens"
    }
    with pytest.raises(NonFiniteLogprobs, match=r"\(0, 1\), \(1, 2\)"):
        rho_by_prob_bin(*batch)


def test_non_finite_tokens_are_found_across_chunks() -> None:
    lp_train = torch.zeros(5000, 40)
    lp_train[4321, 7] = float("nan")
    got = mismatch_metrics(lp_train, torch.zeros(5000, 40), torch.ones(5000, 40, dtype=torch.bool))
    assert got["nonfinite_tokens"] == 1.0 and got["abs_diff_max"] == 0.0


def test_nothing_finite_is_an_error_with_the_count() -> None:
    lp_train, lp_infer, mask = _batch()
    with pytest.raises(NonFiniteLogprobs, match="all 6 valid") as raised:
        mismatch_metrics(torch.full_like(lp_train, float("nan")), lp_infer, mask)
    assert raised.value.count == 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t, i, m: (t, i[:, :2], m), r"lp_infer \(2, 2\)"),
        (lambda t, i, m: (t[0], i[0], m[0]), r"lp_train \(3,\)"),
        (lambda t, i, m: (t, i, m.float()), "mask has dtype torch.float32"),
        (lambda t, i, m: (t.long(), i, m), "lp_train has dtype torch.int64"),
        (lambda t, i, m: (t.tolist(), i, m), "lp_train is a list"),
    ],
)
def test_bad_inputs_are_usage_errors(change, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        mismatch_metrics(*change(*_batch()))


@pytest.mark.parametrize("edges", [(0.5,), (0.0, 0.5, 0.5, 1.0), (1.0, 0.0)])
def test_bad_bin_edges_are_usage_errors(edges) -> None:
    with pytest.raises(UsageError, match="strictly increasing"):
        rho_by_prob_bin(*_batch(), edges=edges)


def test_stack_ragged_rejects_a_2d_row() -> None:
    with pytest.raises(UsageError, match=r"row 1 has shape \(2, 2\)"):
        stack_ragged([torch.zeros(3), torch.zeros(2, 2)])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(LOGPROB, st.floats(-0.5, 0.5)), min_size=2, max_size=40),
    st.integers(0, 2**16),
)
def test_pcc_bootstrap_quantile_is_the_quantile_of_resampled_pools(pairs, seed) -> None:
    """Against the definition: the same resamples of the valid tokens (one draw of ``draws``
    pools of n indices, as the seed gives them), each pool's Pearson correlation of the
    probabilities by numpy, zero variance read as ``mismatch_metrics`` reads it, and the
    quantile interpolated linearly."""
    train = torch.tensor([[lp for lp, _ in pairs]], dtype=torch.float64)
    infer = train + torch.tensor([[d for _, d in pairs]], dtype=torch.float64)
    mask = torch.ones_like(train, dtype=torch.bool)
    got = metrics.pcc_bootstrap_quantile(train, infer, mask, draws=50, quantile=0.1, seed=seed)
    n = len(pairs)
    picked = torch.randint(n, (50, n), generator=torch.Generator().manual_seed(seed)).numpy()
    x, y = train[0].exp().numpy(), infer[0].exp().numpy()
    each = []
    for row in picked:
        xs, ys = x[row], y[row]
        if xs.var() == 0 or ys.var() == 0:
            each.append(float(xs.var() == ys.var() == 0 and (xs == ys).all()))
        else:
            each.append(float(np.clip(np.corrcoef(xs, ys)[0, 1], -1, 1)))
    assert got == pytest.approx(float(np.quantile(each, 0.1)), abs=1e-9)


def test_pcc_bootstrap_quantile_reads_low_where_a_few_tokens_hold_the_variance() -> None:
    """Small π everywhere but at three tokens, each with a small relative error: the pool reads
    near 1, and pools drawn from it without those three read far lower (the bound a calibration
    sets from it must cover them)."""
    generator = torch.Generator().manual_seed(0)
    lp = math.log(1e-3) + torch.rand((1, 200), generator=generator).log()
    lp[0, :3] = math.log(0.5)
    noisy = lp + 0.05 * torch.randn(lp.shape, generator=generator)
    mask = torch.ones_like(lp, dtype=torch.bool)
    pool = mismatch_metrics(lp, noisy, mask)["pcc"]
    low = metrics.pcc_bootstrap_quantile(lp, noisy, mask)
    without = mismatch_metrics(lp[:, 3:], noisy[:, 3:], mask[:, 3:])["pcc"]
    assert 1 - without > 10 * (1 - pool)
    assert 1 - low > 10 * (1 - pool)
