"""The worker's per-step glue around the step, run on fake CUDA tensors (`tests.fake_cuda`:
a host read of a device value, as `.item()`, `torch.equal` or a tensor's truth value,
raises as a GPU would stall on it): the q rule's acceptance (`SampledStep.accept`, through
the chain-accept kernel's host-side wrapper), the worker's q-rule accept
(`_accept_q_rule`, upstream's target probabilities and commit included) and its step
entry (`_forward_with_q_rollout`), and the Transformers window's in-graph rollout
(`draft_tail.WindowProposals`). Each ran only on CPU tensors elsewhere, where a planted
host read passes. Stand-ins, shape-only: the Triton kernel's launch (no fake kernel) and
upstream's step (the draft and target forwards). Batches of 1 and 4, a 16-wide block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("sglang")

from sglang.srt.speculative import dflash_worker_v2 as w2  # noqa: E402

from sglang_domino.kernels import chain_accept  # noqa: E402
from sglang_domino.sglang.adaptive.draft_tail import WindowProposals  # noqa: E402
from sglang_domino.sglang.sampling.q_sampler import QRuleDraftSampler  # noqa: E402
from sglang_domino.sglang.sampling.sampled_rollout import QDraft, SampledStep, active_step, sampled_step  # noqa: E402
from sglang_domino.sglang.step.worker import DominoDFlashWorker  # noqa: E402
from tests.fake_cuda import fake_cuda  # noqa: E402

BLOCK, V, H, POOL, MAX_BS = 16, 97, 16, 20, 8


@pytest.fixture
def cuda(monkeypatch):
    """Fake CUDA, with shape-only stand-ins for what has no fake kernel: the chain-accept
    kernel's launch (its host-side wrapper runs) and upstream's seeded-coin hash (a Triton
    kernel; its CPU stand-in is plain torch). Yields the kernel's launches."""
    from sglang.srt.layers import sampler as upstream_sampler

    from sglang_domino.sglang.cpu import kernel_standin

    launches = []

    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs))

    monkeypatch.setattr(chain_accept, "_chain_accept_kernel", Launch())
    monkeypatch.setattr(upstream_sampler, "murmur_hash32", kernel_standin.murmur_hash32_cpu)
    with fake_cuda():
        yield launches


def sampling_info(bs, seeded=False, greedy=False):
    """Qwen3's default sampling (T 0.6, top-k 20, top-p 0.95) on the device, as 0.5.23's
    `SamplingBatchInfo` holds it; greedy rows have top-k 1."""
    return SimpleNamespace(
        is_all_greedy=greedy, need_top_k_sampling=True, need_top_p_sampling=not greedy,
        temperatures=torch.full((bs, 1), 0.6, device="cuda"),
        top_ks=torch.full((bs,), 1 if greedy else 20, dtype=torch.int32, device="cuda"),
        top_ps=torch.full((bs,), 0.95, device="cuda"),
        sampling_seed=torch.arange(bs, device="cuda") + 7 if seeded else None)


def q_draft(bs, n, pool=POOL):
    """A rollout's proposals and q in the kernel's layout: over a pool of `pool` ids, or
    (pool 0) dense over the vocabulary; no later proposals when n == 1."""
    rest = None if n == 1 else torch.rand(bs, n - 1, pool or V, device="cuda")
    ids = torch.randint(0, V, (bs, pool), device="cuda") if pool and n > 1 else None
    return QDraft(torch.randint(0, V, (bs, n), device="cuda"), torch.rand(bs, n, device="cuda"),
                  torch.rand(bs, V, device="cuda").softmax(-1), ids, rest)


def q_sampler():
    """The captured q rule's static buffers (`QRuleDraftSampler`); its graph tail is
    tests/sglang/test_q_sampler.py's."""
    return QRuleDraftSampler(block_size=BLOCK, max_bs=MAX_BS, vocab_size=V, candidate_pool_size=POOL,
                             lm_head_weight=torch.empty(V, H, device="cuda"), shift_label=True)


def worker(sampler=None):
    """A `DominoDFlashWorker` holding only what its q-rule methods read."""
    w = object.__new__(DominoDFlashWorker)
    w.q_rule, w._q_sampler, w._draft_sampler = True, sampler, sampler if sampler is not None else "greedy sampler"
    w._step_penalties = None
    w._tp_sync = SimpleNamespace(sync=lambda site, t: t)
    return w


def assert_cuda(*tensors):
    assert all(t.device.type == "cuda" for t in tensors)


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("n, pool", [(BLOCK - 1, POOL), (BLOCK - 1, 0), (3, POOL), (1, POOL)])
@pytest.mark.parametrize("seeded", [False, True])
def test_the_q_rules_acceptance_launches_the_kernel_without_a_host_read(cuda, bs, n, pool, seeded):
    """`SampledStep.accept` on CUDA: the acceptance's coins (seeded: hashed), the pool
    (without one, the vocabulary as a stride-0 pool) and the kernel wrapper's staging,
    up to the launch: one program per request."""
    step = SampledStep(sampling_info(bs, seeded), torch.full((bs,), 30, device="cuda"), draft=q_draft(bs, n, pool))
    target = torch.rand(bs, n + 1, V, device="cuda").softmax(-1)
    accepted, nxt = step.accept(step.draft.tokens, target)
    assert_cuda(accepted, nxt)
    assert accepted.shape == nxt.shape == (bs,) and accepted.dtype == nxt.dtype == torch.int64
    ((grid, kwargs),) = cuda
    assert grid == (bs,) and kwargs["POINT_MASS"] is False


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("width", [BLOCK, 4])
@pytest.mark.parametrize("graph", [True, False])
def test_the_workers_q_rule_accept_stays_on_the_device(cuda, bs, width, graph):
    """`_accept_q_rule` (reached through `_accept_block`, as upstream calls it): the
    proposals and q read from the draft graph's buffers (a narrow step: their first
    width - 1) or the eager rollout's, upstream's target probabilities over the verify
    logits, the acceptance and the commit, all without a host read."""
    sampler = q_sampler() if graph else None
    w = worker(sampler)
    info = sampling_info(bs)
    step = SampledStep(info, torch.full((bs,), 30, device="cuda"),
                       draft=None if graph else q_draft(bs, BLOCK - 1).narrowed(width - 1))
    drafts = (sampler.read(bs, width) if graph else step.draft).tokens
    candidates = torch.cat((torch.randint(0, V, (bs, 1), device="cuda"), drafts), dim=1)
    kwargs = dict(candidates=candidates, next_token_logits=torch.randn(bs * width, V, device="cuda"),
                  sampling_info=info, draft_input=SimpleNamespace(max_top_k=20, uniform_top_k_value=20), bs=bs)
    with sampled_step(step):
        accept_len, commit_lens, bonus, out_tokens, _ = w._accept_block(**kwargs)
    assert_cuda(accept_len, commit_lens, bonus, out_tokens)
    assert accept_len.shape == commit_lens.shape == bonus.shape == (bs,) and out_tokens.shape == (bs, width)
    assert accept_len.dtype == torch.int32 and step.draft.tokens.shape == (bs, width - 1)
    assert len(cuda) == 1
    _, _, _, _, direct = w._accept_q_rule(step, **kwargs)   # and called directly
    assert direct is None and len(cuda) == 2


def upstream_step(seen):
    """Upstream's step, shape-only (its draft and target forwards need a model): records
    what it is handed, and for a sampled step reads what the rollout and the acceptance
    read of it (parameters, coins) on the device."""

    def forward_batch_generation(self, batch, *args, **kwargs):
        step = active_step()
        if step is not None:
            n = BLOCK - 1
            assert_cuda(*step.params, step.coins(0, n), step.accept_uniforms(n).final)
        seen.append((step, self._draft_sampler))
        return "result"

    return forward_batch_generation


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("graph", [True, False])
def test_the_q_rule_step_entry_stages_and_routes_without_a_host_read(cuda, monkeypatch, bs, graph):
    """`_forward_with_q_rollout` for a greedy, a sampled (seeded or not) and an extend
    batch: the rows staged into the draft graph's buffers, or the in-graph greedy sampler
    stepped around for the eager rollout, with the step current."""
    seen = []
    monkeypatch.setattr(w2.DFlashWorkerV2, "forward_batch_generation", upstream_step(seen))
    sampler = q_sampler() if graph else None
    w = worker(sampler)
    in_graph = w._draft_sampler

    def batch(info, extend=False):
        mode = SimpleNamespace(is_extend=lambda: extend, is_idle=lambda: False)
        return SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, sampling_info=info,
                               seq_lens=torch.arange(20, 20 + bs, device="cuda"), reqs=[None] * bs,
                               spec_info=SimpleNamespace(max_top_k=20))

    for info in (sampling_info(bs, greedy=True), sampling_info(bs), sampling_info(bs, seeded=True)):
        assert w._forward_with_q_rollout(batch(info)) == "result"
        step, draft_sampler = seen[-1]
        assert (step is None) == info.is_all_greedy
        assert draft_sampler is (in_graph if graph or step is None else None)
        assert w._draft_sampler is in_graph
        if graph:
            assert_cuda(*sampler.params.rows(bs))
    assert w._forward_with_q_rollout(batch(sampling_info(bs), extend=True)) == "result" and seen[-1][0] is None


def window_sampler(pool):
    """0.5.23's greedy Domino sampler over a 16-slot shift_label block, its modules on the
    device (float32; bias-free GRU as upstream's Domino draft)."""
    embed = nn.Embedding(V, H, device="cuda")
    gru = nn.GRU(H, 8, bias=False, batch_first=True, device="cuda")
    proj = nn.Sequential(nn.Linear(H + 8, 6, bias=False, device="cuda"), nn.SiLU(),
                         nn.Linear(6, V, bias=False, device="cuda"))
    return w2._DominoDraftSampler(target_embedding=embed, lm_head_weight=torch.randn(V, H, device="cuda"),
                                  prefix_gru=gru, embed_proj=proj, vocab_size=V, block_size=BLOCK, shift_label=True,
                                  max_bs=MAX_BS, candidate_pool_size=pool)


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("pool", [0, POOL])
def test_the_transformers_window_rolls_out_in_the_graph_without_a_host_read(cuda, bs, pool):
    """`WindowProposals` (window 17 over a block of 16): the block padded to the window,
    upstream's in-graph greedy rollout over it (run, not stubbed) and the window-wide
    rows written to `out`."""
    sampler = WindowProposals(window_sampler(pool), BLOCK + 1)
    with torch.no_grad():
        sampler(torch.randn(bs * BLOCK, H, device="cuda"), torch.randint(0, V, (bs * BLOCK,), device="cuda"))
    assert sampler.out.device.type == "cuda" and sampler.out.dtype == torch.int64
    read = sampler.out[: bs * BLOCK].view(bs, BLOCK)    # upstream's read of a window-wide step
    assert read.shape == (bs, BLOCK)


def test_the_q_rules_verify_probabilities_live_only_in_the_borrowed_graph_pool(cuda, monkeypatch):
    """0.5.23 builds its sampled verify's [bs, width, V] probabilities inside
    `borrow_graph_pool` (the graph pool's idle bytes, rewritten by the next replay); the q
    rule does the same: the probabilities and the accept run inside the scope, the step's
    parameters are built before it, and nothing made inside outlives it (the results
    leave as copies)."""
    import contextlib
    import gc
    import weakref

    from sglang.srt.model_executor.runner_utils import pool as upstream_pool

    scopes, inside = [], []

    @contextlib.contextmanager
    def borrow(user):
        scopes.append((user, "params" in vars(step)))
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    made = []
    real_accept = SampledStep.accept

    def accept(self, drafts, target_probs):
        assert inside, "the accept ran outside the borrowed scope"
        out = real_accept(self, drafts, target_probs)
        made.extend(weakref.ref(t) for t in (target_probs, *out))
        return out

    monkeypatch.setattr(upstream_pool, "borrow_graph_pool", borrow)
    monkeypatch.setattr(SampledStep, "accept", accept)
    bs, width = 4, BLOCK
    info = sampling_info(bs)
    step = SampledStep(info, torch.full((bs,), 30, device="cuda"), draft=q_draft(bs, width - 1))
    candidates = torch.cat((torch.randint(0, V, (bs, 1), device="cuda"), step.draft.tokens), dim=1)
    result = worker()._accept_q_rule(step, candidates=candidates,
                                     next_token_logits=torch.randn(bs * width, V, device="cuda"),
                                     sampling_info=info, bs=bs,
                                     draft_input=SimpleNamespace(max_top_k=20, uniform_top_k_value=20))
    gc.collect()
    assert scopes == [("sglang-domino q-rule verify probabilities", True)]
    assert len(made) == 3 and all(ref() is None for ref in made)
    assert result[0].shape == result[2].shape == (bs,)
