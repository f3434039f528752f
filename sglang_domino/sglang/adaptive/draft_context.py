"""The draft's context for tokens committed by adaptive width-1 steps, written when the
draft next needs it (`DeferredContext`).

After every verify, 0.5.23 writes the committed tokens' context into the draft's KV cache
(`DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc`: the target's captured hidden
states projected, then K and V of every draft layer). A width-1 step proposes nothing and
the draft does not run, so nothing reads that context until the draft runs again; at one
token per request the write is almost all fixed cost (on the CPU test bed about 0.9 ms of a
10 ms step, docs/adaptive-width.md). So a width-1 step keeps its rows (the target's hidden
states, the draft-pool slots, the positions, the commit lengths) and they are written in one
call, before anything could read or reuse those slots:
  * before a step that drafts (width > 1) and before any forward that is not a decode step
    (prefill, mixed, idle): those run the draft or write the draft cache, and a new
    request's prefill comes before anything reads a prefix it shares with a finished one;
  * when `max_steps` width-1 steps are kept (memory: max_steps x batch x the captured
    hidden size).
A request that leaves the batch (finished, aborted, retracted) keeps its rows until then:
its slots may go to the prefix cache, read only after a later prefill (written before it),
or back to the allocator, where the only writer before the next write of the kept rows is
another width-1 step, whose row for the slot is kept after it. So within one write the
latest row of a slot is the one that counts, and the older ones are left out
(`latest_rows`: their commit length set to 0, which upstream's prefix-valid write skips).
Until 2026-12-04 a departure wrote every kept row at once: at concurrency 16 with requests
ending at different steps that was a write (about 2-3 ms on the CPU test bed, almost all
fixed cost) every 6-7 steps instead of every 16.
The written rows are the ones upstream would have written at each step: the same call on
the same rows, later, so the draft's cache is the same when the draft reads it.
The same on CPU and on a device (a width-1 step of `decode_step.DecodeStep` either way, or
0.5.23's step at one token): the kept rows stay where the step made them, kept and written
by copies, one concatenation and a stable sort, with no host read
(tests/sglang/test_draft_context.py, tests/sglang/test_width_one_device.py on fake CUDA).

One write's rows are padded to a power of two (`padded_rows`) with rows of commit length 0,
which the write projects and leaves out. The number of kept rows is almost never the same
twice, and a matrix product of a shape not seen before is slow in bfloat16 on the CPU
(oneDNN makes a kernel per shape: on a 2-core Intel Xeon with AMX a 1024 x 1024 product of
100-1000 rows took 1.5-6.5 ms the first time and 0.4-1.8 ms after), so writes of new row
counts cost 11-31 ms where a repeated one costs about 1 (a served bfloat16 c8 run,
docs/adaptive-width.md). Padded, a server sees at most log2(`MAX_STEPS` x batch) counts,
for at most twice the projection's rows.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# width-1 steps kept at most before their rows are written
MAX_STEPS = 16


class DeferredContext:
    """Width-1 steps' draft-context rows, kept until the draft needs them.

    `write` is upstream's `_append_target_hidden_to_draft_kv_by_loc` bound to the worker."""

    def __init__(self, write: Callable[..., None], max_steps: int = MAX_STEPS):
        self.write = write
        self.max_steps = int(max_steps)
        self.rows: list[tuple[torch.Tensor, ...]] = []   # (hidden, cache_loc, positions, commit_lens) per step
        self.keeping = False                             # inside a width-1 step: `keep` instead of writing
        self.written_steps = 0                           # steps written late (for tests and logs)

    def before_step(self, width: Optional[int]) -> None:
        """Called before each forward: `width` the decode step's verify width (None: not a
        decode step); the rows are written where the docstring of the module says."""
        if self.rows and (width is None or width > 1 or len(self.rows) >= self.max_steps):
            self.flush()

    def keep(self, *, target_hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor,
             cache_loc_2d: Optional[torch.Tensor] = None, commit_lens: Optional[torch.Tensor] = None,
             **_) -> None:
        """One width-1 step's rows (the verify's arguments to upstream's append). The
        tensors are copied: the hidden states live in the target's shared capture buffer
        and the slots and positions in step buffers, all rewritten by the next step."""
        n = int(cache_loc.numel())
        if commit_lens is None:   # every row committed
            commit_lens = torch.ones(n, dtype=torch.int32, device=cache_loc.device)
        if cache_loc_2d is not None and int(cache_loc_2d.shape[1]) != 1:
            raise RuntimeError(f"sglang-domino: a deferred draft-context step must verify one token per request, "
                               f"got {int(cache_loc_2d.shape[1])}")
        self.rows.append((target_hidden[:n].clone(), cache_loc.clone(), positions.clone(),
                          commit_lens.to(torch.int32).clone()))

    def flush(self) -> None:
        """Every kept row written into the draft's KV cache, in one call."""
        if not self.rows:
            return
        hidden, cache_loc, positions, commit_lens = (torch.cat(parts) for parts in zip(*self.rows))
        if len(self.rows) > 1:
            commit_lens = latest_rows(cache_loc, commit_lens)
        hidden, cache_loc, positions, commit_lens = padded_rows(hidden, cache_loc, positions, commit_lens)
        self.written_steps += len(self.rows)
        self.rows.clear()
        self.write(target_hidden=hidden, cache_loc=cache_loc, positions=positions,
                   cache_loc_2d=cache_loc.view(-1, 1), commit_lens=commit_lens)

    def drop(self) -> None:
        """The KV pools were reset (`flush_cache`): nothing kept is owed."""
        self.rows.clear()


def padded_rows(hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor,
                commit_lens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows padded to the next power of two: hidden states and positions of zeros, the
    last row's slot, commit length 0 (projected, not written; see the module's docstring)."""
    n = int(cache_loc.numel())
    pad = (1 << max(n - 1, 0).bit_length()) - n
    if n == 0 or pad <= 0:
        return hidden, cache_loc, positions, commit_lens
    return (torch.cat([hidden, hidden.new_zeros(pad, *hidden.shape[1:])]),
            torch.cat([cache_loc, cache_loc[-1:].expand(pad)]),
            torch.cat([positions, positions.new_zeros(pad)]),
            torch.cat([commit_lens, commit_lens.new_zeros(pad)]))


def latest_rows(cache_loc: torch.Tensor, commit_lens: torch.Tensor) -> torch.Tensor:
    """`commit_lens` (one row per slot in `cache_loc`, in step order) with every row that a
    later committed row of the same slot overwrites set to 0. Fixed-size ops, no host read:
    a stable sort puts a slot's rows together in step order, and the last of each run is
    the one kept."""
    committed = commit_lens > 0
    # rows not committed sort first within their slot, so they never shadow a committed one
    key = cache_loc.to(torch.int64) * 2 + committed.to(torch.int64)
    order = torch.sort(key, stable=True).indices
    slots = cache_loc[order]
    last = torch.ones_like(committed)
    last[:-1] = slots[1:] != slots[:-1]
    keep = torch.empty_like(committed).scatter_(0, order, last)
    return torch.where(keep & committed, commit_lens, torch.zeros_like(commit_lens))


__all__ = ["MAX_STEPS", "DeferredContext", "latest_rows", "padded_rows"]
