"""The draft runs on its own block when the verify window differs from it.

Upstream builds the draft batch as wide as the verify window and runs the draft runner
on it. Three modes need another width (`DominoDFlashWorker` sets them up):
  * b8: draft block B wider than the window W. The block-B draft runs whole; its first
    W - 1 proposals are verified, so the target computes W positions per request.
  * the Transformers window (`--speculative-num-draft-tokens` B + 1): W = B + 1 for a `shift_label`
    Domino draft; the rollout proposes B tokens from slots 0..B-1.
  * `--speculative-adaptive`: every width below the block; width 1 drafts nothing.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import torch

logger = logging.getLogger(__name__)


class DraftBlockRunner:
    """Stands in for the draft model runner's `forward` on one worker.

    A TARGET_VERIFY batch of the step's window (`worker.block_size`) is given
    `draft_block` slots per request instead: the window's first slots (the bonus and mask
    tokens) cut or extended with mask slots, at positions `seq_len + 0..draft_block-1`,
    with their `req_to_token` cache slots and a KV plan of their own. Hidden states come
    back window-wide: the first `window` slots of the block (b8: the rollout and the
    greedy head read slots 0..W-1, so the proposals are the block-B draft's first W - 1),
    or zero-padded (the Transformers window: the padded slot is never read; `shift_label`
    reads slots 0..window-2). Anything else goes to the runner's own `forward`."""

    def __init__(self, worker, draft_block: int):
        self.worker = worker
        self.draft_block = int(draft_block)
        self.runner = worker.draft_model_runner
        self.forward = self.runner.forward
        self.target_runner = worker.model_runner  # its KV pools are allocated after __init__
        self.offsets = torch.arange(self.draft_block, device=worker.device, dtype=torch.int64)
        self.mask_id = int(worker._mask_token_id)
        self.hidden_size = int(worker.draft_model.config.hidden_size)

    def install(self) -> "DraftBlockRunner":
        self.runner.forward = self
        return self

    def __call__(self, forward_batch, *args, **kwargs):
        bs, window = int(forward_batch.batch_size), int(self.worker.block_size)  # this step's width
        if (window == self.draft_block or not forward_batch.forward_mode.is_target_verify()
                or forward_batch.input_embeds is None or forward_batch.input_ids.numel() != bs * window):
            return self.forward(forward_batch, *args, **kwargs)
        if window == 1:
            # a plain decode step: no proposal to draft; the draft's context cache is
            # written from the target's hidden states after the verify, as every step
            hidden = torch.zeros(bs, self.hidden_size, dtype=self.runner.dtype, device=forward_batch.input_ids.device)
            return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=hidden), can_run_graph=False)
        out = self.forward(self._block_batch(forward_batch, bs, window), *args, **kwargs)
        hidden = out.logits_output.hidden_states.view(bs, self.draft_block, -1)
        if self.draft_block >= window:
            hidden = hidden[:, :window]
        else:
            hidden = torch.cat((hidden, hidden.new_zeros(bs, window - self.draft_block, hidden.shape[-1])), 1)
        out.logits_output.hidden_states = hidden.reshape(bs * window, -1)
        return out

    def _block_batch(self, forward_batch, bs: int, window: int):
        block, offsets = self.draft_block, self.offsets
        block_batch = copy.copy(forward_batch)
        block_batch.input_ids = self._resize(forward_batch.input_ids, window, fill=self.mask_id)
        block_batch.input_embeds = self._resize(forward_batch.input_embeds, window)
        block_batch.positions = (forward_batch.positions.view(bs, window)[:, :1] + offsets).reshape(-1)
        cols = forward_batch.seq_lens.to(torch.int64)[:, None] + offsets
        rows = forward_batch.req_pool_indices.to(torch.int64)[:, None]
        locs = self.target_runner.req_to_token_pool.req_to_token[rows, cols]
        extra = block - window
        if extra > 0 and block_batch.seq_lens_cpu is not None:  # host bound: committed + block
            block_batch.seq_lens_cpu = block_batch.seq_lens_cpu + extra
            block_batch.seq_lens_sum = int(block_batch.seq_lens_sum) + bs * extra
        old_plan = forward_batch.kv_loc_plan
        plan = self.target_runner.kv_index_translator.plan(
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            seq_lens_cpu=old_plan.seq_lens_cpu if old_plan is not None else None,
            write_virtual=locs.reshape(-1).to(forward_batch.out_cache_loc.dtype),
            read_extent=block,
        )
        plan.bind(block_batch, self.runner.kv_index_translator)
        if getattr(block_batch, "num_token_non_padded", None) is not None:
            block_batch.num_token_non_padded = torch.full_like(block_batch.num_token_non_padded, bs * block)
        block_batch.global_num_token_non_padded_cpu = bs * block
        return block_batch

    def _resize(self, t: torch.Tensor, window: int, fill=None) -> torch.Tensor:
        """[bs * window, ...] -> [bs * draft_block, ...]; new slots repeat `fill` or the
        last window slot (a mask slot: slot 0 is the only non-mask one)."""
        block = self.draft_block
        rows = t.view(-1, window, *t.shape[1:])
        if block <= window:
            out = rows[:, :block]
        else:
            extra = rows[:, -1:].expand(-1, block - window, *t.shape[1:])
            if fill is not None:
                extra = torch.full_like(extra, fill)
            out = torch.cat((rows, extra), dim=1)
        return out.reshape(-1, *t.shape[1:])


# -- b8: the decode KV reservation covers the draft block ----------------------------------
_reserve_extra = 0


def around_decode_alloc_lens(original, reqs, *args, reserve, **kwargs):
    """`DFlashDraftInputV2.prepare_for_decode` reserves 2 x window past the committed
    length: one window of host lag under overlap scheduling, one for the step's writes. A
    draft block wider than the window writes the whole block."""
    return original(reqs, *args, reserve=reserve + _reserve_extra, **kwargs)


def reserve_draft_block(extra: int) -> None:
    """Reserve `extra` more KV slots per request and decode step (draft block - window); the
    `b8 reservation` group applies it (installed with the worker's other groups)."""
    global _reserve_extra
    _reserve_extra = int(extra)


# -- b8 on a hybrid target: per-position state buffers for the window ------------------------
def around_init_mamba_pool(original, self, *args, speculative_num_draft_tokens=None, **kwargs):
    """0.5.23 sizes a hybrid target's per-position recurrent-state and conv-window buffers
    (`MambaPool`, one state per verified position and running request) with
    `max_speculative_num_draft_tokens`, which this plugin raises to the draft block for
    the draft's forward (`plugin.around_max_draft_tokens`). The target verifies only the
    window, and 0.5.23's memory budget counts only the window's states
    (`kv_cache_configurator`): the buffers are sized for the window."""
    from sglang.srt.runtime_context import get_spec

    window = get_spec().speculative_num_draft_tokens
    if speculative_num_draft_tokens is not None and window is not None and speculative_num_draft_tokens > window:
        logger.info("sglang-domino b8: per-position recurrent-state buffers for the %d verified positions "
                    "(not the %d-token draft block)", int(window), int(speculative_num_draft_tokens))
        speculative_num_draft_tokens = int(window)
    return original(self, *args, speculative_num_draft_tokens=speculative_num_draft_tokens, **kwargs)
