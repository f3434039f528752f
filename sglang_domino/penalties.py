"""Sampling penalties at every position of a verified block, as plain decoding applies them.

Plain decoding (SGLang's `penaltylib`) penalises the logits of output token t with what
the request generated before t:
  * frequency: minus `frequency` times the count of each token so far;
  * presence: minus `presence` once for each token seen so far;
  * min new tokens: the stop tokens at minus infinity while fewer than `min_new` tokens
    were generated;
  * repetition: each token seen so far scaled, `x * r` where x < 0 and `x / r` elsewhere,
    after the additive penalties (0.5.23 adds the additive ones, then scales).

A verify block's row i predicts the token after `candidates[:, i]` (column 0 is the last
committed token, the others the drafts): its history is the committed output plus
`candidates[:, :i + 1]`. `apply_block_penalties` gives each row exactly that, without a
`[bs, W, V]` temporary per penalty: the committed part is one dense `[bs, V]` term
broadcast over the block; the block's own tokens touch at most W entries per row, which
are recomputed from the untouched logits and written back. Rows whose draft prefix is
rejected are never read, so the result equals plain decoding wherever it is used.

Device-agnostic, no host read: runs on the verify's device, inside or outside a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class BlockPenalties:
    """One step's penalty inputs, one row per request (all on the logits' device).

    `counts` [bs, V] float32: each token's count in the request's committed output,
    excluding `candidates[:, 0]` (the last committed token, counted from the block).
    `generated` [bs] int64: how many output tokens `counts` holds.
    `stop_ids` [bs, K] int64 and `stop_valid` [bs, K] bool: the request's stop tokens, or
    None when no request asks for min new tokens. Entries naming the same token of a row
    must agree in `stop_valid` (pad with a repeat of a real entry, or with entries all
    invalid), since all of them write that logit. Unused penalties are None."""

    counts: torch.Tensor
    generated: torch.Tensor
    frequency: Optional[torch.Tensor] = None    # [bs] float32
    presence: Optional[torch.Tensor] = None     # [bs] float32
    repetition: Optional[torch.Tensor] = None   # [bs] float32
    min_new: Optional[torch.Tensor] = None      # [bs] int64
    stop_ids: Optional[torch.Tensor] = None
    stop_valid: Optional[torch.Tensor] = None
    # known on the host: True when every repetition factor is >= 1, False when every one
    # is <= 1, None when mixed or unknown (only speed depends on it)
    repetition_at_least_one: Optional[bool] = None


def block_occurrences(candidates: torch.Tensor) -> torch.Tensor:
    """[bs, W, W]: entry (b, i, j) counts the token `candidates[b, j]` in
    `candidates[b, :i + 1]`, the block's share of row i's history."""
    width = candidates.shape[1]
    same = candidates[:, :, None] == candidates[:, None, :]            # [b, j, j'] token j == token j'
    upto = torch.ones(width, width, dtype=torch.bool, device=candidates.device).tril()   # [i, j']: j' <= i
    return torch.einsum("bjk,ik->bij", same.to(torch.float32), upto.to(torch.float32))


def apply_block_penalties(logits: torch.Tensor, candidates: torch.Tensor, pen: BlockPenalties) -> None:
    """Penalise `logits` [bs, W, V] in place, row i with the history that precedes it."""
    bs, width, vocab = logits.shape
    cand = candidates.to(torch.int64)
    idx = cand[:, None, :].expand(bs, width, width)       # (b, i, j) -> token candidates[b, j]
    k = block_occurrences(cand)                           # its count in row i's block history
    counts_at = pen.counts.gather(1, cand)[:, None, :]    # its count before the block [b, 1, j]

    if pen.frequency is not None or pen.presence is not None:
        untouched = logits.gather(2, idx)
        base = torch.zeros(bs, vocab, dtype=torch.float32, device=logits.device)
        at = torch.zeros(bs, width, width, dtype=torch.float32, device=logits.device)
        if pen.frequency is not None:
            f = pen.frequency.to(torch.float32)[:, None]
            base.sub_(pen.counts * f)
            at.sub_((counts_at + k) * f[:, :, None])
        if pen.presence is not None:
            p = pen.presence.to(torch.float32)[:, None]
            base.sub_((pen.counts > 0) * p)
            at.sub_(((counts_at + k) > 0) * p[:, :, None])
        logits.add_(base[:, None, :].to(logits.dtype))
        # the block's tokens: their untouched logit plus the penalty of row i's history
        # (equal for every j naming the same token, so the scatter is consistent)
        logits.scatter_(2, idx, untouched + at.to(logits.dtype))

    if pen.min_new is not None and pen.stop_ids is not None:
        # row i generates output token number generated + 1 + i (candidates[:, 0] is one)
        position = pen.generated[:, None] + 1 + torch.arange(width, device=logits.device)[None, :]
        blocked = position < pen.min_new[:, None]                               # [b, i]
        stop = pen.stop_ids[:, None, :].expand(bs, width, pen.stop_ids.shape[1])
        current = logits.gather(2, stop)
        block = blocked[:, :, None] & pen.stop_valid[:, None, :]
        logits.scatter_(2, stop, torch.where(block, torch.full_like(current, float("-inf")), current))

    if pen.repetition is not None:
        r = pen.repetition.to(torch.float32)
        before = logits.gather(2, idx)
        dense = torch.where(pen.counts > 0, r[:, None], torch.ones_like(r)[:, None]).to(logits.dtype)
        # row by row, each operand a contiguous [bs, V]; the same elementwise products and
        # quotients as 0.5.23's scaling, one of the two kept. With every factor >= 1 the
        # one kept is the smaller (x < 0: x * r <= x / r; x >= 0: x / r <= x * r), with
        # every factor <= 1 the larger: `minimum` picks it where `where` is 15 x slower
        # on CPU.
        pick = {True: torch.minimum, False: torch.maximum}.get(pen.repetition_at_least_one)
        for i in range(width):
            row = logits[:, i]
            scaled, divided = row * dense, row / dense
            if pick is None:
                row.copy_(torch.where(row < 0, scaled, divided))
            else:
                pick(scaled, divided, out=row)
        touched = torch.where((counts_at + k) > 0, r[:, None, None], torch.ones_like(r)[:, None, None])
        touched = touched.to(logits.dtype)
        logits.scatter_(2, idx, torch.where(before < 0, before * touched, before / touched))


def commit_counts(counts: torch.Tensor, generated: torch.Tensor, rows: torch.Tensor, candidates: torch.Tensor,
                  accept_len: torch.Tensor) -> None:
    """After a verify: the last committed token and the accepted drafts
    (`candidates[:, :accept_len + 1]`) join the committed output of each row of the pools
    `counts` [P, V] and `generated` [P] (rows `rows` [bs])."""
    bs, width = candidates.shape
    taken = torch.arange(width, device=candidates.device)[None, :] <= accept_len.to(torch.int64)[:, None]
    r = rows.to(torch.int64)[:, None].expand(bs, width)
    counts.index_put_((r, candidates.to(torch.int64)), taken.to(counts.dtype), accumulate=True)
    generated.index_add_(0, rows.to(torch.int64), accept_len.to(generated.dtype) + 1)


__all__ = ["BlockPenalties", "apply_block_penalties", "block_occurrences", "commit_counts"]
