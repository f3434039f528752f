"""The q rule's rollout over a vocabulary-parallel lm_head with a candidate pool
(`rollout_inputs.sharded_rollout_inputs`, issue 45 item 3): one all-gather of the first
proposal's logits [bs, V] and each rank's top-K candidates (their later logits and ids),
not of the base logits [bs, n, V]. Fake 2- and 4-rank groups (threads exchanging shards,
`tests/sglang/tp_fakes.py`) against the single rank and the full gather: the same pool, the
same logits bit for bit, the same proposals and q on the same coins; the bytes it gathers;
no host read on fake CUDA tensors."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_domino.sglang.sampling import rollout_inputs as ri
from sglang_domino.sglang.sampling import sampled_rollout as sr
from tests.sglang import tp_fakes
from tests.sglang.tp_fakes import H, V, FakeGroup, rollout_block

BS, BLOCK = 3, 8
N = BLOCK - 1
TOP_K_ALL = 1 << 30
PAD_LOGIT = 50.0        # padding rows' weights: logits above every real one, unless masked


class CountingGroup(FakeGroup):
    """`FakeGroup` recording the elements each rank hands to each collective."""

    def __init__(self, exchange, rank):
        super().__init__(exchange, rank)
        self.sent = []

    def all_gather_into_tensor(self, out, inp):
        self.sent.append(("all_gather", inp.numel(), inp.element_size()))
        super().all_gather_into_tensor(out, inp)

    def all_reduce(self, tensor):
        self.sent.append(("all_reduce", tensor.numel(), tensor.element_size()))
        return super().all_reduce(tensor)


def shard_args(lm_head: torch.Tensor, world: int, rank: int) -> dict:
    """Rank `rank`'s lm_head shard (padded as `VocabParallelEmbedding` pads the last one,
    its padding rows large so that an unmasked padding id would win the pool) and shard
    metadata, as 0.5.23's `_DominoDraftSampler` passes them."""
    padded = -(-V // world)
    start = rank * padded
    num = min(padded, V - start)
    shard = torch.full((padded, lm_head.shape[1]), PAD_LOGIT / H, dtype=lm_head.dtype)
    shard[:num] = lm_head[start:start + num]
    return dict(lm_head_weight=shard, lm_head_org_vocab_start=start, lm_head_num_org=num,
                lm_head_num_org_padded=padded)


def run_ranks(world: int, fn):
    """fn(rank, group) on `world` threads sharing one counting fake group."""
    return tp_fakes.run_ranks(world, fn, CountingGroup)


def base_kwargs(mods, hidden, pool, shift_label=True):
    return dict(draft_hidden=hidden, lm_head_weight=mods[0], vocab_size=V, shift_label=shift_label,
                candidate_pool_size=pool)


def rollout_kwargs(mods, hidden, bonus, pool):
    lm_head, embed, gru, proj = mods
    return dict(draft_hidden=hidden, bonus_tokens=bonus, target_embedding=embed, lm_head_weight=lm_head,
                prefix_gru=gru, embed_proj=proj, vocab_size=V, shift_label=True, candidate_pool_size=pool)


def full_gather_inputs(kw, group, shard):
    """What the ranks computed before: the base logits [bs, n, V] gathered, then split."""
    z, base = ri.base_logits(**{**kw, **shard, "tp_group": group})
    return (z, *ri.split_base(base, V, int(kw["candidate_pool_size"])))


def on_grid(x: torch.Tensor) -> torch.Tensor:
    """x rounded to multiples of 2^-10: the base logits (sums of 16 products on a 2^-20 grid)
    are then exact in float64, whatever order a matmul adds them in, so a shard's matmul
    and the whole head's agree bit for bit (on random floats they differ in the last bit:
    another kernel blocking; the full gather on the same ranks is the same matmul)."""
    return torch.round(x * 1024) / 1024


@pytest.fixture(scope="module")
def raw_block():
    return rollout_block(BS, BLOCK, seed=21)


@pytest.fixture(scope="module")
def block(raw_block):
    (lm_head, *rest), hidden, ids = raw_block
    return (on_grid(lm_head), *rest), on_grid(hidden), ids[:, 0]


# pools: below a shard, above a 4-rank shard (25 rows: each rank sends all its rows), all but one id
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pool", [20, 30, V - 1])
@pytest.mark.parametrize("shift_label", [True, False])
@pytest.mark.parametrize("grid", [True, False])
def test_the_pool_and_its_logits_are_the_single_ranks(block, raw_block, world, pool, shift_label, grid):
    """(a), (b): every rank's z, first logits [bs, V], pool [bs, K] and later logits on it
    [bs, n-1, K] equal the full gather's on the same ranks bit for bit, and the single
    rank's (on random floats: the same pool, logits within a rounding); the padding rows
    (logits above every real one) never enter the pool."""
    mods, hidden, _ = block if grid else raw_block
    kw = base_kwargs(mods, hidden, pool, shift_label)
    want = ri.rollout_inputs(**kw)
    assert want[3].shape == (BS, pool) and want[2].shape == (BS, N - 1, pool)

    def rank(r, group):
        shard = shard_args(mods[0], world, r)
        return ri.rollout_inputs(**{**kw, **shard, "tp_group": group}), full_gather_inputs(kw, group, shard)

    outs, _ = run_ranks(world, rank)
    for got, full in outs:
        for a, b, c in zip(got, want, full):
            assert torch.equal(a, c)
            assert torch.equal(a, b) if grid else torch.allclose(a.double(), b.double(), rtol=0, atol=1e-12)
        assert torch.equal(got[3], want[3])
        assert bool((got[3] < V).all())
    # the pool as upstream's single-rank pool, as a set: the top K of the max over proposals 1..n-1
    base = ri.base_logits(**kw)[1]
    upstream = torch.topk(base[:, 1:].amax(dim=1), k=pool, dim=-1, sorted=False).indices
    assert torch.equal(upstream.sort(-1).values, want[3])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pool", [30, 60, V - 1])
def test_the_pool_gather_is_right_where_a_rank_sends_its_whole_shard(block, world, pool):
    """`sharded_rollout_inputs` called where `rollout_inputs` keeps the full gather (the pool's
    would be no smaller): a shard smaller than K sends all its rows, the last one its padding
    too (masked: never in the pool), and the pool and logits are still the single rank's."""
    import torch.nn.functional as F

    mods, hidden, _ = block
    want = ri.rollout_inputs(**base_kwargs(mods, hidden, pool))

    def rank(r, group):
        shard = shard_args(mods[0], world, r)
        local = F.linear(hidden[:, :N], shard["lm_head_weight"])
        return ri.sharded_rollout_inputs(local, vocab=V, pool_size=pool, tp_group=group,
                                         org_vocab_start=shard["lm_head_org_vocab_start"],
                                         num_org=shard["lm_head_num_org"])

    outs, _ = run_ranks(world, rank)
    for got in outs:
        assert all(torch.equal(a, b) for a, b in zip(got, want[1:]))


def test_tied_logits_give_a_top_k_pool_that_every_rank_agrees_on(block):
    """Ids tied at the K-th largest value (duplicated lm_head rows, across shards): the
    ranks agree on the pool, it is a top-K set of the max over proposals 1..n-1 (nothing
    outside it above anything in it), sorted by id, and its logits are the vocabulary's."""
    mods, hidden, _ = block
    lm_head = mods[0].clone()
    kw = base_kwargs((lm_head, *mods[1:]), hidden, 20)
    scores = ri.base_logits(**kw)[1][:, 1:].amax(dim=1)
    # copy the row at row 0's 20th-largest score onto ten ids spread over the shards
    kth = torch.topk(scores[0], 20).indices[-1]
    lm_head[torch.arange(3, V, 9)[:10]] = lm_head[kth].clone()
    z, base = ri.base_logits(**kw)
    scores = base[:, 1:].amax(dim=1)
    for world in (2, 4):
        outs, _ = run_ranks(world, lambda r, g: ri.rollout_inputs(**{**kw, **shard_args(lm_head, world, r),
                                                                      "tp_group": g}))
        first, rest, pool = outs[0][1:]
        for other in outs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(other, outs[0]))
        assert torch.equal(pool, pool.sort(-1).values) and bool((pool[:, 1:] > pool[:, :-1]).all())
        inside = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, pool, True)
        lowest_in = scores.masked_fill(~inside, float("inf")).amin(-1)
        highest_out = scores.masked_fill(inside, float("-inf")).amax(-1)
        assert bool((lowest_in >= highest_out).all())
        assert torch.equal(first, base[:, 0])
        assert torch.equal(rest, base[:, 1:].gather(2, pool[:, None].expand(-1, N - 1, -1)))


def mixed_params(bs=BS):
    """Row 0 greedy (top-k 1), the others sampled under top-k and top-p."""
    info = SimpleNamespace(temperatures=torch.tensor([1.0, 0.7, 1.3])[:bs, None],
                           top_ks=torch.tensor([1, 12, TOP_K_ALL], dtype=torch.int32)[:bs],
                           top_ps=torch.tensor([1.0, 0.9, 0.95])[:bs], sampling_seed=None)
    return sr.DraftParams.of(info, torch.arange(10, 10 + bs))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pool", [5, 20])
def test_q_rollout_proposes_the_single_ranks_tokens_and_q(block, world, pool):
    """(c): `q_rollout` (what the draft graph holds) on every rank, on the same coins,
    proposes the single rank's tokens with the same q, bit for bit. (These pools are below
    the toy shards, so the pool's gather is taken; the full gather's q_first can differ
    from the single rank's in the last bit: its first row is a strided view of the
    transposed gather, and q's sums follow the layout.)"""
    mods, hidden, bonus = block
    kw = rollout_kwargs(mods, hidden, bonus, pool)
    coins = torch.rand(BS, N, generator=torch.Generator().manual_seed(5))
    want = sr.q_rollout(mixed_params(), coins, **kw)
    outs, groups = run_ranks(world, lambda r, g: sr.q_rollout(mixed_params(), coins,
                                                               **{**kw, **shard_args(mods[0], world, r),
                                                                  "tp_group": g}))
    for got in outs:
        for name in ("tokens", "q_draft", "q_first", "pool_ids", "q_rest"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    padded = -(-V // world)
    width = ri.pool_gather_width(padded, N, pool, mods[0].element_size())
    assert all(g.sent == [("all_gather", BS * width, 8)] for g in groups) and width < N * padded


@pytest.fixture
def standin(monkeypatch):
    """`murmur_hash32` on CPU tensors imports `sgl_kernel`: its CPU stand-in here."""
    pytest.importorskip("sglang")
    from sglang_domino.sglang.cpu import kernel_standin

    monkeypatch.setitem(sys.modules, "sgl_kernel", kernel_standin.build_module("test"))


def test_the_eager_rollout_and_the_graphs_sampler_propose_the_single_ranks_tokens(block, standin):
    """(c) through the server's callers, seeded rows (hashed coins): the eager
    `domino_sampled_rollout` and the draft graph's `QRuleDraftSampler` on 2 ranks propose
    the single rank's tokens with its q and pool."""
    from sglang_domino.sglang.sampling.q_sampler import QRuleDraftSampler

    mods, hidden, bonus = block
    ids = torch.cat((bonus[:, None], torch.zeros(BS, BLOCK - 1, dtype=torch.int64)), dim=1)
    info = SimpleNamespace(temperatures=torch.tensor([[1.0], [0.8], [1.2]]), top_ks=torch.tensor([1, 8, TOP_K_ALL]),
                           top_ps=torch.tensor([1.0, 0.9, 1.0]), need_top_k_sampling=True,
                           need_top_p_sampling=True, sampling_seed=torch.tensor([3, 4, 5]))
    positions = torch.tensor([10, 11, 12])

    def both(**extra):
        kw = {**rollout_kwargs(mods, hidden, bonus, 20), **extra}
        step = sr.SampledStep(info, positions)
        eager = sr.domino_sampled_rollout(step, in_cuda_graph=False, **kw)
        sampler = QRuleDraftSampler(block_size=BLOCK, max_bs=4, **{k: v for k, v in kw.items()
                                                                    if k not in ("draft_hidden", "bonus_tokens")})
        sampler.stage(info, positions, BS)
        sampler(hidden.reshape(BS * BLOCK, -1), ids.reshape(-1))
        return eager, step.draft, sampler.read(BS, BLOCK)

    want = both()
    outs, groups = run_ranks(2, lambda r, g: both(**shard_args(mods[0], 2, r), tp_group=g))
    width = ri.pool_gather_width(-(-V // 2), N, 20, 8)
    assert all(g.sent == [("all_gather", BS * width, 8)] * 2 for g in groups)   # the eager step's, the graph's
    for eager, draft, graph in outs:
        assert torch.equal(eager, want[0]) and torch.equal(graph.tokens, want[2].tokens)
        for name in ("q_draft", "q_first", "pool_ids", "q_rest"):
            assert torch.equal(getattr(draft, name), getattr(want[1], name)), name
            assert torch.equal(getattr(graph, name), getattr(want[2], name)), name


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_step_gathers_the_first_row_and_the_candidates_not_the_block(block, world, dtype):
    """(d): one all-gather per step of [bs, local] (the first row) + [bs, (n-1) x K'] (the
    candidates' later logits) + K' int64 ids per rank, K' = min(K, local), where the full
    gather sends [bs, n, local]; the full gather as before without a pool (0, the
    vocabulary), with one proposal, or where the pool's would be no smaller (K near a
    shard: these toy shards)."""
    mods, hidden, _ = block
    lm_head = mods[0].to(dtype)
    padded = -(-V // world)
    for pool, block_len in ((5, BLOCK), (20, BLOCK), (30, BLOCK), (0, BLOCK), (V, BLOCK), (5, 2)):
        kw = base_kwargs((lm_head, *mods[1:]), hidden[:, :block_len].to(dtype), pool)
        n = block_len - 1
        outs, groups = run_ranks(world, lambda r, g: ri.rollout_inputs(**{**kw, **shard_args(lm_head, world, r),
                                                                          "tp_group": g}))
        k = min(pool, padded)
        pooled = n > 1 and 0 < pool < V
        width = padded + (n - 1) * k + k * 8 // lm_head.element_size()   # int64 ids as the logits' dtype
        if pooled and width < n * padded:
            expected = BS * width
        else:
            expected = BS * n * padded
        for g in groups:
            assert g.sent == [("all_gather", expected, lm_head.element_size())], (pool, block_len, g.sent)
        assert (outs[0][3] is not None) == (n > 1 and 0 < pool < V)
        want = ri.rollout_inputs(**kw) if dtype == torch.float64 else outs[0]   # bf16: ties aside
        for got in outs:
            assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(got, want))
    assert ri.pool_gather_width(padded, N, 5, lm_head.element_size()) < N * padded   # the pool path was taken


@pytest.mark.parametrize("world", [2, 4, 8])
def test_at_qwen3s_size_a_rank_sends_a_tenth_to_a_fifth_of_the_block(world):
    """(d) at Qwen3's vocabulary (151936, bf16), 15 proposals and upstream's default pool
    (2048), on the meta device: the one gather's [bs, local + 14 x 2048 + 4 x 2048] against
    the full gather's [bs, 15, local]."""
    vocab, hidden, n, pool, bs = 151936, 64, 15, 2048, 2
    local = -(-vocab // world)
    sent = []

    class MetaRank:
        world_size = world

        def all_gather_into_tensor(self, out, inp):
            sent.append(inp.numel())
            out.copy_(inp.repeat(world, 1))

    kw = dict(draft_hidden=torch.empty(bs, n + 1, hidden, device="meta", dtype=torch.bfloat16),
              lm_head_weight=torch.empty(local, hidden, device="meta", dtype=torch.bfloat16), vocab_size=vocab,
              shift_label=True, candidate_pool_size=pool, tp_group=MetaRank(), lm_head_org_vocab_start=0,
              lm_head_num_org=local, lm_head_num_org_padded=local)
    z, first, rest, ids = ri.rollout_inputs(**kw)
    assert first.shape == (bs, vocab) and rest.shape == (bs, n - 1, pool) and ids.shape == (bs, pool)
    assert sent == [bs * (local + (n - 1) * pool + 4 * pool)]
    ratio = sent[0] / (bs * n * local)
    assert {2: 0.098 < ratio < 0.1, 4: 0.13 < ratio < 0.135, 8: 0.19 < ratio < 0.2}[world], ratio


def test_the_sharded_pool_reads_nothing_back_on_fake_cuda(block, monkeypatch):
    """(e): `q_rollout` on a rank of a vocabulary-parallel head with a pool, on fake CUDA
    tensors (a host read raises), makes its one gather; the control: a host read in the
    gather raises there."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    from tests.fake_cuda import fake_cuda
    from tests.sglang.tp_fakes import rollout_modules

    _, hidden, bonus = block
    world, pool = 4, 20
    lm_head, embed, gru, proj = rollout_modules(seed=21)

    class LoneRank:
        """Rank 1 of 4 whose peers send what it sends (shapes are what the fake checks)."""
        world_size, sent = world, []

        def all_gather_into_tensor(self, out, inp):
            self.sent.append(tuple(inp.shape))
            out.copy_(inp.repeat(world, 1))

    shard = shard_args(lm_head, world, 1)
    with fake_cuda(allow_non_fake_inputs=True) as mode:
        kw = dict(draft_hidden=mode.from_tensor(hidden).to("cuda"), bonus_tokens=mode.from_tensor(bonus).to("cuda"),
                  target_embedding=embed.to("cuda"), prefix_gru=gru.to("cuda"), embed_proj=proj.to("cuda"),
                  vocab_size=V, shift_label=True, candidate_pool_size=pool, tp_group=LoneRank(),
                  **{**shard, "lm_head_weight": shard["lm_head_weight"].to("cuda")})
        params = sr.DraftParams.empty(BS, "cuda")
        coins = torch.rand(BS, N, device="cuda")
        d = sr.q_rollout(params, coins, **kw)
        assert d.tokens.device.type == "cuda"
        assert d.q_first.shape == (BS, V) and d.pool_ids.shape == (BS, pool) and d.q_rest.shape == (BS, N - 1, pool)
        assert LoneRank.sent == [(BS, 25 + (N - 1) * 20 + 20)]

        class Syncing(LoneRank):
            def all_gather_into_tensor(self, out, inp):
                if bool((inp[:, 0] > 0).any()):
                    pass
                super().all_gather_into_tensor(out, inp)

        with pytest.raises(DataDependentOutputException):
            sr.q_rollout(params, coins, **{**kw, "tp_group": Syncing()})
