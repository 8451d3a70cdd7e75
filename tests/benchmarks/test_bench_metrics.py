"""Throughput of ``mismatch_metrics`` on one core (goal: ≥ 50 M tokens/s at 1 M tokens).

No timed assertion: pytest-benchmark records the figure (``tox -e bench``); tokens/s is
``TOKENS / mean`` and is also put in the benchmark's ``extra_info``.
"""

from __future__ import annotations

import pytest
import torch

from conformance.metric_table import MISMATCH_METRICS
from conformance.metrics import mismatch_metrics

ROWS, COLS = 1000, 1000
TOKENS = ROWS * COLS


@pytest.mark.parametrize("rows", ["fixed-length", "ragged"])
def test_mismatch_metrics_on_a_million_tokens(benchmark, rows: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        lp_train = torch.log_softmax(torch.randn(ROWS, COLS, generator=gen), dim=-1)
        lp_infer = lp_train + 1e-3 * torch.randn(ROWS, COLS, generator=gen)
        mask = torch.ones(ROWS, COLS, dtype=torch.bool)
        if rows == "ragged":  # rollouts of 500 to 1000 tokens, padded with -inf
            lengths = torch.randint(COLS // 2, COLS + 1, (ROWS, 1), generator=gen)
            mask = torch.arange(COLS)[None, :] < lengths
            lp_train[~mask] = float("-inf")
        result = benchmark(mismatch_metrics, lp_train, lp_infer, mask)
    finally:
        torch.set_num_threads(threads)
    assert set(result) == set(MISMATCH_METRICS)
    benchmark.extra_info["tokens"] = TOKENS
    benchmark.extra_info["tokens_per_s"] = TOKENS / benchmark.stats.stats.mean
