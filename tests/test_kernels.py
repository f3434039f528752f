"""Triton kernels against their PyTorch references (CPU: TRITON_INTERPRET=1, see conftest)."""

import pytest
import torch

from sglang_domino.accept import Uniforms, accept_probs
from sglang_domino.kernels.chain_accept import accept_chain, densify_q


def chain_case(b: int, n: int, V: int, mode: str, seed: int):
    """A batch whose requests range from a draft equal to the target to a poor one.

    mode "pool": q_0 dense, q_1.. on a random pool of K = V // 3 ids (where the target
    puts most of its mass); "dense": no pool (pool_ids = arange(V)); "point": point-mass
    drafts, the argmax of the pool mode's q. Every fourth request gets near-zero step
    coins (so it accepts all n); one request proposes an off-pool token (q(d) = 0)."""
    g = torch.Generator().manual_seed(seed)
    K = V // 3 if mode != "dense" else V
    if mode == "dense":
        pool_ids = torch.arange(V).expand(b, V)
    else:
        pool_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(b)])
    on_pool = torch.zeros(b, V).scatter_(1, pool_ids, 1.0)
    logits = torch.randn(b, n + 1, V, generator=g) + 3 * on_pool[:, None]
    p = torch.softmax(logits, -1)
    sigma = torch.linspace(0, 3, b)[:, None, None]
    draft_logits = logits[:, :n] + sigma * torch.randn(b, n, V, generator=g)
    q_first = torch.softmax(draft_logits[:, 0], -1)
    rest = draft_logits[:, 1:].gather(2, pool_ids[:, None].expand(b, n - 1, K))
    q_rest = torch.softmax(rest, -1)
    if n == 1:
        pool_ids = q_rest = None
    q = densify_q(q_first, pool_ids, q_rest, V)
    if mode == "point":
        drafts = q.argmax(-1)
    else:
        drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, n)
        if mode == "pool" and n > 2:
            drafts[1, 2] = int((1 - on_pool[1]).nonzero()[0])
    u = Uniforms.draw(b, n, "cpu", g)
    # A point mass on a flat target is accepted with probability p(d) alone: there the
    # other requests' coins shrink from 1 to 0.01 so that some chains run mid-way.
    rest_scale = torch.logspace(0, -2, b) if mode == "point" else torch.ones(b)
    scale = torch.where(torch.arange(b) % 4 == 0, 1e-4, rest_scale)[:, None]
    u = Uniforms(u.steps * scale, u.final)
    q_draft = q.gather(-1, drafts[..., None]).squeeze(-1)
    return p, drafts, q, q_draft, q_first, pool_ids, q_rest, u


@pytest.mark.parametrize("mode", ["pool", "dense", "point"])
@pytest.mark.parametrize("n,V,block", [(1, 37, 8), (5, 300, 64), (15, 37, 8), (15, 300, 64)])
def test_chain_accept_kernel_matches_reference(n, V, block, mode):
    b = 16
    p, drafts, q, q_draft, q_first, pool_ids, q_rest, u = chain_case(b, n, V, mode, seed=n * 1000 + V)
    point = mode == "point"
    clobbered = p.clone()
    if point:
        accepted, nxt = accept_chain(drafts, None, None, None, None, clobbered, u, block=block)
    else:
        accepted, nxt = accept_chain(drafts, q_draft, q_first, pool_ids, q_rest, clobbered, u, block=block)
    ref_accepted, ref_next = accept_probs(drafts, None if point else q, p.clone(), uniforms=u)
    assert torch.equal(accepted, ref_accepted) and torch.equal(nxt, ref_next)
    # Acceptance lengths vary: full chains, rejections at 0 and (n > 1) mid-chain.
    assert (accepted == n).any() and (accepted == 0).any()
    assert n == 1 or ((accepted > 0) & (accepted < n)).any()
    if mode == "pool" and n > 2:
        assert accepted[1] <= 2          # the off-pool draft is never accepted
    # In place: only a rejected pool row (1 <= j < n) holds its residual max(p - q, 0).
    expected = p.clone()
    for r, j in enumerate(accepted.tolist()):
        if not point and 1 <= j < n:
            expected[r, j] = (p[r, j] - q[r, j]).clamp_min(0)
    assert torch.equal(clobbered, expected)


def test_chain_accept_kernel_falls_back_to_p_without_residual_mass():
    """Residuals that are exactly zero (q >= p wherever p > 0) sample from p, as the
    reference does; a pool row whose residual lives only off the pool is no fallback."""
    b, n, V, K = 3, 3, 37, 12
    g = torch.Generator().manual_seed(7)
    pool_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(b)])
    p = torch.rand(b, n + 1, V, generator=g)
    p[0, 1] = 0                                       # request 0: row 1 lives on the pool only
    p[0, 1, pool_ids[0, :6]] = torch.rand(6, generator=g)
    q_first = torch.softmax(torch.randn(b, V, generator=g), -1)
    q_first[2] = p[2, 0]                              # request 2: q_0 = p_0
    q_rest = torch.rand(b, n - 1, K, generator=g)
    q_rest[0, 0] = p[0, 1, pool_ids[0]]               # request 0: q_1 = p_1 (zero residual)
    q_rest[1, 0] = 1.0                                # request 1: q_1 >= p_1 on the pool
    q = densify_q(q_first, pool_ids, q_rest, V)
    drafts = torch.stack([pool_ids[:, 0], pool_ids[:, 8], pool_ids[:, 9]], dim=1)
    p[2, 0, drafts[2, 0]] = 0                         # request 2: q_0(d_0) = p_0(d_0) = 0, rejected
    q[2, 0, drafts[2, 0]] = 0
    q_first[2, drafts[2, 0]] = 0
    q_draft = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = Uniforms(torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.999, 0.5], [0.5, 0.5, 0.5]]), torch.rand(b, generator=g))
    ref = accept_probs(drafts, q, p.clone(), uniforms=u)
    out = accept_chain(drafts, q_draft, q_first, pool_ids, q_rest, p.clone(), u, block=8)
    assert ref[0].tolist() == [1, 1, 0] and torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert pool_ids[0, :6].eq(out[1][0]).any()        # drawn from p_1 (on the pool)
    assert not pool_ids[1].eq(out[1][1]).any()        # drawn from the off-pool residual

    # Point mass: p_0 is mass on d_0 alone, rejected (u >= p(d_0)): the draw is d_0 itself.
    p = torch.zeros(2, 2, V)
    p[:, 0, 5] = 0.3
    p[:, 1] = torch.rand(2, V, generator=g)
    drafts = torch.tensor([[5], [5]])
    u = Uniforms(torch.tensor([[0.5], [0.1]]), torch.tensor([0.3, 0.9]))
    ref = accept_probs(drafts, None, p.clone(), uniforms=u)
    out = accept_chain(drafts, None, None, None, None, p.clone(), u, block=8)
    assert ref[0].tolist() == [0, 1] and ref[1][0] == 5
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_chain_accept_kernel_checks_shapes():
    b, n, V, K = 2, 4, 11, 5
    drafts = torch.zeros(b, n, dtype=torch.long)
    p = torch.full((b, n + 1, V), 1.0 / V)
    u = Uniforms.draw(b, n, "cpu")
    q_d, q_f = torch.ones(b, n), torch.full((b, V), 1.0 / V)
    pool, q_r = torch.arange(K).expand(b, K), torch.full((b, n - 1, K), 0.2)
    with pytest.raises(ValueError, match=r"q_rest: expected shape \(2, 3, 5\), got \(2, 4, 5\)"):
        accept_chain(drafts, q_d, q_f, pool, torch.zeros(b, n, K), p, u)
    with pytest.raises(ValueError, match=r"target_probs: expected shape \(2, 5, 11\), got \(2, 4, 11\)"):
        accept_chain(drafts, q_d, q_f, pool, q_r, p[:, :n], u)
    with pytest.raises(ValueError, match=r"q_first: expected shape \(2, 11\), got \(2, 10\)"):
        accept_chain(drafts, q_d, q_f[:, 1:], pool, q_r, p, u)
    with pytest.raises(ValueError, match=r"uniforms.steps: expected shape \(2, 4\), got \(2, 3\)"):
        accept_chain(drafts, q_d, q_f, pool, q_r, p, Uniforms(u.steps[:, 1:], u.final))
    with pytest.raises(ValueError, match=r"q_rest: expected a tensor"):
        accept_chain(drafts, q_d, q_f, pool, None, p, u)
    with pytest.raises(ValueError, match=r"q_first, q_rest: expected None in point-mass mode"):
        accept_chain(drafts, None, q_f, None, q_r, p, u)
    with pytest.raises(ValueError, match=r"target_probs: expected contiguous float32"):
        accept_chain(drafts, None, None, None, None, p.double(), u)


def _variant_keys(monkeypatch, *, aligned_scalars: bool = True) -> list:
    """Record, instead of launching, the key Triton picks a compiled chain-accept variant
    by (its own binder over the kernel's signature and specialisation options)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime import jit

    from sglang_domino.kernels import chain_accept as ca

    twin = jit.JITFunction(ca._chain_accept_kernel.fn,   # a Recorder of an earlier call keeps .fn do_not_specialize=ca.NO_VALUE_SPECIALIZATION,
                           do_not_specialize_on_alignment=ca.NO_ALIGNMENT_SPECIALIZATION if aligned_scalars else ())
    binder = jit.create_function_from_signature(twin.signature, twin.params, BaseBackend)
    keys = []

    class Recorder:
        fn = staticmethod(twin.fn)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: keys.append(str(binder(*args, **kwargs)[1]))

    monkeypatch.setattr(ca, "_chain_accept_kernel", Recorder())
    return keys


@pytest.mark.parametrize("b", [1, 3])
def test_chain_accept_served_views_use_the_variant_the_warm_up_built(monkeypatch, b):
    """A served q-rule step passes views of its buffers (`candidates[:, 1:]`, `u[:, n]`);
    at batch 1 they are contiguous but not 16-byte aligned. The start-up warm-up launches
    on fresh tensors; the served call must land on the variant it built, or Triton compiles
    one in the middle of serving (issue 45)."""
    from sglang_domino.sglang.step.warmup import _warm_chain_accept

    n, V, K = 15, 4096, 64
    keys = _variant_keys(monkeypatch)
    _warm_chain_accept(n, V, K, "cpu")
    candidates = torch.zeros(b, n + 1, dtype=torch.int64)
    u = torch.rand(b, n + 1)
    q = torch.rand(b, n + 1)
    pool = torch.arange(K).expand(b, K)
    accept_chain(candidates[:, 1:], q[:, 1:], torch.rand(b, V), pool, torch.rand(b, n - 1, K),
                 torch.rand(b, n + 1, V), Uniforms(u[:, :n], u[:, n]))
    assert len(keys) == 2 and keys[0] == keys[1]
    if b == 1:      # the views are misaligned: a kernel that specialised them would compile anew
        unaligned = _variant_keys(monkeypatch, aligned_scalars=False)
        _warm_chain_accept(n, V, K, "cpu")
        accept_chain(candidates[:, 1:], q[:, 1:], torch.rand(b, V), pool, torch.rand(b, n - 1, K),
                     torch.rand(b, n + 1, V), Uniforms(u[:, :n], u[:, n]))
        assert unaligned[0] != unaligned[1]


def test_chain_accept_copies_a_misaligned_tile_input(monkeypatch):
    """The vocabulary and pool rows keep their alignment specialisation: a misaligned view
    reaches the kernel as an aligned copy (the same variant), and the result is the
    reference's."""
    p, drafts, q, q_draft, q_first, pool_ids, q_rest, u = chain_case(2, 4, 64, "pool", seed=3)
    ref = accept_probs(drafts, q, p.clone(), uniforms=u)
    flat = torch.zeros(1 + q_first.numel())
    flat[1:] = q_first.flatten()
    shifted = flat[1:].view_as(q_first)         # contiguous, 4 bytes past an aligned start
    assert shifted.is_contiguous() and shifted.data_ptr() % 16
    out = accept_chain(drafts, q_draft, shifted, pool_ids, q_rest, p.clone(), u, block=16)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    keys = _variant_keys(monkeypatch)
    for first in (q_first, shifted):
        accept_chain(drafts, q_draft, first, pool_ids, q_rest, p.clone(), u, block=16)
    assert keys[0] == keys[1]
