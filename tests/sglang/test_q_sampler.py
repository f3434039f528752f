"""The q rule's rollout in the draft graph (`q_sampler.QRuleDraftSampler`), called eagerly as
its capture hook calls it: the rollout (`q_rollout`) in static buffers, greedy rows as
0.5.23's greedy rollout, narrower widths reading the block's first proposals; sync-free on
fake CUDA tensors; built in the greedy sampler's place by the worker, staged every decode
step and read by the q rule's acceptance."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.speculative import dflash_worker_v2 as w2  # noqa: E402

from sglang_domino.sglang.adaptive.draft_tail import FirstProposals, at_width  # noqa: E402
from sglang_domino.sglang.sampling.q_sampler import QRuleDraftSampler  # noqa: E402
from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, q_rollout, sampled_step  # noqa: E402
from tests.sglang.tp_fakes import V, du, rollout_block, rollout_modules  # noqa: E402

BLOCK, BS, POOL, MAX_BS = 8, 4, 20, 6
TOP_K_ALL = 1 << 30


@pytest.fixture(scope="module")
def block():
    return rollout_block(BS, BLOCK, seed=11)


@pytest.fixture
def standin(monkeypatch):
    """`murmur_hash32` on CPU tensors imports `sgl_kernel`; servers get the CPU stand-in from
    the platform hook, this process gets it here."""
    from sglang_domino.sglang.cpu import kernel_standin

    monkeypatch.setitem(sys.modules, "sgl_kernel", kernel_standin.build_module("test"))


def greedy_sampler(mods, pool=POOL, block=BLOCK, device="cpu"):
    lm_head, embed, gru, proj = mods
    return w2._DominoDraftSampler(target_embedding=embed, lm_head_weight=lm_head.to(device), prefix_gru=gru,
                                  embed_proj=proj, vocab_size=V, block_size=block, shift_label=True, max_bs=MAX_BS,
                                  candidate_pool_size=pool)


def mixed_info(bs=BS, seeds=None, device="cpu"):
    """Row 0 greedy (0.5.23: top-k 1), the others Qwen3-like sampled rows."""
    top_ks = torch.tensor([1, 20, TOP_K_ALL, 5][:bs], dtype=torch.int32, device=device)
    temperatures = torch.tensor([1.0, 0.6, 1.0, 1.4][:bs], device=device)[:, None]
    top_ps = torch.tensor([1.0, 0.95, 0.9, 1.0][:bs], device=device)
    return SimpleNamespace(is_all_greedy=False, temperatures=temperatures, top_ks=top_ks, top_ps=top_ps,
                           sampling_seed=None if seeds is None else torch.tensor(seeds, device=device))


def test_the_sampler_is_the_rollout_in_static_buffers(block, standin):
    mods, hidden, ids = block
    greedy = greedy_sampler(mods)
    sampler = QRuleDraftSampler.replacing(greedy)
    assert sampler.block_size == BLOCK and sampler.uniforms.shape == (MAX_BS, BLOCK - 1)
    positions = torch.arange(10, 10 + BS)
    sampler.stage(mixed_info(), positions, BS)
    torch.manual_seed(3)
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    torch.manual_seed(3)
    coins = torch.rand(BS, BLOCK - 1)
    want = q_rollout(sampler.params.rows(BS), coins, draft_hidden=hidden, bonus_tokens=ids[:, 0], **sampler.rollout)
    got = sampler.read(BS, BLOCK)
    for name in ("tokens", "q_draft", "q_first", "pool_ids", "q_rest"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    # the greedy row proposes 0.5.23's greedy Domino rollout (on the pool), q a point mass
    greedy(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    upstream = greedy.out[: BS * (BLOCK - 1)].view(BS, BLOCK - 1)
    assert torch.equal(got.tokens[0], upstream[0]) and torch.equal(got.q_draft[0], torch.ones(BLOCK - 1))
    assert not torch.equal(got.tokens[1:], upstream[1:])
    # later proposals on the pool; q sums to one there
    assert bool((got.pool_ids[:, None, :] == got.tokens[:, 1:, None]).any(-1).all())
    assert torch.allclose(got.q_rest.sum(-1), torch.ones(BS, BLOCK - 2, dtype=torch.float32))


def test_a_narrow_step_reads_the_first_proposals_and_their_q(block, standin):
    """b8 and adaptive widths: upstream reads the proposals through `draft_tail`'s view,
    the worker reads q cut alike; both the block's first W - 1."""
    mods, hidden, ids = block
    sampler = QRuleDraftSampler.replacing(greedy_sampler(mods))
    sampler.stage(mixed_info(), torch.arange(BS), BS)
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    full = sampler.read(BS, BLOCK)
    for width in (2, 3, 5):
        view = at_width(sampler, width)
        assert isinstance(view, FirstProposals) and view.sampler is sampler
        narrow = sampler.read(BS, width)
        assert torch.equal(view.out[: BS * (width - 1)].view(BS, width - 1), narrow.tokens)
        assert torch.equal(narrow.tokens, full.tokens[:, : width - 1])
        assert torch.equal(narrow.q_draft, full.q_draft[:, : width - 1])
        if width == 2:
            assert narrow.q_rest is None and narrow.pool_ids is None
        else:
            assert torch.equal(narrow.q_rest, full.q_rest[:, : width - 2])
    assert at_width(sampler, BLOCK) is sampler and at_width(sampler, 1) is None


def test_seeded_rows_repeat_in_the_graph(block, standin):
    """Seeded rows take hashed coins, not the graph's uniforms: the same proposals whatever
    torch's RNG does."""
    mods, hidden, ids = block
    sampler = QRuleDraftSampler.replacing(greedy_sampler(mods))
    runs = []
    for rng in (1, 2):
        sampler.stage(mixed_info(seeds=[5, 6, 7, 8]), torch.arange(10, 10 + BS), BS)
        torch.manual_seed(rng)
        sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
        runs.append(sampler.read(BS, BLOCK).tokens.clone())
    assert torch.equal(runs[0], runs[1])


def test_the_transformers_window_draws_one_proposal_more_from_the_padded_block(block, standin):
    """A window of B + 1 over a shift_label block of B: B proposals, the rollout over the
    block padded to the window (never-read zero slot), as the eager path pads it."""
    mods, hidden, ids = block
    sampler = QRuleDraftSampler.replacing(greedy_sampler(mods), BLOCK + 1)
    assert sampler.slots == BLOCK and sampler.block_size == BLOCK + 1
    sampler.stage(mixed_info(), torch.arange(BS), BS)
    torch.manual_seed(4)
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    torch.manual_seed(4)
    coins = torch.rand(BS, BLOCK)
    padded = torch.cat((hidden, hidden.new_zeros(BS, 1, hidden.shape[-1])), dim=1)
    want = q_rollout(sampler.params.rows(BS), coins, draft_hidden=padded, bonus_tokens=ids[:, 0], **sampler.rollout)
    got = sampler.read(BS, BLOCK + 1)
    assert got.tokens.shape == (BS, BLOCK) and torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.q_rest, want.q_rest)
    assert at_width(sampler, BLOCK + 1) is sampler


def test_no_pool_or_a_two_slot_block_is_refused(block):
    mods = block[0]
    with pytest.raises(ValueError, match="candidate pool"):
        QRuleDraftSampler.replacing(greedy_sampler(mods, pool=0))
    with pytest.raises(ValueError, match="block of 3"):
        QRuleDraftSampler.replacing(greedy_sampler(mods, block=2))


def test_the_sampler_stages_draws_and_reads_without_a_host_read(block, monkeypatch):
    """On fake CUDA tensors (a host read raises): staging a batch, the graph's tail (in-graph
    coins, seeded hash, rollout, buffer writes) and the acceptance's read."""
    from sglang.srt.layers import sampler as upstream_sampler

    from sglang_domino.sglang.cpu import kernel_standin
    from tests.fake_cuda import fake_cuda

    monkeypatch.setattr(upstream_sampler, "murmur_hash32", kernel_standin.murmur_hash32_cpu)
    _, hidden, ids = block
    lm_head, embed, gru, proj = rollout_modules(seed=11)   # fresh: `Module.to` moves the modules themselves
    with fake_cuda(allow_non_fake_inputs=True) as mode:
        modules = (lm_head.to("cuda"), embed.to("cuda"), gru.to("cuda"), proj.to("cuda"))
        sampler = QRuleDraftSampler.replacing(greedy_sampler(modules, device="cuda"))
        for seeds in (None, [1, 2, 3, 4]):
            sampler.stage(mixed_info(seeds=seeds, device="cuda"), torch.arange(BS, device="cuda"), BS)
            sampler(mode.from_tensor(hidden).to("cuda").reshape(BS * BLOCK, -1),
                    mode.from_tensor(ids).to("cuda").reshape(-1))
            got = sampler.read(BS, 5)
            assert got.tokens.device.type == "cuda" and got.q_rest.shape == (BS, 3, POOL)


def _worker(q_sampler=None, draft_sampler=None):
    """A `DominoDFlashWorker` holding only what its q-rule methods read."""
    from sglang_domino.sglang.step.worker import DominoDFlashWorker

    worker = DominoDFlashWorker.__new__(DominoDFlashWorker)
    worker.q_rule, worker._q_sampler, worker._draft_sampler = True, q_sampler, draft_sampler
    worker._tp_sync = SimpleNamespace(sync=lambda site, t: t)
    return worker


def _batch(info, bs=BS):
    mode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False)
    return SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, sampling_info=info,
                           seq_lens=torch.arange(20, 20 + bs), reqs=[None] * bs,
                           spec_info=SimpleNamespace(max_top_k=TOP_K_ALL))


def test_the_worker_builds_the_q_rule_in_the_greedy_samplers_place(monkeypatch, block):
    from sglang_domino.sglang.step.worker import DominoDFlashWorker

    mods = block[0]
    pool = [POOL]
    monkeypatch.setattr(w2.DFlashWorkerV2, "_maybe_build_draft_sampler",
                        lambda self: greedy_sampler(mods, pool=pool[0], block=int(self.block_size)))
    worker = DominoDFlashWorker.__new__(DominoDFlashWorker)
    worker.q_rule, worker.block_size, worker.draft_block = True, BLOCK, BLOCK
    built = worker._maybe_build_draft_sampler()
    assert isinstance(built, QRuleDraftSampler) and worker._q_sampler is built
    worker.block_size = 4                                          # b8-like: the window's view
    view = worker._maybe_build_draft_sampler()
    assert isinstance(view, FirstProposals) and view.sampler is worker._q_sampler and view.width == 4
    worker.block_size, pool[0] = BLOCK, 0                          # no pool: upstream's, eager q rule
    assert isinstance(worker._maybe_build_draft_sampler(), w2._DominoDraftSampler) and worker._q_sampler is None
    worker.draft_block, worker.block_size, pool[0] = BLOCK, BLOCK + 1, POOL   # the Transformers window
    window = worker._maybe_build_draft_sampler()
    assert isinstance(window, QRuleDraftSampler) and window.block_size == BLOCK + 1 and window.slots == BLOCK
    worker.block_size = BLOCK
    worker.q_rule = False                                          # no q rule: upstream's
    assert isinstance(worker._maybe_build_draft_sampler(), w2._DominoDraftSampler)


def test_each_decode_step_stages_its_rows_and_sampled_steps_read_q_from_the_graph(monkeypatch, block, standin):
    """`_forward_with_q_rollout` with the captured rollout: every decode step stages its
    rows (an all-greedy one too: the graph serves it greedily), the in-graph sampler stays
    in place, and a sampled step is current; `_accept_q_rule` then reads the replay's
    proposals and q and accepts with them."""
    mods, hidden, ids = block
    sampler = QRuleDraftSampler.replacing(greedy_sampler(mods))
    worker = _worker(sampler, draft_sampler=sampler)
    seen = []

    def upstream_step(self, batch, *args, **kwargs):
        from sglang_domino.sglang.sampling.sampled_rollout import active_step

        seen.append((active_step(), self._draft_sampler, sampler.params.greedy[:BS].clone()))
        return "result"

    monkeypatch.setattr(w2.DFlashWorkerV2, "forward_batch_generation", upstream_step)
    greedy_info = SimpleNamespace(**{**vars(mixed_info()), "top_ks": torch.ones(BS, dtype=torch.int32),
                                     "is_all_greedy": True})
    assert worker._forward_with_q_rollout(_batch(greedy_info)) == "result"
    step, in_place, greedy = seen[-1]
    assert step is None and in_place is sampler and bool(greedy.all())
    assert worker._forward_with_q_rollout(_batch(mixed_info())) == "result"
    step, in_place, greedy = seen[-1]
    assert isinstance(step, SampledStep) and in_place is sampler
    assert greedy.tolist() == [True, False, False, False]
    assert torch.equal(sampler.params.position[:BS], torch.arange(20, 20 + BS))

    # the replay, then the verify's acceptance reads it
    sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
    width = 5
    drafts = sampler.read(BS, width).tokens
    candidates = torch.cat((ids[:, :1], drafts), dim=1)
    target = torch.rand(BS, width, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64).softmax(-1)
    worker._target_probs = lambda **kw: target
    worker._commit_sampled = lambda c, a, b: (a, b)
    step = SampledStep(mixed_info(), torch.arange(20, 20 + BS))
    torch.manual_seed(9)
    with sampled_step(step):
        accepted, bonus = worker._accept_q_rule(step, candidates=candidates, next_token_logits=None,
                                                    sampling_info=step.sampling_info, draft_input=None, bs=BS)
    assert torch.equal(step.draft.tokens, drafts)
    torch.manual_seed(9)
    again = SampledStep(step.sampling_info, step.positions, draft=sampler.read(BS, width))
    assert all(torch.equal(a, b) for a, b in zip((accepted, bonus), again.accept(drafts, target)))
