"""Anchors, the blocks built on them, and the training attention mask.

Training reproduces many inference steps of one sequence in a single forward: each
anchor a stands for a step whose newest committed token (the bonus) is input_ids[a].
Its block is [input_ids[a], MASK x (B-1)] at positions a..a+B-1, and its queries see
  - the context (target features) strictly before a: at inference token a has not been
    through the target yet when the draft runs, so its features do not exist;
  - the block's own tokens, bidirectionally (causally for sliding-window layers, as
    SGLang and SpecForge run them);
and nothing of other blocks. Query layout: N blocks of B tokens; key layout: S context
positions followed by the same N*B block tokens (what `DraftModel.forward` expects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Anchors:
    positions: torch.Tensor  # [b, N] anchor index in the sequence (0 where unused)
    keep: torch.Tensor       # [b, N] bool: a real anchor (rows with fewer valid anchors are padded)


def valid_anchor_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """[b, S] bool: a may anchor a block iff tokens a and a+1 are both loss tokens (the
    block's first prediction is then something the draft should learn)."""
    lm = loss_mask.bool()
    valid = torch.zeros_like(lm)
    valid[:, :-1] = lm[:, :-1] & lm[:, 1:]
    return valid


def anchor_scores(valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[b, S] float: a uniform score per valid anchor, -1 elsewhere. Drawn from the
    trainer's CPU generator (runs repeat on any device), then moved to `valid`'s device."""
    scores = torch.rand(valid.shape, generator=generator).to(valid.device)
    return scores.masked_fill(~valid, -1.0)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> Anchors:
    """Up to `num_anchors` valid anchors per row, uniformly without replacement, sorted."""
    valid = valid_anchor_mask(loss_mask)
    n = max(1, min(num_anchors, int(valid.sum(1).max())))
    scores = anchor_scores(valid, generator)
    top, idx = scores.topk(n, dim=1)
    keep = top >= 0
    idx = torch.where(keep, idx, torch.zeros_like(idx))
    # Sort the kept anchors; unused slots (keep False) go last.
    key = torch.where(keep, idx, torch.full_like(idx, valid.shape[1]))
    order = key.argsort(dim=1)
    return Anchors(idx.gather(1, order), keep.gather(1, order))


def block_inputs(input_ids: torch.Tensor, anchors: Anchors, block_size: int, mask_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [b, N*B] (anchor token then masks) and their positions [b, N*B]."""
    b, n = anchors.positions.shape
    ids = torch.full((b, n, block_size), mask_id, dtype=torch.long, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors.positions)
    positions = anchors.positions[:, :, None] + torch.arange(block_size, device=input_ids.device)
    return ids.view(b, n * block_size), positions.view(b, n * block_size)


def block_attention_mask(anchors: Anchors, context_valid: torch.Tensor, block_size: int,
                         sliding_window: Optional[int] = None) -> torch.Tensor:
    """Boolean mask [b, 1, N*B, S+N*B] (True = may attend); `sliding_window` set for a
    sliding layer. A block of an unused anchor still sees its own tokens, so no query row
    is empty (SDPA would return NaN); its loss weight is zero."""
    b, n = anchors.positions.shape
    s = context_valid.shape[1]
    device = context_valid.device
    anchor_q = anchors.positions.repeat_interleave(block_size, dim=1)            # [b, Q]
    keep_q = anchors.keep.repeat_interleave(block_size, dim=1)                   # [b, Q]
    offset = torch.arange(block_size, device=device).repeat(n)                   # [Q]
    kv = torch.arange(s, device=device)
    ctx = (kv[None, None, :] < anchor_q[:, :, None]) & keep_q[:, :, None] & context_valid.bool()[:, None, :]
    block_id = torch.arange(n, device=device).repeat_interleave(block_size)
    same = block_id[:, None] == block_id[None, :]                                # [Q, Q]
    if sliding_window is not None:
        # HF windows count the current token: a query at position p sees p-W+1 .. p.
        q_pos = anchor_q + offset[None]
        ctx = ctx & (kv[None, None, :] > q_pos[:, :, None] - sliding_window)
        same = same & (offset[None, :] <= offset[:, None])
    blk = same[None].expand(b, -1, -1)
    return torch.cat([ctx, blk], dim=2)[:, None]


def layer_masks(anchors: Anchors, context_valid: torch.Tensor, block_size: int, layer_types: set[str],
                sliding_window: Optional[int]) -> dict[str, torch.Tensor]:
    masks = {}
    if "full_attention" in layer_types:
        masks["full_attention"] = block_attention_mask(anchors, context_valid, block_size)
    if "sliding_attention" in layer_types:
        masks["sliding_attention"] = block_attention_mask(anchors, context_valid, block_size, sliding_window)
    return masks
