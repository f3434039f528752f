"""The q rule's sampled rollout folded into the draft graph.

0.5.23 folds the greedy Domino rollout into the draft CUDA graph (`_DominoDraftSampler`)
and, for its selector drafts, a sampled tail (`_SelectorDraftSampler`): one graph that
always walks the sampling path, per-row parameters staged into static buffers before the
replay, coins drawn in the graph. `QRuleDraftSampler` is that pattern for the q rule: it
takes the place of the greedy Domino sampler (built from it, so it captures what upstream
would), runs `sampled_rollout.q_rollout` in the graph, and keeps the proposals (`out`,
which upstream reads as it reads the greedy sampler's) and q in static buffers that
`DominoDFlashWorker._accept_q_rule` reads (`read`). Greedy rows (top-k 1) propose the
argmax, so an all-greedy step is served by the same graph, and no rollout is computed and
thrown away.

Built only with a candidate pool (0 < K < V): q over the pool takes max_bs x (B - 2) x K
floats, over the whole vocabulary 2.3 GB at batch 256 for Qwen3's 151936 tokens; without
one the sampled rollout stays eager (logged at start-up).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from .rollout_inputs import padded_block, rollout_modules
from .sampled_rollout import DraftParams, QDraft, active_step, draft_coins, q_rollout

logger = logging.getLogger(__name__)


class QRuleDraftSampler:
    """The q rule's Domino rollout over the draft graph's block of `slots` slots, proposing
    `block_size` - 1 tokens (the block's, or for the Transformers window, `block_size` =
    slots + 1, the window's), in static buffers for up to `max_bs` requests."""

    def __init__(self, *, block_size: int, max_bs: int, slots: Optional[int] = None, hashed_coins: bool = True,
                 **rollout):
        self.rollout = rollout
        self.block_size = int(block_size)
        self.slots = int(slots) if slots is not None else self.block_size
        if self.block_size not in (self.slots, self.slots + 1) or (self.block_size > self.slots
                                                                   and not rollout.get("shift_label")):
            raise ValueError(f"the q rule's draft graph proposes for its block or, with shift_label, one slot more; "
                             f"got block {self.slots}, proposals for {self.block_size}")
        tp_group = rollout.get("tp_group")
        self.tp_size = int(tp_group.world_size) if tp_group is not None else 1
        self.hashed_coins = bool(hashed_coins)
        vocab, pool = int(rollout["vocab_size"]), int(rollout["candidate_pool_size"])
        n = self.block_size - 1
        if not (n > 1 and 0 < pool < vocab):
            raise ValueError(f"the captured q rule needs a block of 3 or more and 0 < candidate pool < vocabulary; "
                             f"got block {self.block_size}, pool {pool}, vocabulary {vocab}")
        device = rollout["lm_head_weight"].device
        rows = int(max_bs)
        # written by the host before a replay, or read after it: the graph holds their addresses
        self.params = DraftParams.empty(rows, device)
        self.uniforms = torch.empty((rows, n), dtype=torch.float32, device=device)
        self.out = torch.zeros((rows * n,), dtype=torch.int64, device=device)
        self.q_draft = torch.zeros((rows, n), dtype=torch.float32, device=device)
        self.q_first = torch.zeros((rows, vocab), dtype=torch.float32, device=device)
        self.pool_ids = torch.zeros((rows, pool), dtype=torch.int64, device=device)
        self.q_rest = torch.zeros((rows, n - 1, pool), dtype=torch.float32, device=device)

    @classmethod
    def replacing(cls, greedy, width: Optional[int] = None, **kwargs) -> "QRuleDraftSampler":
        """Built from 0.5.23's greedy `_DominoDraftSampler` (its modules, vocabulary shard
        and batch bound), proposing for `width` (default: its block)."""
        rollout = rollout_modules(greedy)
        slots = int(greedy.block_size)
        max_bs = int(greedy.out.numel()) // (slots - 1)
        return cls(block_size=int(width) if width is not None else slots, slots=slots, max_bs=max_bs, **rollout,
                   **kwargs)

    @property
    def nbytes(self) -> int:
        buffers = (*self.params, self.uniforms, self.out, self.q_draft, self.q_first, self.pool_ids, self.q_rest)
        return sum(t.numel() * t.element_size() for t in buffers)

    def stage(self, sampling_info, positions: torch.Tensor, bs: int) -> None:
        """The batch's sampling parameters into the static rows, before the draft replay."""
        self.params.stage(sampling_info, positions, bs)

    def __call__(self, hidden_states: torch.Tensor, input_ids: Optional[torch.Tensor] = None) -> None:
        """The capture hook (`make_draft_sampler_capture_hook`): the draft graph's tail."""
        if input_ids is None:
            raise RuntimeError("the q rule's draft sampler needs the block's input ids (its bonus tokens)")
        hidden = padded_block(hidden_states, self.slots, self.block_size)
        bs = int(hidden.shape[0])
        params = self.params.rows(bs)
        coins = draft_coins(params, self.uniforms[:bs].uniform_(), 0, hashed=self.hashed_coins)
        draft = q_rollout(params, coins, draft_hidden=hidden, bonus_tokens=input_ids.view(bs, self.slots)[:, 0],
                          **self.rollout)
        self.out[: draft.tokens.numel()].copy_(draft.tokens.reshape(-1))
        self.q_draft[:bs].copy_(draft.q_draft)
        self.q_first[:bs].copy_(draft.q_first)
        self.pool_ids[:bs].copy_(draft.pool_ids)
        self.q_rest[:bs].copy_(draft.q_rest)

    def read(self, bs: int, width: int) -> QDraft:
        """The last replay's first `width - 1` proposals of `bs` requests and their q."""
        n = self.block_size - 1
        full = QDraft(self.out[: bs * n].view(bs, n), self.q_draft[:bs], self.q_first[:bs], self.pool_ids[:bs],
                      self.q_rest[:bs])
        return full if int(width) - 1 == n else full.narrowed(int(width) - 1)


class BroadcastProposals:
    """Stands in for the draft runner's `forward` under tensor parallelism: after a replay
    of a step with sampled requests, rank 0's proposals go to every rank before upstream
    reads them for the verify (the eager rollout syncs its tokens alike). Ranks draw the
    same coins from equally seeded generators, so this guards, as 0.5.23's own
    `SGLANG_SPEC_TP_SYNC` sites do."""

    def __init__(self, worker, sampler: QRuleDraftSampler, sync):
        self.runner = worker.draft_model_runner
        self.forward = self.runner.forward
        self.sampler, self.sync = sampler, sync

    def install(self) -> "BroadcastProposals":
        self.runner.forward = self
        return self

    def __call__(self, forward_batch, *args, **kwargs):
        out = self.forward(forward_batch, *args, **kwargs)
        if getattr(out, "can_run_graph", False) and active_step() is not None:
            n = self.sampler.block_size - 1
            self.sync(self.sampler.out[: int(forward_batch.batch_size) * n])
        return out


def build(greedy, width: Optional[int] = None) -> Optional[QRuleDraftSampler]:
    """The captured q rule in place of upstream's greedy Domino sampler, proposing for
    `width` (its block, or the Transformers window), or None (logged) where it cannot be:
    no greedy sampler to take over, a block of two, no candidate pool."""
    from sglang.srt.speculative.dflash_worker_v2 import _DominoDraftSampler

    if not isinstance(greedy, _DominoDraftSampler):
        return None
    vocab, pool = int(greedy.vocab_size), int(greedy.candidate_pool_size)
    if int(greedy.block_size) < 3 or not 0 < pool < vocab:
        logger.info("sglang-domino q rule: sampled rollout kept eager (block %d, candidate pool %d of %d tokens: "
                    "the captured tail needs a block of 3 or more and a pool; "
                    "--speculative-domino-candidate-pool-size)", int(greedy.block_size), pool, vocab)
        return None
    sampler = QRuleDraftSampler.replacing(greedy, width)
    logger.info("sglang-domino q rule: sampled rollout captured in the draft graph (block %d, pool %d, up to %d "
                "requests, %.1f MiB of static buffers, tp=%d)", sampler.block_size, pool,
                int(sampler.uniforms.shape[0]), sampler.nbytes / 2 ** 20, sampler.tp_size)
    return sampler


__all__ = ["BroadcastProposals", "QRuleDraftSampler", "build"]
