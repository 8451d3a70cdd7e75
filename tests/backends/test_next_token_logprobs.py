"""``Backend.next_token_logprobs``: the whole processed distribution the sampler-fidelity suite
tests sampled tokens against is the one ``recompute`` picks each token's log-prob from."""

from __future__ import annotations

import pytest
import torch

from conformance.backends import BACKENDS
from conformance.backends.base import Backend, BackendConfig

SEQUENCES = [[5, 17, 17, 200, 3, 383], [9, 1], [42, 42, 42, 7]]


@pytest.fixture(
    scope="module",
    # fsdp, one sequence per micro-batch: its ranks get 2 and 1, so one runs the filler step
    params=[("hf", 2), pytest.param(("fsdp", 1), marks=pytest.mark.fsdp, id="fsdp")],
    ids=["hf", "fsdp"],
)
def backend(request, default_model) -> Backend:
    name, micro_batch_size = request.param
    built = BACKENDS.get(name)(BackendConfig(default_model, micro_batch_size=micro_batch_size))
    yield built
    built.close()


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.7, "top_k": 20}]
)
def test_the_distribution_holds_each_recomputed_log_prob(backend, sampling):
    rows = backend.next_token_logprobs(SEQUENCES, **sampling)
    picked = backend.recompute(SEQUENCES, **sampling).logprobs
    for seq, row, expected in zip(SEQUENCES, rows, picked, strict=True):
        assert row.shape == (len(seq) - 1, 384)
        # a distribution at every position, cut to at most top_k tokens
        assert torch.allclose(row.exp().sum(-1), torch.ones(len(seq) - 1), atol=1e-5)
        if sampling.get("top_k"):
            assert int(torch.isfinite(row).sum(-1).max()) <= sampling["top_k"]
        got = row.gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)
        # -inf where the token is cut, on both sides alike
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        finite = torch.isfinite(got)
        torch.testing.assert_close(got[finite], expected[finite], atol=1e-5, rtol=0)
