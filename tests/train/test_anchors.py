"""Anchors and the training mask, against references written another way (loops)."""

import torch

from sglang_domino.train.anchors import (Anchors, anchor_scores, block_attention_mask, block_inputs, sample_anchors,
                                         valid_anchor_mask)


def _loss_mask():
    m = torch.zeros(3, 20, dtype=torch.long)
    m[0, 5:18] = 1
    m[1, 2:4] = 1
    m[1, 10:20] = 1
    m[2, 7] = 1          # a single loss token: no valid anchor in this row
    return m


def test_anchors_are_valid_distinct_sorted_and_as_many_as_allowed():
    m = _loss_mask()
    anchors = sample_anchors(m, num_anchors=6, generator=torch.Generator().manual_seed(0))
    for row in range(3):
        valid = [a for a in range(19) if m[row, a] and m[row, a + 1]]
        kept = anchors.positions[row][anchors.keep[row]].tolist()
        assert all(a in valid for a in kept)
        assert kept == sorted(set(kept))
        assert len(kept) == min(6, len(valid))
    assert not anchors.keep[2].any()


def test_anchor_sampling_covers_every_valid_position():
    m = _loss_mask()[:1]
    seen = set()
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        a = sample_anchors(m, 3, g)
        seen.update(a.positions[a.keep].tolist())
    assert seen == set(range(5, 17))
    assert valid_anchor_mask(m)[0].nonzero().flatten().tolist() == list(range(5, 17))


def test_block_inputs_put_the_anchor_token_first_then_masks():
    ids = torch.arange(100, 120)[None]
    anchors = Anchors(torch.tensor([[3, 9]]), torch.tensor([[True, True]]))
    blocks, pos = block_inputs(ids, anchors, block_size=4, mask_id=7)
    assert blocks.tolist() == [[103, 7, 7, 7, 109, 7, 7, 7]]
    assert pos.tolist() == [[3, 4, 5, 6, 9, 10, 11, 12]]


def _reference_mask(anchors, context_valid, bs, window):
    b, n = anchors.positions.shape
    s = context_valid.shape[1]
    ref = torch.zeros(b, 1, n * bs, s + n * bs, dtype=torch.bool)
    for r in range(b):
        for blk in range(n):
            a = int(anchors.positions[r, blk])
            for oq in range(bs):
                q = blk * bs + oq
                for kv in range(s):
                    ok = bool(anchors.keep[r, blk]) and kv < a and bool(context_valid[r, kv])
                    if window is not None:
                        ok = ok and (a + oq) - kv < window
                    ref[r, 0, q, kv] = ok
                for okv in range(bs):
                    ref[r, 0, q, s + blk * bs + okv] = window is None or okv <= oq
    return ref


def test_mask_matches_a_loop_reference_full_and_sliding():
    context_valid = torch.ones(2, 12, dtype=torch.long)
    context_valid[1, 10:] = 0
    anchors = Anchors(torch.tensor([[0, 4, 8], [2, 6, 0]]), torch.tensor([[True, True, True], [True, True, False]]))
    for window in (None, 3):
        got = block_attention_mask(anchors, context_valid, block_size=4, sliding_window=window)
        assert torch.equal(got, _reference_mask(anchors, context_valid, 4, window)), window


def test_anchor_scores_and_block_inputs_stay_on_the_batch_device():
    """On a GPU the batch is on CUDA and the generator on the CPU: the scores (and the
    anchors gathered from them) must follow the batch. Fake CUDA tensors raise on a
    device mix as a GPU would."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    generator = torch.Generator().manual_seed(0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        valid = torch.ones(2, 12, dtype=torch.bool, device="cuda")
        scores = anchor_scores(valid, generator)
        assert scores.device.type == "cuda"
        top, idx = scores.topk(3, dim=1)
        anchors = Anchors(idx, top >= 0)
        ids, positions = block_inputs(torch.zeros(2, 12, dtype=torch.long, device="cuda"), anchors, 4, 9)
        assert ids.device.type == positions.device.type == "cuda"
    # the same draw as before the move: runs repeat whatever the device
    cpu = anchor_scores(torch.ones(2, 12, dtype=torch.bool), torch.Generator().manual_seed(0))
    assert torch.equal(cpu, torch.rand(2, 12, generator=torch.Generator().manual_seed(0)))
