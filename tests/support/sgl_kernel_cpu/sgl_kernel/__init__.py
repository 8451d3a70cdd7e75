"""Pure-torch stand-in for the few CPU kernels of ``sgl_kernel`` that SGLang's CPU engine imports.

Test and CI support only. PyPI ships ``sgl_kernel`` (``sglang-kernel``) for CUDA alone, yet
SGLang's CPU code paths import a handful of its CPU kernels unconditionally. The SGLang engines of
this project put this folder's parent on the path only when the real ``sgl_kernel`` does not
import and ``TIM_SGL_KERNEL_STANDIN`` names that parent, so a machine with real SGLang kernels
never sees it. Kernels the CPU engine imports but never calls on these test models raise
``NotImplementedError`` naming themselves, so a silent wrong result is impossible.
"""

from __future__ import annotations

import torch

#: lets tooling and the engines' log line tell the stand-in from the real package
IS_STANDIN = True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV-cache slots into its row of the request→token table.

    Request ``i`` owns row ``req_pool_indices[i]`` and receives positions
    ``start_offset[i] : end_offset[i]``; its slots are the next ``end − start`` entries of the
    flat ``out_cache_loc``, which lists all requests' slots back to back in batch order.
    """
    if req_to_token.shape[1] != pool_len:
        columns = req_to_token.shape[1]
        raise ValueError(f"pool_len={pool_len}, but req_to_token has {columns} columns")
    taken = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def _not_provided(name: str):
    def kernel(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the pure-torch stand-in "
            "(tests/support/sgl_kernel_cpu); install a real sgl_kernel build for this code path"
        )

    kernel.__name__ = name
    return kernel


copy_all_layer_kv_cache_cpu = _not_provided("copy_all_layer_kv_cache_cpu")
build_tree_kernel_efficient_cpu = _not_provided("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _not_provided("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = _not_provided("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _not_provided("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _not_provided("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _not_provided("fill_bonus_tokens_cpu")
