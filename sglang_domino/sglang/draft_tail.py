"""The draft graph's captured proposals, read at a width narrower than the block.

0.5.23 folds the draft's proposal step into the draft graph (`_maybe_build_draft_sampler`:
`_DominoDraftSampler`, the greedy Domino rollout; `_DflashDraftSampler`, DFlash's argmax)
and reads its output as `sampler.out[: bs * (block_size - 1)].view(bs, block_size - 1)`
with the step's `block_size`. A step verifying fewer positions than the draft block (b8,
an adaptive narrow width) would read that buffer with the wrong stride, so the plugin
used to hand upstream no sampler for such steps: the graph's rollout then ran and was
thrown away, and the eager rollout ran again on the cut hidden states (on a GPU about 75
launches a step at b8; `../shared/reference/gpu-path-review.md`, finding 4).

Proposal k of either sampler depends only on the draft's hidden slots up to k + 1 and on
proposals before k, so a narrow width's proposals are the first W - 1 of the block's
(exactly, for DFlash and for Domino without a candidate pool; with Domino's candidate
pool, the pool is built over the block's positions instead of the first W - 1: a
different, equally lossless draft, and the verify decides what is committed).
`FirstProposals` wraps the block-wide sampler so that upstream reads those: called at
capture it is the block sampler; its `out` is the block's rows cut to W - 1 columns and
laid out as upstream reads a W-wide step (one small device copy, no host sync).
"""

from __future__ import annotations

import torch


class FirstProposals:
    """A block-wide in-graph sampler seen by a step `width` positions wide."""

    def __init__(self, sampler, width: int):
        self.sampler = sampler
        self.width = int(width)
        if not 1 < self.width <= int(sampler.block_size):
            raise ValueError(f"a width-{self.width} step cannot read a block-{sampler.block_size} sampler")

    def __call__(self, hidden_states, input_ids=None):
        # the capture hook: the draft graph runs the block-wide sampler
        return self.sampler(hidden_states, input_ids)

    @property
    def out(self) -> torch.Tensor:
        """`sampler.out` (rows of block - 1 proposals) as rows of width - 1."""
        per_row = int(self.sampler.block_size) - 1
        return self.sampler.out.view(-1, per_row)[:, : self.width - 1].reshape(-1)


def foldable(sampler) -> bool:
    """Whether the in-graph sampler's proposals can be cut to a narrower width: the
    greedy Domino rollout, DFlash's argmax and the q rule's rollout (whose q the worker
    reads cut alike, `QRuleDraftSampler.read`); not the selector or LiLiCorr samplers,
    whose sampled outputs are read per request."""
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler, _DominoDraftSampler

    from .q_sampler import QRuleDraftSampler

    return isinstance(sampler, (_DominoDraftSampler, _DflashDraftSampler, QRuleDraftSampler))


def at_width(sampler, width: int):
    """What upstream should read as `_draft_sampler` for a step `width` wide: the
    block-wide sampler (or the one a `FirstProposals` wraps) cut to the width; None where
    it cannot be (no sampler, width 1: no proposal, another kind of sampler)."""
    block = sampler.sampler if isinstance(sampler, FirstProposals) else sampler
    if block is None or int(width) <= 1 or not foldable(block):
        return None
    if int(width) == int(block.block_size):
        return block
    return FirstProposals(block, width)


__all__ = ["FirstProposals", "at_width", "foldable"]
