"""The draft graph's in-graph proposals read at a narrower width (`draft_tail`): 0.5.23's own
samplers, called eagerly as their capture hook calls them, give a narrow step the block's
first W - 1 proposals, which equal the width-W eager proposals (Domino without a
candidate pool, DFlash's argmax); the width switch and b8 hand upstream that view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.speculative import dflash_worker_v2 as w2  # noqa: E402

from sglang_domino.sglang.adaptive import draft_tail  # noqa: E402
from sglang_domino.sglang.adaptive.draft_tail import FirstProposals, WindowProposals  # noqa: E402
from tests.sglang.tp_fakes import V, du, rollout_block  # noqa: E402

BLOCK, BS = 16, 3


def read_as_upstream(sampler, bs: int, width: int) -> torch.Tensor:
    """`DFlashWorkerV2.forward_batch_generation`'s read of the in-graph proposals."""
    return sampler.out[: bs * (width - 1)].view(bs, width - 1)


@pytest.fixture(scope="module")
def block():
    return rollout_block(BS, BLOCK, seed=5)


def domino_sampler(mods, shift_label, pool=0, max_bs=BS):
    lm_head, embed, gru, proj = mods
    return w2._DominoDraftSampler(target_embedding=embed, lm_head_weight=lm_head, prefix_gru=gru, embed_proj=proj,
                                  vocab_size=V, block_size=BLOCK, shift_label=shift_label, max_bs=max_bs,
                                  candidate_pool_size=pool)


@pytest.mark.parametrize("shift_label", [True, False])
def test_a_narrow_step_reads_the_domino_rollout_it_would_have_run_eagerly(block, shift_label):
    mods, hidden, ids = block
    lm_head, embed, gru, proj = mods
    sampler = domino_sampler(mods, shift_label, max_bs=BS + 2)   # graphs are captured for more rows than run
    sampler.out.fill_(-1)
    with torch.no_grad():
        draft_tail.at_width(sampler, 8)(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))   # the capture hook's call
        for width in (2, 4, 8, BLOCK):
            eager = du.domino_greedy_rollout(
                draft_hidden=hidden[:, :width], bonus_tokens=ids[:, 0], target_embedding=embed, lm_head_weight=lm_head,
                prefix_gru=gru, embed_proj=proj, vocab_size=V, shift_label=shift_label, candidate_pool_size=0,
                in_cuda_graph=False)
            got = read_as_upstream(draft_tail.at_width(sampler, width), BS, width)
            assert torch.equal(got, eager), width
    # what the step reads without the view: the block's rows at the wrong stride
    assert not torch.equal(read_as_upstream(sampler, BS, 8), read_as_upstream(FirstProposals(sampler, 8), BS, 8))


def test_a_narrow_step_reads_dflash_argmax_heads_it_would_have_computed(block):
    mods, hidden, ids = block
    lm_head = mods[0]
    sampler = w2._DflashDraftSampler(weight=lm_head, block_size=BLOCK, num_org=V, org_vocab_start=0, max_bs=BS)
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    for width in (2, 5, 8):
        eager = (hidden[:, 1:width] @ lm_head.T).argmax(-1)
        assert torch.equal(read_as_upstream(draft_tail.at_width(sampler, width), BS, width), eager)


def test_which_samplers_are_cut_and_which_are_not(block):
    mods = block[0]
    sampler = domino_sampler(mods, True)
    assert draft_tail.at_width(sampler, BLOCK) is sampler
    view = draft_tail.at_width(sampler, 4)
    assert isinstance(view, FirstProposals) and view.sampler is sampler
    assert draft_tail.at_width(view, 8).sampler is sampler      # a view of a view reads the block
    assert draft_tail.at_width(view, BLOCK) is sampler
    assert draft_tail.at_width(sampler, 1) is None               # width 1 proposes nothing
    assert draft_tail.at_width(None, 4) is None
    selector_like = SimpleNamespace(block_size=BLOCK, out=torch.zeros(BS * (BLOCK - 1)), candidate_out=None)
    assert draft_tail.at_width(selector_like, 4) is None         # samplers read per request stay off
    with pytest.raises(ValueError):
        FirstProposals(sampler, BLOCK + 1)


def test_b8_builds_the_sampler_at_the_draft_block_and_reads_it_at_the_window(monkeypatch, block):
    """`DominoDFlashWorker._maybe_build_draft_sampler` at b8: upstream's builder runs with
    the worker's block set to the draft block, and the step sees the window's view."""
    from sglang_domino.sglang.step.worker import DominoDFlashWorker

    mods = block[0]
    built = []

    def build(self):
        built.append(int(self.block_size))
        return domino_sampler(mods, True)

    monkeypatch.setattr(w2.DFlashWorkerV2, "_maybe_build_draft_sampler", build)
    worker = DominoDFlashWorker.__new__(DominoDFlashWorker)
    worker.q_rule = False                                       # with it: tests/sglang/test_q_sampler.py
    worker.block_size, worker.draft_block = 8, BLOCK            # b8
    sampler = worker._maybe_build_draft_sampler()
    assert built == [BLOCK] and worker.block_size == 8
    assert isinstance(sampler, FirstProposals) and sampler.width == 8 and sampler.sampler.block_size == BLOCK
    worker.block_size, worker.draft_block = 17, BLOCK           # the Transformers window: widened
    window = worker._maybe_build_draft_sampler()
    assert isinstance(window, WindowProposals) and window.block_size == 17 and built == [BLOCK, BLOCK]
    worker.block_size = worker.draft_block = BLOCK              # as built: upstream's
    assert isinstance(worker._maybe_build_draft_sampler(), w2._DominoDraftSampler)


@pytest.mark.parametrize("pool", [0, 6])
def test_the_transformers_window_proposes_the_padded_blocks_rollout_in_the_graph(block, pool):
    """A window of B + 1 over a shift_label block of B: the in-graph sampler proposes B
    tokens per row, what the eager rollout proposes over the hidden states `DraftBlockRunner`
    pads to the window (the path a window step took before), laid out as upstream reads a
    window-wide step."""
    mods, hidden, ids = block
    sampler = WindowProposals(domino_sampler(mods, True, pool=pool), BLOCK + 1)
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    padded = torch.cat((hidden, hidden.new_zeros(BS, 1, hidden.shape[-1])), dim=1)
    lm_head, embed, gru, proj = mods
    eager = du.domino_greedy_rollout(draft_hidden=padded, bonus_tokens=ids[:, 0], target_embedding=embed,
                                     lm_head_weight=lm_head, prefix_gru=gru, embed_proj=proj, vocab_size=V,
                                     shift_label=True, candidate_pool_size=pool, in_cuda_graph=False)
    assert eager.shape == (BS, BLOCK)
    assert torch.equal(read_as_upstream(sampler, BS, BLOCK + 1), eager)
    with pytest.raises(ValueError, match="shift_label"):
        WindowProposals(domino_sampler(mods, False), BLOCK + 1)
    assert draft_tail.widened(None, BLOCK + 1) is None
