"""One verify width per decode step in `DominoDFlashWorker` (the mechanism; the policy is
`sglang_domino.sglang.adaptive`).

0.5.23's `DFlashWorkerV2.forward_batch_generation` reads its width from `self.block_size`
on every use: the draft block buffers and positions, the draft hidden-state view, the
`DFlashVerifyInput`, `DFlashWorkerV2._accept_block` and the result's stride. It sizes its
step buffers from it once (`_ensure_draft_block_buffers`, `_ensure_accept_bonus_buffers`).
A step at another width therefore runs upstream's body unchanged with that width-dependent
state swapped in for the step (`WidthSwitch`), and, where the target has decode graphs,
the target's attention backend and verify graph runner of that width
(`verify_graphs.VerifyGraphs`). The scheduler takes each step's width from
the result (`GenerationBatchResult.speculative_num_draft_tokens`, read by
`batch_result_processor._get_speculative_output_stride`), as it does for EAGLE's adaptive
steps. The draft still runs on its whole block
(`draft_block.DraftBlockRunner`); width 1 skips it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Optional

import torch

from . import draft_tail
from ..seam.hooks import WIDTH_STATE


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
        # the target's verify graph per width (`verify_graphs.VerifyGraphs`), set once the
        # graphs are captured; None: every width verifies on the target as built
        self.graphs = None

    @contextlib.contextmanager
    def at(self, width: int):
        width = int(width)
        if width == self.home:
            yield
            return
        with self.graphs.at(width) if self.graphs is not None else contextlib.nullcontext():
            with self._worker_state(width):
                yield

    @contextlib.contextmanager
    def _worker_state(self, width: int):
        worker = self.worker
        home_state = {name: getattr(worker, name) for name in WIDTH_STATE}
        state = self.states.get(width) or _fresh_state(width, worker.device)
        sampler = worker._draft_sampler
        for name, value in state.items():
            setattr(worker, name, value)
        worker.block_size = worker.speculative_num_draft_tokens = width
        # the in-graph sampler's proposals (`_draft_sampler.out`) are block-wide: the step
        # reads their first width - 1 (`draft_tail`); None where they cannot be cut
        worker._draft_sampler = draft_tail.at_width(sampler, width)
        try:
            yield
        finally:
            self.states[width] = {name: getattr(worker, name) for name in WIDTH_STATE}
            for name, value in home_state.items():
                setattr(worker, name, value)
            worker.block_size = worker.speculative_num_draft_tokens = self.home
            worker._draft_sampler = sampler


class StepTimer:
    """What a decode step costs, per (batch size, width), for the adaptive policy.

    Inline steps (CPU, or no overlap scheduling): a step runs while
    `forward_batch_generation` runs, so the host time from one decode step's start to the
    next one's is that step's cost to the server (the worker's compute and the
    scheduler's own per-step work), charged to the step that began it (`lap`). A prefill
    or an idle gap in between breaks the chain.

    Overlap scheduling on a device: the scheduler launches step N, then waits for step
    N-1's results, then launches N+1, so a host lap from launch N to launch N+1 measures
    step N-1 (an isolated narrow probe would be charged the widest step's time, and the
    step after it the probe's). There each step records timing events around its launch
    on the current (forward) stream (`around_launch`), and their interval is read when
    the step's accept counts reach the host (`elapsed`, from `on_verify_complete_cpu`):
    the step's results were synchronised by then, so the read costs no sync; an event
    not yet complete gives no sample rather than a wait."""

    def __init__(self, events=None):
        # events: a factory of timing events (`torch.cuda.Event(enable_timing=True)`);
        # None: host laps
        self.events = events
        self.started: Optional[float] = None
        self.key: Optional[tuple[int, int]] = None

    @classmethod
    def for_device(cls, device, overlap: bool) -> "StepTimer":
        kind = torch.device(device).type
        module = torch.get_device_module(kind) if overlap and kind != "cpu" else None
        if module is not None and hasattr(module, "Event"):
            return cls(events=lambda: module.Event(enable_timing=True))
        return cls()

    @property
    def on_device(self) -> bool:
        return self.events is not None

    def lap(self) -> Optional[tuple[int, int, float]]:
        """Inline: a decode step starts now; (bs, width, seconds) of the previous one, if
        chained. On a device: None (see `elapsed`)."""
        if self.on_device:
            return None
        now = time.perf_counter()
        previous = (*self.key, now - self.started) if self.started is not None and self.key is not None else None
        self.started, self.key = now, None
        return previous

    def label(self, bs: int, width: int) -> None:
        self.key = (int(bs), int(width))

    def break_chain(self) -> None:
        self.started = self.key = None

    @contextlib.contextmanager
    def around_launch(self):
        """On a device: yields a list that holds (start, end) events recorded on the
        current stream around the step's launch; inline: an empty list."""
        marks: list = []
        if not self.on_device:
            yield marks
            return
        start = self.events()
        start.record()
        yield marks
        end = self.events()
        end.record()
        marks.extend((start, end))

    @staticmethod
    def elapsed(marks) -> Optional[float]:
        """Seconds between a step's events, once both have completed; None otherwise."""
        if not marks:
            return None
        start, end = marks
        if not end.query():
            return None
        return start.elapsed_time(end) / 1000.0


def broadcast_width(width: int) -> int:
    """Rank 0's choice on every TP rank (choices follow rank-local timings); gloo, host side."""
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().tp_group
    if group is None or int(group.world_size) <= 1:
        return int(width)
    value = torch.tensor([int(width)], dtype=torch.int64)
    torch.distributed.broadcast(value, src=group.ranks[0], group=group.cpu_group)
    return int(value.item())


__all__ = ["StepTimer", "WidthSwitch", "broadcast_width"]
