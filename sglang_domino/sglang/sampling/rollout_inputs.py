"""What a Domino rollout reads from a block's draft hidden states, as 0.5.23's rollout
computes it: the predicting slots' base logits over the vocabulary (`base_logits`; a
vocabulary-parallel lm_head all-gathered), the block-shared candidate pool (`candidate_pool`:
the top-K ids of the max over proposals 1..n-1, sorted by id so every rank and the single
rank draw the same proposals from the same coins), and the first proposal's and the later
ones' logits (`split_base`, `rollout_inputs`). Under tensor parallelism with a pool a rank
gathers the first proposal's logits and the ranks' pool candidates, not the block's
[bs, n, V] (`sharded_rollout_inputs`, after 0.5.23's `_domino_tp_candidate_state`,
`srt/speculative/domino_utils.py:62`)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...config import predicting_slots


def padded_block(hidden_states: torch.Tensor, slots: int, width: int) -> torch.Tensor:
    """The draft graph's hidden states [bs * slots, H] as [bs, width, H]: a window wider than
    the block gets zero slots at the end, never read (the Transformers window: a
    `shift_label` rollout reads slots 0..width-2), as `DraftBlockRunner` pads them for the
    eager rollout."""
    bs = int(hidden_states.shape[0]) // int(slots)
    hidden = hidden_states.view(bs, int(slots), -1)
    if int(width) > int(slots):
        hidden = torch.cat((hidden, hidden.new_zeros(bs, int(width) - int(slots), hidden.shape[-1])), dim=1)
    return hidden


# the keyword arguments of upstream's `domino_greedy_rollout` that its `_DominoDraftSampler` holds
ROLLOUT_FIELDS = ("target_embedding", "lm_head_weight", "prefix_gru", "embed_proj", "vocab_size", "shift_label",
                  "candidate_pool_size", "tp_group", "lm_head_org_vocab_start", "lm_head_num_org",
                  "lm_head_num_org_padded")


def rollout_modules(sampler) -> dict:
    """Those arguments, read off 0.5.23's greedy Domino sampler."""
    return {name: getattr(sampler, name) for name in ROLLOUT_FIELDS}


def _shard_logits(draft_hidden, lm_head_weight, vocab_size, shift_label, tp, lm_head_num_org_padded):
    """(z [bs, n, H], this rank's base logits [bs, n, local]: its lm_head shard's, padded)."""
    block = int(draft_hidden.shape[1])
    z = draft_hidden[:, predicting_slots(block, shift_label, block - 1)]
    local_vocab = int(lm_head_num_org_padded) if tp > 1 else int(vocab_size)
    weight = lm_head_weight[:local_vocab]
    return z, F.linear(z.to(weight.dtype), weight)


def base_logits(*, draft_hidden, lm_head_weight, vocab_size, shift_label, tp_group=None,
                lm_head_num_org_padded=None, **_) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [bs, n, H], base logits [bs, n, V] over the full vocabulary) as upstream's rollout
    computes them (`domino_greedy_rollout`): the predicting slots of the block
    (`config.predicting_slots`); a vocabulary-parallel lm_head is all-gathered."""
    tp = int(tp_group.world_size) if tp_group is not None else 1
    z, local = _shard_logits(draft_hidden, lm_head_weight, vocab_size, shift_label, tp, lm_head_num_org_padded)
    if tp == 1:
        return z, local[..., :int(vocab_size)]
    bs, n, local_vocab = local.shape
    flat = local.reshape(bs * n, local_vocab).T.contiguous()
    gathered = torch.empty((tp * local_vocab, bs * n), dtype=local.dtype, device=local.device)
    tp_group.all_gather_into_tensor(gathered, flat)
    return z, gathered.T[:, :int(vocab_size)].reshape(bs, n, int(vocab_size))


def _has_pool(n: int, vocab: int, pool_size: int) -> bool:
    return n > 1 and 0 < pool_size < vocab


def candidate_pool(base: torch.Tensor, vocab: int, pool_size: int) -> Optional[torch.Tensor]:
    """Upstream's block-shared pool over base logits [bs, n, V]: the top-K ids of the max
    over proposals 1..n-1 ([bs, K], in ascending id order: the layout a vocabulary-parallel
    pool (`sharded_rollout_inputs`) has too, so that both draw the same proposals from the
    same coins); None (the whole vocabulary) when the pool size is 0 or covers it, or when
    there is only one proposal. Ids tied at the K-th largest value: `torch.topk`'s choice."""
    if _has_pool(int(base.shape[1]), vocab, pool_size):
        return torch.topk(base[:, 1:].amax(dim=1), k=pool_size, dim=-1, sorted=False).indices.sort(dim=-1).values
    return None


def rollout_inputs(*, draft_hidden, vocab_size, candidate_pool_size, **base_args):
    """(z [bs, n, H], the first proposal's logits [bs, V], the later ones' [bs, n-1, K or V],
    the candidate pool [bs, K] or None) from a block's draft hidden states, as upstream's
    rollout computes them. A vocabulary-parallel lm_head with a pool gathers only what
    these are (`sharded_rollout_inputs`), not the base logits [bs, n, V]."""
    vocab, pool_size = int(vocab_size), int(candidate_pool_size)
    if _gathers_the_pool(base_args, int(draft_hidden.shape[1]) - 1, vocab, pool_size):
        z, local = _shard_logits(draft_hidden, base_args["lm_head_weight"], vocab, base_args["shift_label"],
                                 int(base_args["tp_group"].world_size), base_args["lm_head_num_org_padded"])
        return (z, *sharded_rollout_inputs(local, vocab=vocab, pool_size=pool_size, tp_group=base_args["tp_group"],
                                           org_vocab_start=int(base_args["lm_head_org_vocab_start"]),
                                           num_org=int(base_args["lm_head_num_org"])))
    z, base = base_logits(draft_hidden=draft_hidden, vocab_size=vocab, **base_args)
    return (z, *split_base(base, vocab, pool_size))


def _gathers_the_pool(base_args: dict, n: int, vocab: int, pool_size: int) -> bool:
    """Whether a rank gathers the pool (`sharded_rollout_inputs`) rather than the base logits:
    a vocabulary-parallel lm_head (its shard's start and size known, as 0.5.23's Domino
    sampler passes them), a pool, and a smaller gather (`pool_gather_width`)."""
    tp_group = base_args.get("tp_group")
    if tp_group is None or int(tp_group.world_size) < 2 or not _has_pool(n, vocab, pool_size):
        return False
    if base_args.get("lm_head_num_org") is None or base_args.get("lm_head_org_vocab_start") is None:
        return False
    local = int(base_args["lm_head_num_org_padded"])
    return pool_gather_width(local, n, pool_size, base_args["lm_head_weight"].element_size()) < n * local


def split_base(base: torch.Tensor, vocab: int, pool_size: int):
    """Base logits [bs, n, V] as the rollout reads them: (the first proposal's [bs, V], the
    later ones' [bs, n-1, K or V], the candidate pool [bs, K] or None)."""
    pool = candidate_pool(base, vocab, pool_size)
    rest = base[:, 1:]
    if pool is not None:
        rest = rest.gather(2, pool[:, None, :].expand(-1, rest.shape[1], -1))
    return base[:, 0], rest, pool


def pool_gather_width(local_vocab: int, n: int, pool_size: int, itemsize: int) -> int:
    """Elements per request a rank sends in `sharded_rollout_inputs`' gather: the first row
    [local], the candidates' later logits [(n-1) x K'] and their int64 ids as `itemsize`-byte
    elements, K' = min(K, local). The full gather sends n x local: the pool path is taken
    where it sends fewer (K far below the shard: Qwen3's 151936 tokens, K 2048)."""
    k = min(int(pool_size), int(local_vocab))
    return int(local_vocab) + (int(n) - 1) * k + k * 8 // int(itemsize)


def sharded_rollout_inputs(local: torch.Tensor, *, vocab: int, pool_size: int, tp_group, org_vocab_start: int,
                           num_org: int):
    """`split_base`'s (first [bs, V], later [bs, n-1, K], pool [bs, K]) from this rank's
    shard of the base logits `local` [bs, n, local] (vocabulary ids org_vocab_start + 0..
    num_org-1, the rest padding), with one all-gather of [bs, local + (n-1) x K'] logits and
    K' ids per rank (K' = min(K, local)), where the full gather moves [bs, n, local]: ~10 x
    fewer bytes at Qwen3's vocabulary, n = 15, K = 2048 and tp 2, ~5 x at tp 8.

    As 0.5.23's greedy pool rollout under TP (`domino_utils._domino_tp_candidate_state`):
    each rank takes its shard's top K' of the max over proposals 1..n-1 (the union of the
    ranks' holds the global top K) and the global pool is the top K of the gathered ones.
    Upstream gathers scores and ids and then all-reduces the pool's logits (each owned by
    one shard, the others adding zeros); here every rank also sends its candidates' later
    logits [bs, n-1, K'] in the same gather, and the pool's are picked out of them, the
    scores being their max: the same values, bit for bit, as the single rank's and the
    full gather's, one collective (the first row included), so no size threshold (upstream
    keeps its full gather in eager below 96 MB for the count of its collectives).

    Every rank computes the pool from the same gathered tensor with the same ops, so the
    ranks agree. Ids tied at the K-th largest value are chosen by `torch.topk` (on each
    shard, then among the gathered candidates): a top-K set, though not necessarily the
    single rank's tied ids. The pool is sorted by id, as `candidate_pool`'s. No host read."""
    bs, n, local_vocab = (int(d) for d in local.shape)
    tp = int(tp_group.world_size)
    k = min(int(pool_size), local_vocab)
    later = local[:, 1:]                                                       # [bs, n-1, local]
    scores = later.amax(dim=1)                                                 # [bs, local]
    if num_org < local_vocab:
        scores[:, num_org:] = float("-inf")                                    # padding never enters the pool
    positions = torch.topk(scores, k=k, dim=-1, sorted=False).indices          # [bs, k]
    cand = later.gather(2, positions[:, None, :].expand(-1, n - 1, -1))        # [bs, n-1, k]
    if num_org < local_vocab:
        cand = cand.masked_fill((positions >= num_org)[:, None, :], float("-inf"))
    ids = (positions + int(org_vocab_start)).to(torch.int64).contiguous()
    # one gather: the first row, the candidates' later logits and their ids (as the logits' dtype, bit for bit)
    packed = torch.cat((local[:, 0], cand.reshape(bs, (n - 1) * k), ids.view(local.dtype)), dim=-1)
    width = int(packed.shape[-1])
    gathered = torch.empty((tp * bs, width), dtype=local.dtype, device=local.device)
    tp_group.all_gather_into_tensor(gathered, packed.contiguous())
    gathered = gathered.view(tp, bs, width)
    first = gathered[:, :, :local_vocab].transpose(0, 1).reshape(bs, tp * local_vocab)[:, :vocab]
    split = local_vocab + (n - 1) * k
    rest_all = (gathered[:, :, local_vocab:split].reshape(tp, bs, n - 1, k).permute(1, 2, 0, 3)
                .reshape(bs, n - 1, tp * k))                                   # rank-major candidates
    ids_all = gathered[:, :, split:].contiguous().view(torch.int64).transpose(0, 1).reshape(bs, tp * k)
    picked = torch.topk(rest_all.amax(dim=1), k=int(pool_size), dim=-1, sorted=False).indices
    pool, order = ids_all.gather(1, picked).sort(dim=-1)
    picked = picked.gather(1, order)
    rest = rest_all.gather(2, picked[:, None, :].expand(-1, n - 1, -1))
    return first, rest, pool
