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

The Transformers window is one slot wider than the block: `WindowProposals` runs the
rollout in the graph over the block padded to the window (B proposals).
"""

from __future__ import annotations

import torch

from ..sampling.rollout_inputs import padded_block, rollout_modules


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


class WindowProposals:
    """The Transformers window (`--speculative-num-draft-tokens` B + 1: a window of B + 1 over a
    `shift_label` Domino draft's block of B): the window verifies B proposals, from slots
    0..B-1, where 0.5.23's greedy sampler makes B - 1. This runs upstream's greedy rollout
    in the draft graph over the block's hidden states padded to the window, and lays out B
    per row, as upstream reads a window-wide step."""

    def __init__(self, sampler, window: int):
        self.sampler = sampler
        self.slots = int(sampler.block_size)
        self.block_size = int(window)         # upstream reads rows of block_size - 1
        if self.block_size != self.slots + 1 or not sampler.shift_label:
            raise ValueError(f"the Transformers window is a shift_label draft's block + 1; got block {self.slots}, "
                             f"window {self.block_size}, shift_label={sampler.shift_label}")
        max_bs = int(sampler.out.numel()) // (self.slots - 1)
        self.out = torch.zeros(max_bs * self.slots, dtype=torch.int64, device=sampler.out.device)

    def __call__(self, hidden_states, input_ids=None):
        from sglang.srt.speculative import dflash_worker_v2 as w2

        hidden = padded_block(hidden_states, self.slots, self.block_size)
        bs = int(hidden.shape[0])
        proposals = w2.domino_greedy_rollout(draft_hidden=hidden, bonus_tokens=input_ids.view(bs, self.slots)[:, 0],
                                             in_cuda_graph=True, **rollout_modules(self.sampler))
        self.out[: bs * self.slots].copy_(proposals.reshape(-1))


def widened(sampler, window: int):
    """What upstream should read for the Transformers window: upstream's greedy Domino
    sampler widened to it, the q rule's already built for it, or None (eager)."""
    from sglang.srt.speculative.dflash_worker_v2 import _DominoDraftSampler

    from ..sampling.q_sampler import QRuleDraftSampler

    if isinstance(sampler, QRuleDraftSampler) and sampler.block_size == int(window):
        return sampler
    if isinstance(sampler, _DominoDraftSampler) and sampler.shift_label:
        return WindowProposals(sampler, window)
    return None


def foldable(sampler) -> bool:
    """Whether the in-graph sampler's proposals can be cut to a narrower width: the
    greedy Domino rollout, DFlash's argmax and the q rule's rollout (whose q the worker
    reads cut alike, `QRuleDraftSampler.read`); not the selector or LiLiCorr samplers,
    whose sampled outputs are read per request."""
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler, _DominoDraftSampler

    from ..sampling.q_sampler import QRuleDraftSampler

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


__all__ = ["FirstProposals", "WindowProposals", "at_width", "foldable", "widened"]
