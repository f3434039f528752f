"""Sampling penalties of a DFLASH server, exact at every position of a verified block.

0.5.23's DFLASH step feeds its requests' outputs to no penalizer (its
`DFlashDraftInputV2.prepare_for_decode` skips `cumulate_penalty_output_tokens`, which the
plain decode step calls) and broadcasts one penalty over the block
(`apply_dflash_verify_logits_adjustments`): inside a block `min_tokens` is ignored after
the first token and frequency, presence and repetition penalties see no output. This
module keeps each request's committed output on the worker's device and penalises every
row of the block with the history that precedes it (`sglang_domino.penalties`), as plain
decoding does token by token.

`PenaltyPool` holds, per request-pool row (`req.kv.req_pool_idx`), the count of every token
the request committed, how many it committed, and its penalty parameters. A row starts
empty when a request is prefilled (`forget`; a retracted request is prefilled again and
starts empty, as the plain server's penalizers start anew) or first decoded in this
worker (a prefill-decode server's decode side). The last committed token of a step is
counted by the next step, where it is the block's column 0, so nothing is read back from
the device: the counts are written after each verify from the accepted length on the
device, and stream order keeps them ahead of the next step.

Steps without a penalty or a custom logit processor (the usual case) cost two attribute
reads and run upstream's code. Otherwise the whole adjustment (penalties, then
`logit_bias`, then custom logit processors, each row given the request as it is at that
row: plain decoding's order) runs in the worker's `_accept_block` and upstream's
block-wide adjustment is skipped for that step (`around_verify_logits_adjustments`); the
grammar mask upstream applies in between is a minus-infinity mask, unchanged by them.
"""

from __future__ import annotations

import array
import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ...penalties import BlockPenalties, apply_block_penalties, commit_counts

_active: Optional["StepPenalties"] = None


def penalised(params) -> bool:
    """Whether a request's sampling parameters ask for a penalty 0.5.23's penalizers apply."""
    return (float(params.frequency_penalty) != 0.0 or float(params.presence_penalty) != 0.0
            or float(params.repetition_penalty) != 1.0 or int(params.min_new_tokens) > 0)


def stop_tokens(req) -> list[int]:
    """The tokens `min_new_tokens` holds back: the request's stop ids, its EOS ids and the
    tokenizer's (as 0.5.23's `BatchedMinNewTokensPenalizer` gathers them)."""
    tokenizer = getattr(req, "tokenizer", None)
    ids = set(req.sampling_params.stop_token_ids or ()) | set(getattr(req, "eos_token_ids", None) or ())
    if tokenizer is not None:
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            ids.add(tokenizer.eos_token_id)
    return sorted(t for t in ids if t is not None)


def batch_penalised(sampling_info) -> bool:
    """0.5.23 accumulates penalties for the forward (`copy_for_forward`) exactly when a
    request of the batch has one: an O(1) test before looking at the requests."""
    if sampling_info is None:
        return False
    if getattr(sampling_info, "acc_additive_penalties", None) is not None:
        return True
    if getattr(sampling_info, "acc_scaling_penalties", None) is not None:
        return True
    orchestrator = getattr(sampling_info, "penalizer_orchestrator", None)
    return bool(orchestrator is not None and orchestrator.is_required)


class PenaltyPool:
    """Committed-output counts and penalty parameters per request-pool row, allocated at
    the first penalised step (`[rows, vocab]` float32, e.g. 30 MB for 50 rows of Qwen3's
    vocabulary) and kept for the server's life."""

    def __init__(self, rows: Callable[[], int], vocab: int, device):
        """`rows()`: the request pool's row count (the pool is built after the worker)."""
        self._pool_rows, self.vocab, self.device = rows, int(vocab), torch.device(device)
        self.owner: dict[int, str] = {}
        self.counts: Optional[torch.Tensor] = None

    def _allocate(self) -> None:
        self.rows = rows = int(self._pool_rows())
        dev = self.device
        self.counts = torch.zeros(rows, self.vocab, dtype=torch.float32, device=dev)
        self.generated = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.frequency = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.presence = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.repetition = torch.ones(rows, dtype=torch.float32, device=dev)
        self.min_new = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.stop_ids = torch.zeros(rows, 1, dtype=torch.int64, device=dev)
        self.stop_valid = torch.zeros(rows, 1, dtype=torch.bool, device=dev)

    def forget(self, reqs) -> None:
        """A prefill of `reqs`: their rows start anew at their next decode step."""
        if self.owner:
            for req in reqs:
                self.owner.pop(int(req.kv.req_pool_idx), None)

    def step(self, batch) -> Optional["StepPenalties"]:
        """The adjustments of a decode step of `batch` this module makes per position, or
        None when the step has no penalised request and no custom logit processor."""
        sampling_info = batch.sampling_info
        custom = bool(getattr(sampling_info, "has_custom_logit_processor", False))
        rows = params = None
        if batch_penalised(sampling_info):
            reqs = list(batch.reqs)
            params = [req.sampling_params for req in reqs]
            if any(penalised(p) for p in params):
                if self.counts is None:
                    self._allocate()
                self._admit(reqs)
                rows = batch.req_pool_indices.to(device=self.device, dtype=torch.int64)
            else:
                params = None
        if rows is None and not custom:
            return None
        return StepPenalties(self, rows, params, custom=custom)

    def _admit(self, reqs) -> None:
        """Rows of requests this pool has not seen since their prefill start empty, with
        their parameters."""
        fresh = [req for req in reqs if self.owner.get(int(req.kv.req_pool_idx)) != req.rid]
        if not fresh:
            return
        stops = [stop_tokens(req) for req in fresh]
        width = max(1, max(len(s) for s in stops))
        # A row's padding repeats its first stop id, marked as that id is (a stop token of
        # the row, or not for a row without any): every write the block's scatter makes to
        # one logit then agrees.
        if width > self.stop_ids.shape[1]:
            grow = width - self.stop_ids.shape[1]
            self.stop_ids = torch.cat([self.stop_ids, self.stop_ids[:, :1].expand(-1, grow)], dim=1)
            self.stop_valid = torch.cat([self.stop_valid, self.stop_valid[:, :1].expand(-1, grow)], dim=1)
        width = self.stop_ids.shape[1]
        padded = [(s + [s[0]] * (width - len(s))) if s else [0] * width for s in stops]
        valid = [[bool(s)] * width for s in stops]
        idx = torch.tensor([int(req.kv.req_pool_idx) for req in fresh], dtype=torch.int64).to(self.device)
        sp = [req.sampling_params for req in fresh]
        self.counts.index_fill_(0, idx, 0.0)
        self.generated.index_fill_(0, idx, 0)
        self.frequency.index_copy_(0, idx, _tensor([p.frequency_penalty for p in sp], torch.float32, self.device))
        self.presence.index_copy_(0, idx, _tensor([p.presence_penalty for p in sp], torch.float32, self.device))
        self.repetition.index_copy_(0, idx, _tensor([p.repetition_penalty for p in sp], torch.float32, self.device))
        self.min_new.index_copy_(0, idx, _tensor([p.min_new_tokens for p in sp], torch.int64, self.device))
        self.stop_ids.index_copy_(0, idx, _tensor(padded, torch.int64, self.device))
        self.stop_valid.index_copy_(0, idx, _tensor(valid, torch.bool, self.device))
        for req in fresh:
            self.owner[int(req.kv.req_pool_idx)] = req.rid


def _tensor(values, dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass
class StepPenalties:
    """One decode step's per-position adjustments: `apply` before the accept, `commit`
    after it. `rows` is None when no request has a penalty (only custom processors)."""

    pool: PenaltyPool
    rows: Optional[torch.Tensor]     # [bs] request-pool rows, on the device
    params: Optional[list]           # the requests' sampling parameters (host)
    custom: bool = False             # a request has a custom logit processor

    def inputs(self) -> BlockPenalties:
        pool, rows, params = self.pool, self.rows, self.params
        any_of = lambda test: any(test(p) for p in params)   # noqa: E731
        min_new = any_of(lambda p: int(p.min_new_tokens) > 0)
        return BlockPenalties(
            counts=pool.counts.index_select(0, rows), generated=pool.generated.index_select(0, rows),
            frequency=pool.frequency.index_select(0, rows) if any_of(lambda p: p.frequency_penalty != 0) else None,
            presence=pool.presence.index_select(0, rows) if any_of(lambda p: p.presence_penalty != 0) else None,
            repetition=pool.repetition.index_select(0, rows) if any_of(lambda p: p.repetition_penalty != 1) else None,
            min_new=pool.min_new.index_select(0, rows) if min_new else None,
            stop_ids=pool.stop_ids.index_select(0, rows) if min_new else None,
            stop_valid=pool.stop_valid.index_select(0, rows) if min_new else None,
            repetition_at_least_one=(True if all(p.repetition_penalty >= 1 for p in params)
                                     else False if all(p.repetition_penalty <= 1 for p in params) else None))

    def apply(self, next_token_logits: torch.Tensor, candidates: torch.Tensor, sampling_info) -> None:
        """Plain decoding's adjustments of every row of the block, in its order:
        penalties (additive, then scaling), the request's logit bias, a custom logit
        processor."""
        bs, width = candidates.shape
        logits = next_token_logits.view(bs, width, -1)
        if self.rows is not None:
            vocab = self.pool.vocab
            apply_block_penalties(logits[..., :vocab] if logits.shape[-1] != vocab else logits, candidates,
                                  self.inputs())
        bias = getattr(sampling_info, "logit_bias", None)
        if bias is not None:
            logits.add_(bias.to(device=logits.device, dtype=logits.dtype)[:, None, :])
        if self.custom:
            apply_custom_processors_per_position(next_token_logits, candidates, sampling_info)

    def commit(self, candidates: torch.Tensor, accept_len: torch.Tensor) -> None:
        if self.rows is not None:
            commit_counts(self.pool.counts, self.pool.generated, self.rows, candidates, accept_len)


class _RequestAt:
    """A request as a custom logit processor sees it at one row of a verified block: its
    output followed by the block's drafts before that row; every other attribute the
    request's own."""

    def __init__(self, req, drafts: list[int]):
        out = req.output_ids
        if isinstance(out, array.array):   # 0.5.23 keeps token ids in arrays
            out = array.array(out.typecode, out)
            out.extend(drafts)
        else:
            out = [*out, *drafts]
        self._req, self.output_ids = req, out

    def __getattr__(self, name):
        return getattr(self._req, name)


def apply_custom_processors_per_position(next_token_logits: torch.Tensor, candidates: torch.Tensor,
                                         sampling_info) -> None:
    """0.5.23's custom logit processors on every row of the block, row i given the request
    with the block's first i drafts appended to its output (`__req__`), as plain decoding
    calls them token by token. The synchronous loop (DFLASH on CPU) has processed the
    previous step when this runs, so `req.output_ids` ends with the block's column 0; the
    overlap loop has not, and a processor there sees the request as the host knows it,
    as a plain overlap server's does. Reads the candidates on the host: these processors
    are host Python."""
    bs, width = candidates.shape
    drafts = candidates[:, 1:].tolist()
    offsets = torch.arange(width, device=next_token_logits.device)
    for entry in sampling_info.custom_logit_processor.values():
        indices = (entry.indices.to(next_token_logits.device)[:, None] * width + offsets).flatten()
        params = []
        for row in entry.rows:
            base = sampling_info.custom_params[row]
            req = base.get("__req__") if isinstance(base, dict) else None
            for i in range(width):
                params.append(base if req is None else {**base, "__req__": _RequestAt(req, drafts[row][:i])})
        result = entry.processor(next_token_logits.index_select(0, indices), params)
        next_token_logits.index_copy_(0, indices, result.to(next_token_logits.dtype))


@contextlib.contextmanager
def active(step: Optional[StepPenalties]):
    """Marks the step whose adjustments the worker applies itself."""
    global _active
    previous, _active = _active, step
    try:
        yield step
    finally:
        _active = previous


def around_verify_logits_adjustments(original, *args, **kwargs):
    """0.5.23's block-wide adjustment, skipped in a step of this plugin's worker with a
    penalty or a custom logit processor (the worker applies every adjustment per position
    in `_accept_block`); every other caller (other algorithms, other steps) gets upstream's."""
    if _active is not None:
        return None
    return original(*args, **kwargs)


__all__ = ["PenaltyPool", "StepPenalties", "active", "apply_custom_processors_per_position",
           "around_verify_logits_adjustments", "batch_penalised", "penalised", "stop_tokens"]
