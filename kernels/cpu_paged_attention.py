"""Attention over SGLang's paged KV cache on CPU: a C++ kernel (`cpu_paged_attention.cpp`)
that reads each cached key and value row where it lies, built on the serving machine
with the other CPU kernels (`cpu_build`).

Reference: `sglang_domino.sglang.cpu.attention.attend` (row gathers out of the cache, then
`scaled_dot_product_attention`), held equal by tests/sglang/cpu/test_attention.py.

Why. On a 2-core CPU a decode step of the test bed's target spent about 0.2 ms per layer
in attention for one request, almost all of it a dozen small ops' dispatch (gathers,
views, SDPA, the copy out), not arithmetic; the kernel is one call (docs/cpu.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import cpu_build


def build(directory: str, verbose: bool = False):
    """The kernel's op, its library compiled into (or loaded from) `directory` on first
    use in this process (`cpu_build.build`); raises where it cannot be built."""
    cpu_build.build(directory, verbose=verbose)
    return op()


def op():
    """The kernel's op (its library loaded: `cpu_build.build`)."""
    return torch.ops.sglang_domino_cpu.paged_attention.default


def paged_attention(op, query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: torch.Tensor, q_len: int, *,
                    scaling: Optional[float] = None, causal: bool = False,
                    sliding_window_size: Optional[int] = None) -> torch.Tensor:
    """`attend`'s contract through the kernel `op` (`build`): each request's last `q_len`
    rows of `query` attend to its first `kv_lens[r]` cached tokens, written into `output`.
    Grouped-query heads are implied by the shapes (heads a multiple of the cache's)."""
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    window = int(sliding_window_size) if sliding_window_size is not None and sliding_window_size > -1 else -1
    rows = req_pool_indices if req_pool_indices.dtype == torch.int64 else req_pool_indices.to(torch.int64)
    lens = kv_lens if kv_lens.dtype == torch.int64 else kv_lens.to(torch.int64)
    op(query, k_cache, v_cache, req_to_token, rows.contiguous(), lens.contiguous(), int(q_len), scale, bool(causal),
       window, output)
    return output


def suits(query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          req_to_token: torch.Tensor) -> bool:
    """Whether the kernel takes these inputs: the cache in the query's dtype (float32,
    bfloat16 or float16), the token table int32, every last dimension contiguous."""
    return (k_cache.dtype == query.dtype == output.dtype
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and req_to_token.dtype == torch.int32 and req_to_token.stride(-1) == 1
            and query.stride(-1) == 1 and output.stride(-1) == 1 and k_cache.stride(-1) == 1
            and v_cache.stride(-1) == 1 and v_cache.dtype == k_cache.dtype)


__all__ = ["build", "op", "paged_attention", "suits"]
