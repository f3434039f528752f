"""One verify width per decode step in `DominoDFlashWorker` (the mechanism; the policy is
`sglang_domino.verify_width`).

0.5.23's `DFlashWorkerV2.forward_batch_generation` (`dflash_worker_v2.py:2336-3014`)
reads its width from `self.block_size` on every use (block buffers `:2503-2515`,
positions `:2538`, draft hidden view `:2703`, verify input `:2827`, accept `:2228`,
result stride `:3008`) and sizes its step buffers from it once
(`_ensure_draft_block_buffers` `:1093`, `_ensure_accept_bonus_buffers` `:2135`). A step at
another width therefore runs upstream's body unchanged with that width-dependent state
swapped in for the step (`WidthSwitch`); the scheduler takes each step's width from the
result (`speculative_num_draft_tokens`, `batch_result_processor.py:90`), as it does for
EAGLE's adaptive steps. The draft still runs on its whole block
(`DominoDFlashWorker._run_draft_on_block`); width 1 skips it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Optional

import torch

# `DFlashWorkerV2.__init__` attributes whose shape or content follows the width
# (`dflash_worker_v2.py:568-615`).
WIDTH_STATE = (
    "_block_pos_offsets",
    "_draft_block_ids_buf", "_draft_block_positions_buf", "_draft_block_tokens_buf",
    "_draft_verify_out_cache_loc_buf", "_draft_block_end_buf", "_draft_seq_lens_cpu_buf",
    "_accept_bonus_buffer_cap", "_accept_bonus_buffer_slot", "_accept_len_buf",
    "_commit_lens_bufs", "_bonus_id_bufs", "_out_tokens_bufs", "_new_seq_lens_bufs",
)


def _fresh_state(width: int, device) -> dict:
    state = {name: None for name in WIDTH_STATE}
    state.update(_block_pos_offsets=torch.arange(int(width), device=device, dtype=torch.int64),
                 _accept_bonus_buffer_cap=0, _accept_bonus_buffer_slot=0, _commit_lens_bufs=[],
                 _bonus_id_bufs=[], _out_tokens_bufs=[], _new_seq_lens_bufs=[])
    return state


class WidthSwitch:
    """Upstream's width-dependent worker state, one set per width; the home width (the
    verify window the worker was built with) is restored after every step, so prefill,
    idle and every other path see upstream's worker as built."""

    def __init__(self, worker):
        self.worker = worker
        self.home = int(worker.block_size)
        self.states: dict[int, dict] = {}

    @contextlib.contextmanager
    def at(self, width: int):
        worker, width = self.worker, int(width)
        if width == self.home:
            yield
            return
        home_state = {name: getattr(worker, name) for name in WIDTH_STATE}
        state = self.states.get(width) or _fresh_state(width, worker.device)
        sampler = worker._draft_sampler
        for name, value in state.items():
            setattr(worker, name, value)
        worker.block_size = worker.speculative_num_draft_tokens = width
        # the in-graph samplers read the graph's output as `home` wide (`:2692-2699`, `:2733`)
        worker._draft_sampler = None
        try:
            yield
        finally:
            self.states[width] = {name: getattr(worker, name) for name in WIDTH_STATE}
            for name, value in home_state.items():
                setattr(worker, name, value)
            worker.block_size = worker.speculative_num_draft_tokens = self.home
            worker._draft_sampler = sampler


class StepClock:
    """Seconds from one decode step's start to the next one's: what a step costs the
    server (the worker's compute and the scheduler's own per-step work) on this machine.
    A prefill or an idle gap in between breaks the chain: no sample. Under CUDA overlap
    scheduling the interval is the steady-state step time, attributed to the step that
    began it."""

    def __init__(self):
        self.started: Optional[float] = None
        self.key: Optional[tuple[int, int]] = None

    def lap(self) -> Optional[tuple[int, int, float]]:
        """A decode step starts now; (bs, width, seconds) of the previous one, if chained."""
        now = time.perf_counter()
        previous = (*self.key, now - self.started) if self.started is not None and self.key is not None else None
        self.started, self.key = now, None
        return previous

    def label(self, bs: int, width: int) -> None:
        self.key = (int(bs), int(width))

    def break_chain(self) -> None:
        self.started = self.key = None


def adaptive_config():
    """The `AdaptiveWidthConfig` argument resolution validated and passed to this
    scheduler (ADAPTIVE_ENV), or None without `--speculative-adaptive`."""
    import os

    from ..verify_width import AdaptiveWidthConfig
    from . import ADAPTIVE_ENV

    raw = os.environ.get(ADAPTIVE_ENV)
    return AdaptiveWidthConfig.model_validate_json(raw) if raw else None


def broadcast_width(width: int) -> int:
    """Rank 0's choice on every TP rank (choices follow rank-local timings); gloo, host side."""
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().tp_group
    if group is None or int(group.world_size) <= 1:
        return int(width)
    value = torch.tensor([int(width)], dtype=torch.int64)
    torch.distributed.broadcast(value, src=group.ranks[0], group=group.cpu_group)
    return int(value.item())


__all__ = ["StepClock", "WidthSwitch", "adaptive_config", "broadcast_width"]
