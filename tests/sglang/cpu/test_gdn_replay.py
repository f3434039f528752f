"""The PyTorch references of 0.5.23's GDN ReplaySSM kernels (`sglang_domino/sglang/cpu/hybrid/gdn_replay.py`):
(i) each equals upstream's Triton kernel, run here under the Triton interpreter
(`tests/conftest.py` sets TRITON_INTERPRET=1); (ii) verify-then-commit equals the snapshot
semantics: the outputs of a verify window and the state committed after accepting a prefix of
length a are those of the plain gated delta rule run token by token over the a + 1 verified
tokens, at every a; (iii) a fully rejected draft moves only the bonus token into the state.

Shapes are tiny, but head dims are 16: upstream's verify kernel tiles K for `tl.dot`, which
wants tiles of at least 16 (`nk=1` keeps one such tile). Everything is float32: under the
interpreter (Triton 3.8) a float32 -> bfloat16 cast truncates instead of rounding and a
bfloat16 `tl.dot` returns garbage, so the 16-bit ring paths are checked against the
recurrence only, with bf16 tolerances.
"""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang_domino.sglang.cpu.hybrid import gdn_ops
from sglang_domino.sglang.cpu.hybrid import gdn_replay as ref
from sglang_domino.sglang.cpu.hybrid import gdn_replay_commit as ref_commit

H, HV, K, V = 1, 2, 16, 16
L = 16                       # ring length (power of two, >= 2 * window)
NULL = -1                    # SGLang's padded-row sentinel
SLOTS = torch.tensor([2, 0, 3])      # mamba (checkpoint) slot per request
ROWS = torch.tensor([1, 2, 0])       # req-pool row (ring + cursors) per request
NUM_SLOTS, NUM_ROWS = 4, 3


# ---------------------------------------------------------------------------
# The definition, written here independently of the module under test.
# ---------------------------------------------------------------------------
def recurrence(state, q, k, v, a, b, params):
    """Gated delta rule token by token from `state` [HV, V, K]: per token
    S <- exp(g) S;  S <- S + beta (v - S k) k^T;  o = S q  (q, k L2-normalised, q scaled by
    K^-1/2; g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)).
    q, k [n, H, K], v [n, HV, V], a, b [n, HV] -> (o [n, HV, V], states after each token)."""
    A_log, dt_bias = params
    g = -torch.exp(A_log) * F.softplus(a + dt_bias)
    beta = torch.sigmoid(b)
    group = HV // H
    state = state.clone()
    outs, states = [], []
    for t in range(q.shape[0]):
        o = torch.empty(HV, V)
        for h in range(HV):
            qh = F.normalize(q[t, h // group], dim=0, eps=0.0) * K ** -0.5
            kh = F.normalize(k[t, h // group], dim=0, eps=0.0)
            s = state[h] * torch.exp(g[t, h])
            s = s + beta[t, h] * torch.outer(v[t, h] - s @ kh, kh)
            state[h] = s
            o[h] = s @ qh
        outs.append(o)
        states.append(state.clone())
    return torch.stack(outs), states


def make_params(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(HV, generator=gen).abs().log(), torch.randn(HV, generator=gen)


def make_window(n_req, width, gen, dtype=torch.float32):
    """Packed window of `width` tokens per request: q, k, v, a, b and query_start_loc."""
    T = n_req * width
    tensors = (torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen),
               torch.randn(T, HV, V, generator=gen), torch.randn(T, HV, generator=gen),
               torch.randn(T, HV, generator=gen))
    qsl = torch.arange(0, T + 1, width, dtype=torch.int32)
    return [x.to(dtype) for x in tensors[:3]] + list(tensors[3:]), qsl


# ---------------------------------------------------------------------------
# The two implementations behind one interface.
# ---------------------------------------------------------------------------
def upstream_module(name):
    try:
        import importlib

        return importlib.import_module(f"sglang.kernels.ops.attention.linear.{name}")
    except Exception as exc:  # noqa: BLE001 - any import failure means: no Triton here
        pytest.skip(f"upstream {name} not importable on this machine: {exc!r}")


class Reference:
    spec_decode = staticmethod(ref.gdn_replayssm_spec_decode)
    commit_spec = staticmethod(ref_commit.commit_gdn_replayssm_spec)
    commit_circular = staticmethod(ref_commit.commit_gdn_replayssm_circular)


class Upstream:
    def __init__(self):
        self.mod = upstream_module("gdn_replayssm_spec_decode")

    def spec_decode(self, *args, **kwargs):
        # one K tile of 16: the interpreter, like the GPU, wants >= 16 per tl.dot tile
        return self.mod.gdn_replayssm_spec_decode(*args, nk=1, nk_flush=1, **kwargs)

    def commit_spec(self, *args, **kwargs):
        return self.mod.commit_gdn_replayssm_spec(*args, **kwargs)

    def commit_circular(self, **kwargs):
        return self.mod.commit_gdn_replayssm_circular(**kwargs)


@pytest.fixture(params=["reference", "triton"])
def impl(request):
    return Reference() if request.param == "reference" else Upstream()


# ---------------------------------------------------------------------------
# Protocol 1 (compact circular ring): a pool and one verify/commit step.
# ---------------------------------------------------------------------------
def new_pool(ckpt, ring_dtype=torch.float32, residual=False):
    """The pool's GDN ReplaySSM state for one layer: checkpoint [slots, HV, V, K], rings keyed
    by req-pool row, cursors. `residual`: the low-part rings a 16-bit ring dtype brings."""
    pool = SimpleNamespace(
        temporal=ckpt.clone(),
        d=torch.zeros(NUM_ROWS, HV, L, V, dtype=ring_dtype),
        k=torch.zeros(NUM_ROWS, H, L, K, dtype=ring_dtype),
        g=torch.zeros(NUM_ROWS, HV, L),
        rawv=torch.zeros(NUM_ROWS, HV, L, V, dtype=ring_dtype) if residual else None,
        rawk=torch.zeros(NUM_ROWS, H, L, K, dtype=ring_dtype) if residual else None,
        write_pos=torch.zeros(NUM_ROWS, dtype=torch.int32),
        cache_base=torch.zeros(NUM_ROWS, dtype=torch.int32),
        is_flush=torch.zeros(NUM_ROWS, dtype=torch.int8),
    )
    return pool


def verify(impl, pool, window, qsl, params, width):
    q, k, v, a, b = window
    out = torch.full((q.shape[0], HV, V), float("nan"), dtype=q.dtype)
    impl.spec_decode(q, k, v, a, b, params[0], params[1], pool.temporal, pool.d, pool.k, pool.g, pool.rawv,
                     pool.rawk, None, out, qsl, SLOTS, ROWS, pool.write_pos, pool.cache_base, pool.is_flush,
                     max_cache_len=L, max_spec_len=width, scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
                     null_block_id=NULL, launch_mode="verify")
    return out


def commit(impl, pool, accept_lens, width, fold_every_commit=False, track=None):
    """spec_utils.commit_mamba_states_after_verify's GDN order: cursors, then materialisation."""
    accept_lens = torch.as_tensor(accept_lens, dtype=torch.int32)
    impl.commit_spec(pool.write_pos, pool.cache_base, pool.is_flush, accept_lens, ROWS, L, width,
                     fold_every_commit=fold_every_commit, null_block_id=NULL)
    track_indices, track_steps = (None, None) if track is None else track
    layered = lambda x: None if x is None else x[None]  # noqa: E731 - the all-layers view
    impl.commit_circular(checkpoint_state=pool.temporal[None], d_cache=pool.d[None], k_cache=pool.k[None],
                         g_cache=pool.g[None], d_residual_cache=layered(pool.rawv),
                         k_residual_cache=layered(pool.rawk), state_batch_indices=SLOTS, replay_indices=ROWS,
                         write_pos=pool.write_pos, cache_base=pool.cache_base, is_flush=pool.is_flush,
                         accept_lens=accept_lens, mamba_track_indices=track_indices,
                         mamba_steps_to_track=track_steps, null_block_id=NULL)


def live_states(impl, pool):
    """Each request's live state: its checkpoint folded through its committed records (on a
    copy of the pool, every row forced to materialise)."""
    copy = SimpleNamespace(**{n: (x.clone() if isinstance(x, torch.Tensor) else x) for n, x in vars(pool).items()})
    copy.is_flush.fill_(1)
    impl.commit_circular(checkpoint_state=copy.temporal[None], d_cache=copy.d[None], k_cache=copy.k[None],
                         g_cache=copy.g[None], d_residual_cache=None if copy.rawv is None else copy.rawv[None],
                         k_residual_cache=None if copy.rawk is None else copy.rawk[None],
                         state_batch_indices=SLOTS, replay_indices=ROWS, write_pos=copy.write_pos,
                         cache_base=copy.cache_base, is_flush=copy.is_flush,
                         accept_lens=torch.zeros(len(SLOTS), dtype=torch.int32), null_block_id=NULL)
    return [copy.temporal[int(s)].float() for s in SLOTS]


def expected_step(states, window, params, width):
    """Per request: the recurrence's outputs over the whole window and its states after each token."""
    q, k, v, a, b = (x.float() for x in window)
    results = []
    for i, state in enumerate(states):
        span = slice(i * width, (i + 1) * width)
        results.append(recurrence(state, q[span], k[span], v[span], a[span], b[span], params))
    return results


def initial_checkpoint(gen):
    return torch.randn(NUM_SLOTS, HV, V, K, generator=gen) * 0.5


def run_rounds(impl, pool, states, params, gen, accepts, width, fold_every_commit=False, atol=2e-5):
    """Verify/commit rounds with the given accepted drafts per request (commit = accepted + 1):
    each round's outputs and committed states are held to the recurrence. -> new states."""
    for round_accepts in accepts:
        window, qsl = make_window(len(SLOTS), width, gen)
        out = verify(impl, pool, window, qsl, params, width)
        expected = expected_step(states, window, params, width)
        for i, (o_ref, _) in enumerate(expected):
            torch.testing.assert_close(out[i * width:(i + 1) * width].float(), o_ref, atol=atol, rtol=atol)
        commit(impl, pool, [acc + 1 for acc in round_accepts], width, fold_every_commit)
        states = [expected[i][1][acc] for i, acc in enumerate(round_accepts)]
        for got, want in zip(live_states(impl, pool), states):
            torch.testing.assert_close(got, want, atol=atol, rtol=atol)
    return states


# ---------------------------------------------------------------------------
# (i) the references equal upstream's Triton kernels.
# ---------------------------------------------------------------------------
def random_rings(gen, num_rows, dtype=torch.float32):
    return (torch.randn(num_rows, HV, L, V, generator=gen).to(dtype),
            ref.normalise_rows(torch.randn(num_rows, H, L, K, generator=gen)).to(dtype),
            -torch.rand(num_rows, HV, L, generator=gen) * 0.5)


def clone_all(tensors):
    return [None if x is None else x.clone() for x in tensors]


def assert_same(got, want, atol=1e-5):
    for g_, w_ in zip(got, want):
        if g_ is None:
            assert w_ is None
            continue
        if g_.dtype.is_floating_point:
            torch.testing.assert_close(g_.float(), w_.float(), atol=atol, rtol=atol, equal_nan=True)
        else:
            assert torch.equal(g_, w_)


@pytest.mark.parametrize("launch_mode", ["verify", "both", "flush"])
def test_spec_decode_matches_triton(launch_mode):
    """Varlen windows (3, 2, 4, 1), a padded row, a flush row, histories that wrap the ring:
    outputs, rings and (for the fold launches) the checkpoint equal the Triton kernels'."""
    upstream = Upstream()
    gen = torch.Generator().manual_seed(0)
    widths = [3, 2, 4, 1]
    qsl = torch.tensor([0] + list(itertools.accumulate(widths)), dtype=torch.int32)
    T = qsl[-1].item()
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    a, b = torch.randn(T, HV, generator=gen), torch.randn(T, HV, generator=gen)
    A_log, dt_bias = make_params()
    num_rows = 6
    ckpt = torch.randn(6, HV, V, K, generator=gen) * 0.3
    d, kc, gc = random_rings(gen, num_rows)
    raw = (None, None, None)
    if launch_mode != "verify":   # the exact-raw layout the fold launch replays
        raw = (torch.randn(num_rows, HV, L, V, generator=gen), torch.randn(num_rows, H, L, K, generator=gen),
               torch.rand(num_rows, HV, L, generator=gen))
    slots, rows = torch.tensor([1, NULL, 3, 4]), torch.tensor([0, 2, 3, 5])
    # rows 0 and 3 wrap the ring; row 3's 4-token window runs past its end (lanes 2, 3 are
    # not stored); row 5 is flagged for flushing
    write_pos = torch.tensor([3, 0, 5, 14, 0, 7], dtype=torch.int32)
    cache_base = torch.tensor([14, 0, 3, 15, 0, 9], dtype=torch.int32)
    is_flush = torch.tensor([0, 0, 0, 0, 0, 1], dtype=torch.int8)
    results = []
    for fn in (upstream.spec_decode, ref.gdn_replayssm_spec_decode):
        bufs = clone_all([ckpt, d, kc, gc, *raw])
        cursors = clone_all([write_pos, cache_base, is_flush])
        out = torch.full((T, HV, V), 7.0)   # flush rows keep it under "verify"
        fn(q, k, v, a, b, A_log, dt_bias, *bufs, out, qsl, slots, rows, *cursors, max_cache_len=L, max_spec_len=4,
           null_block_id=NULL, launch_mode=launch_mode)
        results.append([out, *bufs, *cursors])
    assert_same(results[1], results[0])


@pytest.mark.parametrize("fold_every_commit", [False, True])
def test_cursor_advance_matches_triton(fold_every_commit):
    upstream = Upstream()
    gen = torch.Generator().manual_seed(2)
    n = 24
    # every write_pos 0..11 with and without the flush flag, so the new write_pos crosses the
    # early-flush threshold (write_pos + 2 * max_spec_len > L) from both sides
    write_pos = (torch.arange(n) % 12).to(torch.int32)
    cache_base = torch.randint(0, L, (n,), generator=gen, dtype=torch.int32)
    is_flush = (torch.arange(n) >= 12).to(torch.int8)
    rows = torch.cat([torch.randperm(n, generator=gen)[:n - 2], torch.tensor([NULL])])
    accepted = torch.randint(0, 6, (rows.shape[0],), generator=gen, dtype=torch.int32)
    results = []
    for fn in (upstream.commit_spec, ref_commit.commit_gdn_replayssm_spec):
        cursors = clone_all([write_pos, cache_base, is_flush])
        fn(*cursors, accepted, rows, L, 4, fold_every_commit=fold_every_commit, null_block_id=NULL)
        results.append(cursors)
    assert_same(results[1], results[0])


@pytest.mark.parametrize("residual,track", [(False, False), (True, True)])
def test_circular_commit_matches_triton(residual, track):
    """Two layers; flagged rows fold their records (cursors reset), track rows snapshot the
    state after their crossing step, a padded row is left alone."""
    upstream = Upstream()
    gen = torch.Generator().manual_seed(3)
    layers, num_rows = 2, 5
    ckpt = torch.randn(layers, 8, HV, V, K, generator=gen) * 0.3
    d, kc, gc = (torch.stack(x) for x in zip(*(random_rings(gen, num_rows) for _ in range(layers))))
    d_low = torch.randn(layers, num_rows, HV, L, V, generator=gen) * 1e-3 if residual else None
    k_low = torch.randn(layers, num_rows, H, L, K, generator=gen) * 1e-3 if residual else None
    slots, rows = torch.tensor([1, NULL, 3, 4]), torch.tensor([0, 2, 3, 4])
    write_pos = torch.tensor([3, 0, 7, 9, 12], dtype=torch.int32)
    cache_base = torch.tensor([14, 0, 3, 15, 2], dtype=torch.int32)
    is_flush = torch.tensor([1, 1, 0, 1, 1], dtype=torch.int8)
    accept = torch.tensor([2, 1, 3, 4], dtype=torch.int32)
    track_kw = {}
    if track:
        track_kw = dict(mamba_track_indices=torch.tensor([5, 6, 7, NULL]),
                        mamba_steps_to_track=torch.tensor([1, 0, -1, 2]))
    results = []
    for fn in (upstream.commit_circular, ref_commit.commit_gdn_replayssm_circular):
        bufs = clone_all([ckpt, write_pos, cache_base, is_flush])
        fn(checkpoint_state=bufs[0], d_cache=d, k_cache=kc, g_cache=gc, d_residual_cache=d_low,
           k_residual_cache=k_low, state_batch_indices=slots, replay_indices=rows, write_pos=bufs[1],
           cache_base=bufs[2], is_flush=bufs[3], accept_lens=accept, null_block_id=NULL, **track_kw)
        results.append(bufs)
    assert_same(results[1], results[0])
    assert not torch.equal(results[1][0], ckpt)   # something was folded


def interpreted_range(*bounds):
    """`range` for a kernel run by the interpreter, yielding Triton scalars: compiled Triton
    makes a `range` loop's variable a tensor, the interpreter hands out Python ints, and
    fold.py:99 calls `t.to(tl.int64)` on it (AttributeError under the interpreter)."""
    import builtins

    import triton.language as tl

    for t in builtins.range(*(int(x) for x in bounds)):
        yield tl.full((), t, tl.int32)


def test_fold_all_layers_matches_triton(monkeypatch):
    upstream = upstream_module("gdn_replayssm_spec_fold")
    monkeypatch.setitem(upstream.__dict__, "range", interpreted_range)
    gen = torch.Generator().manual_seed(4)
    layers, num_slots, width = 2, 6, 5
    ckpt = torch.randn(layers, num_slots, HV, V, K, generator=gen) * 0.3
    rings = (torch.randn(layers, num_slots, HV, width, V, generator=gen),
             torch.randn(layers, num_slots, H, width, K, generator=gen),
             -torch.rand(layers, num_slots, HV, width, generator=gen),
             torch.rand(layers, num_slots, HV, width, generator=gen))
    slots = torch.tensor([1, NULL, 3, 0])
    accept = torch.tensor([3, 2, 5, 0], dtype=torch.int32)
    track = dict(mamba_track_indices=torch.tensor([4, 5, NULL, 2]), mamba_steps_to_track=torch.tensor([1, 0, 2, 0]))
    results = []
    for fn in (upstream.commit_gdn_replayssm_fold_all_layers, ref_commit.commit_gdn_replayssm_fold_all_layers):
        state = ckpt.clone()
        fn(state, *rings, slots, accept, width, H, null_block_id=NULL, **track)
        results.append([state])
    assert_same(results[1], results[0])


def test_ring_store_matches_triton_recurrent_verify():
    """The recurrent verify with `cache_ring=True` (the fold protocol's verify): same outputs,
    same raw records, nothing written past the ring or for a padded row."""
    upstream = upstream_module("fused_sigmoid_gating_recurrent")
    gen = torch.Generator().manual_seed(5)
    width, ring = 5, 4                              # a window longer than the ring: step 4 dropped
    (q, k, v, a, b), qsl = make_window(3, width, gen)
    A_log, dt_bias = make_params()
    pool = torch.randn(NUM_SLOTS, HV, V, K, generator=gen) * 0.3
    slots = torch.tensor([2, NULL, 1])
    results = []
    for fn in (upstream.fused_sigmoid_gating_delta_rule_update, ref_commit.fused_sigmoid_gating_delta_rule_update):
        rings = [torch.zeros(NUM_SLOTS, HV, ring, V), torch.zeros(NUM_SLOTS, H, ring, K),
                 torch.zeros(NUM_SLOTS, HV, ring), torch.zeros(NUM_SLOTS, HV, ring)]
        state = pool.clone()
        o = fn(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q[None], k=k[None],
               v=v[None], b=b, initial_state_source=state, initial_state_indices=slots, cu_seqlens=qsl,
               use_qk_l2norm_in_kernel=True, disable_state_update=True, cache_ring=True, replayssm_rawv=rings[0],
               replayssm_rawk=rings[1], replayssm_g=rings[2], replayssm_beta=rings[3])
        o = o.clone()
        o[:, width:2 * width] = 0       # the padded row's outputs are unspecified upstream
        results.append([o, state, *rings])
    assert_same(results[1], results[0])
    assert torch.equal(results[1][1], pool)        # disable_state_update: the pool is untouched


# ---------------------------------------------------------------------------
# (ii) verify + commit = the token-by-token recurrence, at every acceptance length.
# ---------------------------------------------------------------------------
DRAFTS = 4                 # W drafted tokens; the window holds W + 1 (the bonus token first)
WIDTH = DRAFTS + 1


@pytest.mark.parametrize("accepted", range(DRAFTS + 1))
def test_commit_equals_recurrence_at_every_acceptance_length(impl, accepted):
    """Two warm-up rounds leave committed history in the ring; in the tested round each request
    accepts `accepted` drafts (shifted per request, so every length meets histories of every
    depth, flushing ones included); the state committed is the recurrence's after
    accepted + 1 tokens, and equals 0.5.23's snapshot path (`gdn_ops` verify buffer)."""
    gen = torch.Generator().manual_seed(10 + accepted)
    params = make_params()
    ckpt = initial_checkpoint(gen)
    pool = new_pool(ckpt)
    states = [ckpt[int(s)].clone() for s in SLOTS]
    states = run_rounds(impl, pool, states, params, gen, [[2, 1, 3], [0, 3, 1]], WIDTH)

    window, qsl = make_window(len(SLOTS), WIDTH, gen)
    accepts = [(accepted + i) % (DRAFTS + 1) for i in range(len(SLOTS))]
    # the snapshot path: one state per verified position, the accepted one scattered at commit
    snap_pool = torch.stack(states)
    snapshots = torch.zeros(len(SLOTS), WIDTH, HV, V, K)
    q, k, v, a, b = window
    gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu(
        params[0], params[1], q[None], k[None], v[None], a, b, snap_pool, torch.arange(len(SLOTS)),
        cu_seqlens=qsl, use_qk_l2norm_in_kernel=True, disable_state_update=True,
        intermediate_states_buffer=snapshots, intermediate_state_indices=torch.arange(len(SLOTS)))
    out = verify(impl, pool, window, qsl, params, WIDTH)
    expected = expected_step(states, window, params, WIDTH)
    commit(impl, pool, [acc + 1 for acc in accepts], WIDTH)
    for i, (got, acc) in enumerate(zip(live_states(impl, pool), accepts)):
        torch.testing.assert_close(out[i * WIDTH:(i + 1) * WIDTH], expected[i][0], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(got, expected[i][1][acc], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(got, snapshots[i, acc], atol=2e-5, rtol=2e-5)
    # the rejected records are dead: the next round still follows the recurrence
    run_rounds(impl, pool, [e[1][acc] for e, acc in zip(expected, accepts)], params, gen, [[1, 4, 0]], WIDTH)


@pytest.mark.parametrize("fold_every_commit", [False, True])
def test_long_run_with_flushes_follows_recurrence(impl, fold_every_commit):
    """Ten rounds of random acceptance: histories fill, get flagged, fold into the checkpoint
    and restart across the ring's end; outputs and states stay on the recurrence."""
    gen = torch.Generator().manual_seed(20)
    params = make_params()
    ckpt = initial_checkpoint(gen)
    pool = new_pool(ckpt)
    accepts = torch.randint(0, DRAFTS + 1, (10, len(SLOTS)), generator=gen).tolist()
    bases_seen = set()
    states = [ckpt[int(s)].clone() for s in SLOTS]
    for round_accepts in accepts:
        states = run_rounds(impl, pool, states, params, gen, [round_accepts], WIDTH, fold_every_commit)
        bases_seen.update(pool.cache_base.tolist())
    assert len(bases_seen) > 1      # the checkpoint was materialised and the ring moved on


def test_track_slot_gets_the_crossing_state(impl):
    """Radix tracking: the track slot receives the state after the tracked window step while
    the live row keeps its history."""
    gen = torch.Generator().manual_seed(30)
    params = make_params()
    ckpt = initial_checkpoint(gen)
    pool = new_pool(torch.cat([ckpt, torch.zeros(3, HV, V, K)]))
    states = run_rounds(impl, pool, [ckpt[int(s)].clone() for s in SLOTS], params, gen, [[1, 2, 0]], WIDTH)
    window, qsl = make_window(len(SLOTS), WIDTH, gen)
    verify(impl, pool, window, qsl, params, WIDTH)
    expected = expected_step(states, window, params, WIDTH)
    accepts, steps = [3, 2, 4], [1, 0, 4]
    commit(impl, pool, [x + 1 for x in accepts], WIDTH,
           track=(torch.tensor([4, 5, 6]), torch.tensor(steps)))
    for i, step in enumerate(steps):
        torch.testing.assert_close(pool.temporal[4 + i], expected[i][1][step], atol=2e-5, rtol=2e-5)
    for got, e, acc in zip(live_states(impl, pool), expected, accepts):
        torch.testing.assert_close(got, e[1][acc], atol=2e-5, rtol=2e-5)


# ---------------------------------------------------------------------------
# (iii) a rejected draft moves only the bonus token.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fold_every_commit", [False, True])
def test_rejected_draft_moves_only_the_bonus_token(impl, fold_every_commit):
    """Accept 0 of W: one record is committed (write_pos + 1, or folded at once under
    fold-every-commit), the live state is the recurrence's after the bonus token alone; the
    checkpoint is untouched unless that one record is folded into it."""
    gen = torch.Generator().manual_seed(40)
    params = make_params()
    ckpt = initial_checkpoint(gen)
    pool = new_pool(ckpt)
    states = run_rounds(impl, pool, [ckpt[int(s)].clone() for s in SLOTS], params, gen, [[1, 0, 2]], WIDTH,
                        fold_every_commit)
    before = SimpleNamespace(temporal=pool.temporal.clone(), write_pos=pool.write_pos.clone(),
                             cache_base=pool.cache_base.clone())
    window, qsl = make_window(len(SLOTS), WIDTH, gen)
    verify(impl, pool, window, qsl, params, WIDTH)
    commit(impl, pool, [1, 1, 1], WIDTH, fold_every_commit)
    bonus_only = [e[1][0] for e in expected_step(states, window, params, WIDTH)]
    for got, want in zip(live_states(impl, pool), bonus_only):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    if fold_every_commit:
        # folded: the checkpoint is the one-step state, the ring starts after that record
        for i, s in enumerate(SLOTS.tolist()):
            torch.testing.assert_close(pool.temporal[s], bonus_only[i], atol=2e-5, rtol=2e-5)
        assert torch.equal(pool.write_pos, torch.zeros_like(pool.write_pos))
        assert torch.equal(pool.cache_base, (before.cache_base + 1) % L)
    else:
        assert torch.equal(pool.temporal, before.temporal)
        assert torch.equal(pool.write_pos[ROWS], before.write_pos[ROWS] + 1)
        assert torch.equal(pool.cache_base, before.cache_base)


# ---------------------------------------------------------------------------
# Protocol 2 (raw ring + fold at commit), the reference only: upstream's commit wrapper
# also calls the CUDA-only conv scatter.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("accepted", range(DRAFTS + 1))
def test_fold_protocol_commit_equals_recurrence(accepted):
    gen = torch.Generator().manual_seed(50 + accepted)
    params = make_params()
    layers, conv_dim, conv_w = 1, 3, 3
    ckpt = initial_checkpoint(gen)
    spec_state = SimpleNamespace(
        temporal=ckpt.clone()[None],
        replayssm_rawv=torch.zeros(layers, NUM_SLOTS, HV, WIDTH, V),
        replayssm_rawk=torch.zeros(layers, NUM_SLOTS, H, WIDTH, K),
        replayssm_g=torch.zeros(layers, NUM_SLOTS, HV, WIDTH),
        replayssm_beta=torch.zeros(layers, NUM_SLOTS, HV, WIDTH),
        conv=[torch.zeros(layers, NUM_SLOTS, conv_dim, conv_w - 1)],
        intermediate_conv_window=[torch.randn(layers, NUM_ROWS, WIDTH, conv_dim, conv_w - 1, generator=gen)],
    )
    window, qsl = make_window(len(SLOTS), WIDTH, gen)
    q, k, v, a, b = window
    out = ref_commit.fused_sigmoid_gating_delta_rule_update(
        A_log=params[0], a=a, dt_bias=params[1], softplus_beta=1.0, softplus_threshold=20.0, q=q[None], k=k[None],
        v=v[None], b=b, initial_state_source=spec_state.temporal[0], initial_state_indices=SLOTS, cu_seqlens=qsl,
        use_qk_l2norm_in_kernel=True, disable_state_update=True, cache_ring=True,
        replayssm_rawv=spec_state.replayssm_rawv[0], replayssm_rawk=spec_state.replayssm_rawk[0],
        replayssm_g=spec_state.replayssm_g[0], replayssm_beta=spec_state.replayssm_beta[0])
    assert torch.equal(spec_state.temporal[0], ckpt)      # verify writes no state
    expected = expected_step([ckpt[int(s)] for s in SLOTS], window, params, WIDTH)
    accepts = [(accepted + i) % (DRAFTS + 1) for i in range(len(SLOTS))]
    ref_commit.commit_gdn_replayssm_fold_after_verify(
        spec_state=spec_state, state_batch_indices=SLOTS, accept_lens=torch.tensor([x + 1 for x in accepts]),
        last_correct_step_indices=torch.tensor(accepts), src_indices_raw=ROWS)
    for i, (s, acc) in enumerate(zip(SLOTS.tolist(), accepts)):
        torch.testing.assert_close(out[0, i * WIDTH:(i + 1) * WIDTH], expected[i][0], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(spec_state.temporal[0, s], expected[i][1][acc], atol=2e-5, rtol=2e-5)
        assert torch.equal(spec_state.conv[0][0, s], spec_state.intermediate_conv_window[0][0, ROWS[i], acc])


# ---------------------------------------------------------------------------
# 16-bit rings (bf16 activations): the reference against the recurrence, bf16 tolerances.
# The Triton interpreter cannot check these (see the module docstring).
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_bf16_rings_stay_near_the_recurrence(state_dtype):
    """bf16 activations and rings with their low parts (the layout 0.5.23 allocates for a
    bf16 model), fp32 or bf16 checkpoint, fold-every-commit for the bf16 checkpoint as
    spec_utils sets it: outputs and states within bf16 error of the fp32 recurrence."""
    gen = torch.Generator().manual_seed(60)
    params = make_params()
    ckpt = initial_checkpoint(gen).to(state_dtype)
    pool = new_pool(ckpt, ring_dtype=torch.bfloat16, residual=True)
    states = [ckpt[int(s)].float() for s in SLOTS]
    fold_every_commit = state_dtype != torch.float32
    for round_accepts in torch.randint(0, DRAFTS + 1, (5, len(SLOTS)), generator=gen).tolist():
        window, qsl = make_window(len(SLOTS), WIDTH, gen, dtype=torch.bfloat16)
        out = verify(Reference(), pool, window, qsl, params, WIDTH)
        expected = expected_step(states, window, params, WIDTH)
        for i, (o_ref, _) in enumerate(expected):
            torch.testing.assert_close(out[i * WIDTH:(i + 1) * WIDTH].float(), o_ref, atol=3e-2, rtol=3e-2)
        commit(Reference(), pool, [x + 1 for x in round_accepts], WIDTH, fold_every_commit)
        states = [e[1][acc] for e, acc in zip(expected, round_accepts)]
        for got, want in zip(live_states(Reference(), pool), states):
            torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)
        states = live_states(Reference(), pool)   # carry the replayed state, as serving does


def test_interpreter_cannot_check_bf16_paths():
    """Documents why the 16-bit ring paths are not held to Triton here: under the Triton
    interpreter a float32 -> bfloat16 cast truncates (torch rounds to nearest even) and a
    bfloat16 `tl.dot` does not compute the product. If this starts failing, the interpreter
    was fixed and the bf16 variants can join the Triton comparisons."""
    import triton
    import triton.language as tl

    @triton.jit
    def cast_and_dot(x_ptr, cast_ptr, dot_ptr):
        o = tl.arange(0, 16)
        tile = tl.load(x_ptr + o[:, None] * 16 + o[None, :])
        tl.store(cast_ptr + o[:, None] * 16 + o[None, :], tile.to(tl.bfloat16))
        low = tile.to(tl.bfloat16)
        tl.store(dot_ptr + o[:, None] * 16 + o[None, :], tl.dot(low, low))

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("not running under the Triton interpreter")
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(70))
    cast, dot = torch.zeros(16, 16, dtype=torch.bfloat16), torch.zeros(16, 16)
    cast_and_dot[(1,)](x, cast, dot)
    low = x.to(torch.bfloat16)
    cast_exact = torch.equal(cast, low)
    dot_exact = torch.allclose(dot, low.float() @ low.float(), atol=1e-3, rtol=1e-3)
    assert not (cast_exact and dot_exact)
