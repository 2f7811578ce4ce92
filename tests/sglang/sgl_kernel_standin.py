"""An import-time stand-in for sgl_kernel in the CPU test environment (see .ci/sglang-tests).

PyPI's sgl-kernel is a CUDA build. With SGLANG_USE_CPU_ENGINE=1, SGLang imports a few CPU ops
from it at module level; this module defines exactly those names and nothing else, so that every
other `from sgl_kernel import ...` fails with ImportError and takes SGLang's own fallback (a
stand-in that answered every name would break them). Installed as site-packages/sgl_kernel/__init__.py.

The two ops serving reaches are written in plain torch; the speculative-decoding ones raise if
called (the tests never enable speculative decoding).
"""

from __future__ import annotations

import torch

__version__ = "0.0.0+radixtop.standin"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Row r of req_to_token gets its slice [start, end) from out_cache_loc, rows packed in order
    (the semantics of SGLang's triton kernel assign_req_to_token_pool)."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        req_to_token[row, start:end] = out_cache_loc[taken : taken + end - start]
        taken += end - start


def copy_all_layer_kv_cache_cpu(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("sgl_kernel stand-in: copy_all_layer_kv_cache_cpu (KV moves between pools)")


def _unsupported(name: str):
    def call(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel stand-in: {name} (speculative decoding is not served here)")

    call.__name__ = name
    return call


assign_draft_cache_locs_contiguous_cpu = _unsupported("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _unsupported("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _unsupported("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _unsupported("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _unsupported("rotate_input_ids_cpu")
build_tree_kernel_efficient_cpu = _unsupported("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _unsupported("verify_tree_greedy_cpu")
