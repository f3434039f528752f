"""`sglang_domino.sglang.sampling.sampled_rollout`, the q rule's rollout, against 0.5.23's own greedy
Domino rollout (`domino_greedy_rollout`) and for seeded reproducibility, in process."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from tests.sglang.tp_fakes import V, Exchange, FakeGroup, du, rollout_modules

BLOCK, BS = 8, 4


TOP_K_ALL = 1 << 30     # 0.5.23's top-k of a request that sets none (`sampling_params.py:43`)


def _sampling_info(bs, temperature=1.0, top_k=TOP_K_ALL, seeds=None):
    top_ks = torch.full((bs,), top_k, dtype=torch.int32)
    return SimpleNamespace(temperatures=torch.full((bs, 1), float(temperature)), top_ks=top_ks,
                           top_ps=torch.ones(bs), need_top_k_sampling=top_k != TOP_K_ALL, need_top_p_sampling=False,
                           sampling_seed=None if seeds is None else torch.tensor(seeds, dtype=torch.int64))


def _kwargs(mods, hidden, bonus, pool, shift_label=True, **tp):
    lm_head, embed, gru, proj = mods
    return dict(draft_hidden=hidden, bonus_tokens=bonus, target_embedding=embed, lm_head_weight=lm_head,
                prefix_gru=gru, embed_proj=proj, vocab_size=V, shift_label=shift_label,
                candidate_pool_size=pool, in_cuda_graph=False, **tp)


@pytest.fixture(scope="module")
def inputs():
    mods = rollout_modules(seed=3)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(BS, BLOCK, mods[0].shape[1], generator=g, dtype=torch.float64)
    bonus = torch.randint(0, V, (BS,), generator=g)
    return mods, hidden, bonus


@pytest.fixture
def standin(monkeypatch):
    """`murmur_hash32` on CPU tensors imports `sgl_kernel` and calls its torch op; servers
    get the CPU stand-in from the platform hook, this process gets it here."""
    from sglang_domino.sglang.cpu import kernel_standin

    monkeypatch.setitem(sys.modules, "sgl_kernel", kernel_standin.build_module("test"))


@pytest.mark.parametrize("pool", [0, 20])
@pytest.mark.parametrize("shift_label", [True, False])
def test_greedy_rows_propose_upstreams_greedy_chain(inputs, pool, shift_label):
    """Rows with top-k 1 (how 0.5.23 encodes a greedy request) draw from a point mass on
    the argmax: the sampled rollout is then upstream's greedy rollout, token for token,
    with and without the candidate pool: the same base logits, slots, GRU and correction."""
    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout

    mods, hidden, bonus = inputs
    kw = _kwargs(mods, hidden, bonus, pool, shift_label)
    step = SampledStep(_sampling_info(BS, top_k=1), torch.full((BS,), 10))
    tokens = domino_sampled_rollout(step, **kw)
    assert torch.equal(tokens, du.domino_greedy_rollout(**kw))
    q = step.draft.q_draft
    assert torch.equal(q, torch.ones_like(q))          # q at each proposal: a point mass
    if pool:
        assert step.draft.pool_ids.shape == (BS, pool) and step.draft.q_rest.shape == (BS, BLOCK - 2, pool)


def test_sampled_rows_stay_on_the_pool_and_record_q(inputs):
    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout

    mods, hidden, bonus = inputs
    step = SampledStep(_sampling_info(BS, temperature=2.0), torch.full((BS,), 10))
    tokens = domino_sampled_rollout(step, **_kwargs(mods, hidden, bonus, pool=20))
    d = step.draft
    for k in range(1, BLOCK - 1):
        on_pool = (d.pool_ids == tokens[:, k:k + 1]).any(-1)
        assert bool(on_pool.all())
        q_rest = d.q_rest[:, k - 1]
        assert torch.allclose(q_rest.sum(-1), torch.ones(BS, dtype=q_rest.dtype))
        picked = q_rest.gather(1, (d.pool_ids == tokens[:, k:k + 1]).float().argmax(-1, keepdim=True))[:, 0]
        assert torch.equal(picked, d.q_draft[:, k])
    assert torch.allclose(d.q_first.sum(-1), torch.ones(BS))


def _seeded_step(mods, hidden, bonus, seeds):
    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout

    step = SampledStep(_sampling_info(BS, seeds=seeds), torch.tensor([10, 11, 12, 13]))
    tokens = domino_sampled_rollout(step, **_kwargs(mods, hidden, bonus, pool=0))
    target = torch.randn(BS, BLOCK, V, generator=torch.Generator().manual_seed(0)).softmax(-1)
    accepted, nxt = step.accept(tokens, target)
    return tokens, accepted, nxt


def test_seeded_rows_repeat(inputs, standin):
    """Coins hashed from (sampling_seed, committed length, column): the same seeds give the
    same proposals and the same acceptance, whatever torch's RNG does; other seeds differ."""
    mods, hidden, bonus = inputs
    torch.manual_seed(1)
    first = _seeded_step(mods, hidden, bonus, [1, 2, 3, 4])
    torch.manual_seed(2)
    again = _seeded_step(mods, hidden, bonus, [1, 2, 3, 4])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = _seeded_step(mods, hidden, bonus, [5, 6, 7, 8])
    assert not torch.equal(first[0], other[0])


def test_sampled_rollout_through_a_vocab_parallel_head_matches_one_rank(inputs, standin):
    """`--tp-size 2`: base logits all-gathered from each rank's lm_head shard as upstream does
    (`domino_utils.py:422-436`); with the same (seeded) coins both ranks propose what one rank
    does. (Unseeded ranks are kept together by broadcasting rank 0's proposals.)"""
    import threading

    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout

    mods, hidden, bonus = inputs
    lm_head = mods[0]
    padded = (V + 1) // 2
    weight = torch.zeros(2 * padded, lm_head.shape[1], dtype=lm_head.dtype)
    weight[:V] = lm_head

    def run(kw, seed):
        step = SampledStep(_sampling_info(BS, seeds=[seed] * BS), torch.arange(10, 10 + BS))
        return domino_sampled_rollout(step, **kw)

    single = run(_kwargs(mods, hidden, bonus, pool=0), 7)
    exchange, out = Exchange(2), [None, None]

    def rank(r):
        shard = weight[r * padded:(r + 1) * padded]
        kw = _kwargs((shard, *mods[1:]), hidden, bonus, pool=0, tp_group=FakeGroup(exchange, r),
                     lm_head_org_vocab_start=r * padded, lm_head_num_org=min(padded, V - r * padded),
                     lm_head_num_org_padded=padded)
        out[r] = run(kw, 7)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(out[0], single) and torch.equal(out[1], single)


def test_rollout_hook_embeds_feedback_plainly_and_answers_a_one_slot_block(inputs, monkeypatch):
    """The hook on upstream's rollout: a single-rank unquantized `VocabParallelEmbedding` is
    looked up with `F.embedding` on its weight (anything else is left alone), the greedy
    rollout's tokens unchanged; a one-slot block (an adaptive width-1 step) proposes nothing.
    (Upstream's eager rollout on CPU: the compiled one switched off, tests/sglang/test_cpu_rollout.py.)"""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    from sglang_domino.sglang.cpu.compiled import switches
    from sglang_domino.sglang.step.rollout_hook import around_domino_rollout, embedding_weight

    monkeypatch.setattr(switches._Process, "compiled", False)   # upstream's eager rollout, not the compiled one
    mods, hidden, bonus = inputs
    weight = mods[1].weight
    layer = SimpleNamespace(tp_size=1, output_dtype=None, quant_method=UnquantizedEmbeddingMethod(), weight=weight)
    assert embedding_weight(layer) is weight
    for other in (SimpleNamespace(**{**vars(layer), "tp_size": 2}),
                  SimpleNamespace(**{**vars(layer), "output_dtype": torch.float16}), mods[1]):
        assert embedding_weight(other) is None
    seen = []

    def upstream(**kw):
        seen.append(kw["target_embedding"])
        return du.domino_greedy_rollout(**kw)

    kwargs = _kwargs(mods, hidden, bonus, 0)
    want = du.domino_greedy_rollout(**kwargs)
    got = around_domino_rollout(upstream, **{**kwargs, "target_embedding": layer})
    assert torch.equal(got, want) and seen[-1] is not layer
    empty = around_domino_rollout(upstream, **{**kwargs, "draft_hidden": hidden[:, :1]})
    assert empty.shape == (BS, 0) and len(seen) == 1


def test_the_rollout_stages_and_draws_on_the_device_without_a_host_read(inputs, monkeypatch):
    """Qwen3's default sampling (T 0.6, top-k 20, top-p 0.95) on fake CUDA tensors, which
    raise on a host read as a GPU stalls on one: the parameters staged from the batch, the
    seeded coins (upstream's hash, its CPU stand-in standing for the Triton kernel), the
    rollout and the acceptance's coins. 0.5.23's own transform for p reads the batch's
    largest top-k from the device when it is not given; ours needs no bound."""
    from sglang.srt.layers import sampler as upstream_sampler

    from sglang_domino.sglang.cpu import kernel_standin
    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout
    from tests.fake_cuda import fake_cuda

    monkeypatch.setattr(upstream_sampler, "murmur_hash32", kernel_standin.murmur_hash32_cpu)
    _, hidden, bonus = inputs
    lm_head, embed, gru, proj = rollout_modules(seed=3)   # fresh: `Module.to` moves the modules themselves
    with fake_cuda(allow_non_fake_inputs=True) as mode:
        cuda = lambda t: mode.from_tensor(t).to("cuda")  # noqa: E731
        modules = (lm_head.to("cuda"), embed.to("cuda"), gru.to("cuda"), proj.to("cuda"))
        for seeds in (None, [1, 2, 3, 4]):
            info = SimpleNamespace(temperatures=torch.full((BS, 1), 0.6, device="cuda"),
                                   top_ks=torch.full((BS,), 20, dtype=torch.int32, device="cuda"),
                                   top_ps=torch.full((BS,), 0.95, device="cuda"),
                                   sampling_seed=None if seeds is None else torch.tensor(seeds, device="cuda"))
            step = SampledStep(info, torch.full((BS,), 10, device="cuda"))
            kw = _kwargs(modules, cuda(hidden), cuda(bonus), pool=20)
            tokens = domino_sampled_rollout(step, **kw)
            assert tokens.device.type == "cuda" and tokens.shape == (BS, BLOCK - 1)
            # the acceptance's coins (the Triton kernel they feed cannot run on fake tensors;
            # the GPU check launches it on the device)
            u = step.accept_uniforms(BLOCK - 1)
            assert u.steps.shape == (BS, BLOCK - 1) and u.final.device.type == "cuda"
