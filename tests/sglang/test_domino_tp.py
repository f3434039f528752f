"""The vocabulary-parallel Domino rollout the plugin serves with `--tp-size > 1`
(0.5.23's `domino_greedy_rollout`, `srt/speculative/domino_utils.py:311`) against the
single-rank rollout, with a fake two-rank group (two threads exchanging shards):
`--tp-size 2` cannot run on this CPU-only machine.

`domino_utils.py` imports only torch, so it is loaded from the installed wheel by path,
without importing the `sglang` package into the test process."""

from __future__ import annotations


import pytest
import torch

from tests.sglang.tp_fakes import H, V, du, rollout_modules, run_ranks


def _rollout(z, bonus, lm_head, embed, gru, proj, pool, in_graph, **tp):
    return du.domino_greedy_rollout(draft_hidden=z, bonus_tokens=bonus, target_embedding=embed,
                                    lm_head_weight=lm_head, prefix_gru=gru, embed_proj=proj, vocab_size=V,
                                    shift_label=True, candidate_pool_size=pool, in_cuda_graph=in_graph, **tp)


def _two_rank(z, bonus, lm_head, embed, gru, proj, pool, in_graph):
    padded = -(-V // 2)

    def rank_rollout(rank, group):
        start = rank * padded
        num = min(padded, V - start)
        shard = torch.zeros(padded, H, dtype=lm_head.dtype)
        shard[:num] = lm_head[start:start + num]
        return _rollout(z, bonus, shard, embed, gru, proj, pool, in_graph, tp_group=group,
                        lm_head_org_vocab_start=start, lm_head_num_org=num, lm_head_num_org_padded=padded)

    return run_ranks(2, rank_rollout)


@pytest.mark.parametrize("pool,in_graph,path", [
    (0, False, "all_gather"),      # exact full-vocab rollout: one gather of the base logits
    (24, True, "all_reduce"),      # compact block-shared candidate pool (graph path, bs > 1)
])
def test_two_rank_rollout_matches_single_rank(pool, in_graph, path):
    lm_head, embed, gru, proj = rollout_modules()
    g = torch.Generator().manual_seed(1)
    bs, block = 3, 8
    z = torch.randn(bs, block, H, generator=g, dtype=torch.float64)
    bonus = torch.randint(0, V, (bs,), generator=g)
    want = _rollout(z, bonus, lm_head, embed, gru, proj, pool, in_graph)
    assert want.shape == (bs, block - 1)
    outs, groups = _two_rank(z, bonus, lm_head, embed, gru, proj, pool, in_graph)
    for out in outs:
        assert torch.equal(out, want)
    assert all(path in group.calls for group in groups)
    # the chain uses ids from both shards, so a rank-local argmax would have been caught
    assert (want < -(-V // 2)).any() and (want >= -(-V // 2)).any()


def test_exact_rollout_differs_from_base_argmax():
    """Guard against a vacuous comparison: the correction head changes the chain."""
    lm_head, embed, gru, proj = rollout_modules()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 8, H, generator=g, dtype=torch.float64)
    bonus = torch.randint(0, V, (3,), generator=g)
    chain = _rollout(z, bonus, lm_head, embed, gru, proj, 0, False)
    base = (z[:, :7] @ lm_head.T).argmax(-1)
    assert torch.equal(chain[:, 0], base[:, 0])  # first proposal: base logits only
    assert not torch.equal(chain[:, 1:], base[:, 1:])
