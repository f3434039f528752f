"""Greedy acceptance in one Triton program per row.

Reference: `sglang_domino.accept.accept_greedy` (argmax of the target logits, longest
matching prefix, then the target's token at the first mismatch). The kernel takes the
target's argmax tokens, so it replaces the per-row bookkeeping (compare, prefix length,
gather), the part that is a chain of small launches in eager PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _accept_greedy_kernel(draft_ptr, target_ptr, accepted_ptr, next_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.arange(0, BLOCK)
    in_chain = idx < n
    draft = tl.load(draft_ptr + row * n + idx, mask=in_chain, other=0)
    target = tl.load(target_ptr + row * (n + 1) + idx, mask=in_chain, other=0)
    mismatch = (draft != target) & in_chain
    # First mismatching position, or n when every draft matches.
    accepted = tl.min(tl.where(mismatch, idx, n), axis=0)
    nxt = tl.load(target_ptr + row * (n + 1) + accepted)
    tl.store(accepted_ptr + row, accepted)
    tl.store(next_ptr + row, nxt)


def accept_greedy_tokens(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [b, n], target_tokens [b, n+1] (the target's argmax) -> (accepted [b], next [b])."""
    b, n = draft_tokens.shape
    if target_tokens.shape != (b, n + 1):
        raise ValueError(f"target_tokens: got shape {tuple(target_tokens.shape)}, expected {(b, n + 1)}")
    draft = draft_tokens.contiguous().to(torch.int64)
    target = target_tokens.contiguous().to(torch.int64)
    accepted = torch.empty(b, dtype=torch.int64, device=draft.device)
    nxt = torch.empty(b, dtype=torch.int64, device=draft.device)
    _accept_greedy_kernel[(b,)](draft, target, accepted, nxt, n, BLOCK=triton.next_power_of_2(max(n, 1)))
    return accepted, nxt
