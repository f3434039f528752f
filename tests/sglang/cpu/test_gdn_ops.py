"""The CPU gated delta-net stand-ins (`sglang_domino/sglang/gdn_ops.py`) against
Transformers' reference implementations (qwen3_5 modeling), and the verify/commit
contract the DFLASH worker relies on: the state a verify snapshots at position t, and
commits when t is the last accepted position, is the state of decoding t + 1 tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_domino.sglang.cpu.hybrid import gdn_ops as ops

HK, HV, K, V, CONV_K = 2, 4, 8, 6, 4
DIM = 2 * HK * K + HV * V


def _hf():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    return hf


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, HK, K, generator=g)
    k = torch.randn(1, n, HK, K, generator=g)
    v = torch.randn(1, n, HV, V, generator=g)
    a = torch.randn(n, HV, generator=g)
    b = torch.randn(n, HV, generator=g)
    return q, k, v, a, b


def _params(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(HV, generator=g).abs().log(), torch.randn(HV, generator=g)  # A_log, dt_bias


def _hf_rule(q, k, v, a, b, A_log, dt_bias, state_kv=None, chunk=False):
    """Transformers' rule ([B, T, H, D] inputs, state [B, H, K, V])."""
    hf = _hf()
    g, beta = ops.gdn_gates(A_log, a, b, dt_bias)
    r = HV // HK
    fn = hf.torch_chunk_gated_delta_rule if chunk else hf.torch_recurrent_gated_delta_rule
    o, state = fn(q.repeat_interleave(r, 2), k.repeat_interleave(r, 2), v, g[None], beta[None],
                  initial_state=state_kv, output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o, state


def test_prefill_and_decode_match_transformers_recurrence():
    A_log, dt_bias = _params()
    q, k, v, a, b = _inputs(11)
    pool = torch.zeros(3, HV, V, K)
    g, beta = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    # two sequences packed: 7 tokens into slot 2, 4 tokens into slot 0
    o, _, h = ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.tensor([0, 7, 11]),
                                             use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor([2, 0]))
    assert h is None
    for (s, e), slot in (((0, 7), 2), ((7, 11), 0)):
        ref_o, ref_state = _hf_rule(q[:, s:e], k[:, s:e], v[:, s:e], a[s:e], b[s:e], A_log, dt_bias)
        torch.testing.assert_close(o[:, s:e], ref_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[slot], ref_state[0].transpose(-1, -2), rtol=1e-5, atol=1e-5)
    assert pool[1].abs().sum() == 0
    # one decode token for both sequences continues from their states
    q2, k2, v2, a2, b2 = _inputs(2, seed=5)
    before = pool.clone()
    o2 = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log, dt_bias, q2, k2, v2, a2, b2, pool, torch.tensor([2, 0]), cu_seqlens=torch.arange(3),
        use_qk_l2norm_in_kernel=True)
    for i, slot in enumerate((2, 0)):
        ref_o, ref_state = _hf_rule(q2[:, i:i + 1], k2[:, i:i + 1], v2[:, i:i + 1], a2[i:i + 1], b2[i:i + 1], A_log,
                                    dt_bias, state_kv=before[slot].transpose(-1, -2)[None])
        torch.testing.assert_close(o2[:, i:i + 1], ref_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[slot], ref_state[0].transpose(-1, -2), rtol=1e-5, atol=1e-5)


def test_prefill_matches_transformers_chunked_rule():
    A_log, dt_bias = _params()
    q, k, v, a, b = _inputs(70, seed=3)  # longer than one 64-token chunk
    pool = torch.zeros(1, HV, V, K)
    g, beta = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    o, _, _ = ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.tensor([0, 70]),
                                             use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor([0]))
    ref_o, ref_state = _hf_rule(q, k, v, a, b, A_log, dt_bias, chunk=True)
    torch.testing.assert_close(o, ref_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[0], ref_state[0].transpose(-1, -2), rtol=1e-4, atol=1e-4)


def test_conv_prefill_and_decode_match_transformers():
    hf = _hf()
    gen = torch.Generator().manual_seed(2)
    w, bias = torch.randn(DIM, CONV_K, generator=gen), torch.randn(DIM, generator=gen)
    x = torch.randn(DIM, 9, generator=gen)
    states = torch.full((3, DIM, CONV_K - 1), 7.0)
    out = ops.causal_conv1d_fn_cpu(x, w, bias, activation="silu", conv_states=states,
                                   has_initial_state=torch.tensor([False, False]), cache_indices=torch.tensor([1, 2]),
                                   query_start_loc=torch.tensor([0, 2, 9]))
    for (s, e), slot in (((0, 2), 1), ((2, 9), 2)):
        ref = hf.causal_conv1d_fn(x[None, :, s:e], w, bias, activation="silu")[0]
        torch.testing.assert_close(out[:, s:e], ref)
        padded = torch.cat([torch.zeros(DIM, CONV_K), x[:, s:e]], 1)
        torch.testing.assert_close(states[slot], padded[:, -(CONV_K - 1):])
    assert (states[0] == 7.0).all()
    # a second chunk of slot 2 continues from its state, then one decode token
    x2 = torch.randn(DIM, 3, generator=gen)
    hf_state = torch.cat([torch.zeros(DIM, CONV_K), x[:, 2:9]], 1)[None, :, -CONV_K:].clone()
    out2 = ops.causal_conv1d_fn_cpu(x2, w, bias, activation="silu", conv_states=states,
                                    has_initial_state=torch.tensor([True]), cache_indices=torch.tensor([2]),
                                    query_start_loc=torch.tensor([0, 3]))
    ref2 = hf.causal_conv1d_update(x2[None], hf_state, w, bias, activation="silu")[0]
    torch.testing.assert_close(out2, ref2)
    x3 = torch.randn(1, DIM, generator=gen)
    out3 = ops.causal_conv1d_update_cpu(x3, states, w, bias, "silu", conv_state_indices=torch.tensor([2]))
    ref3 = hf.causal_conv1d_update(x3[:, :, None], hf_state, w, bias, activation="silu")[:, :, 0]
    torch.testing.assert_close(out3, ref3)
    torch.testing.assert_close(states[2], hf_state[0, :, 1:])


def _decode_one_by_one(pool, conv, slot, q, k, v, a, b, x, A_log, dt_bias, w):
    """Reference: the verify block decoded token by token; states after each token."""
    ssm_steps, conv_steps, outs, convs = [], [], [], []
    for t in range(q.shape[1]):
        convs.append(ops.causal_conv1d_update_cpu(x[:, :, t], conv, w, None, "silu",
                                                  conv_state_indices=torch.tensor([slot])))
        outs.append(ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], a[t:t + 1], b[t:t + 1], pool,
            torch.tensor([slot]), cu_seqlens=torch.tensor([0, 1]), use_qk_l2norm_in_kernel=True))
        ssm_steps.append(pool[slot].clone())
        conv_steps.append(conv[slot].clone())
    return ssm_steps, conv_steps, torch.cat(outs, 1), torch.stack(convs, -1)


# float32 inputs (a float32 server) with caches in float32, and with 0.5.23's default
# bfloat16 conv state (SGLANG_MAMBA_CONV_DTYPE) and a bfloat16 ssm state: a verify must
# round its running states where token-by-token decoding stores them, or the committed
# state and the verify's outputs drift from the plain server's.
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["fp32-caches", "bf16-caches"])
@pytest.mark.parametrize("accepted", [0, 3, 7])
def test_verify_snapshots_and_commit_are_the_accepted_prefix(accepted, cache_dtype):
    D = 8
    A_log, dt_bias = _params()
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(DIM, CONV_K, generator=gen)
    pool = torch.randn(4, HV, V, K, generator=gen).to(cache_dtype)
    conv = torch.randn(4, DIM, CONV_K - 1, generator=gen).to(cache_dtype)
    slots, rows = torch.tensor([3, 1]), torch.tensor([0, 1])
    q, k, v, a, b = _inputs(2 * D, seed=6)
    x = torch.randn(2, DIM, D, generator=gen)
    buf_ssm = torch.zeros(1, 3, D, HV, V, K, dtype=cache_dtype)
    buf_conv = torch.zeros(1, 3, D, DIM, CONV_K - 1, dtype=cache_dtype)
    live_pool, live_conv = pool.clone(), conv.clone()

    conv_out = ops.causal_conv1d_update_cpu(x, conv, w, None, "silu", conv_state_indices=slots,
                                            intermediate_conv_window=buf_conv[0], intermediate_state_indices=rows)
    out = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log, dt_bias, q, k, v, a, b, pool, slots, cu_seqlens=torch.arange(0, 2 * D + 1, D),
        use_qk_l2norm_in_kernel=True, disable_state_update=True, intermediate_states_buffer=buf_ssm[0],
        intermediate_state_indices=rows, cache_steps=D)
    assert torch.equal(pool, live_pool) and torch.equal(conv, live_conv)  # verify leaves the live state

    steps = torch.tensor([accepted, D - 1 - accepted])
    refs = []
    for i in range(2):
        s = slice(i * D, (i + 1) * D)
        ref = _decode_one_by_one(live_pool.clone(), live_conv.clone(), int(slots[i]), q[:, s], k[:, s], v[:, s], a[s],
                                 b[s], x[i:i + 1], A_log, dt_bias, w)
        refs.append(ref)
        torch.testing.assert_close(out[:, s], ref[2], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(conv_out[i], ref[3][0], rtol=1e-6, atol=1e-6)
        for t in range(D):
            torch.testing.assert_close(buf_ssm[0, i, t], ref[0][t], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(buf_conv[0, i, t], ref[1][t], rtol=1e-6, atol=1e-6)

    caches = SimpleNamespace(temporal=pool[None], intermediate_ssm=buf_ssm, conv=[conv[None]],
                             intermediate_conv_window=[buf_conv])
    ops.scatter_mamba_states_after_mtp_verify(caches, slots, steps, None, None)
    for i in range(2):
        slot, step = int(slots[i]), int(steps[i])
        torch.testing.assert_close(pool[slot], refs[i][0][step], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(conv[slot], refs[i][1][step], rtol=1e-6, atol=1e-6)
    untouched = [s for s in range(4) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], live_pool[untouched]) and torch.equal(conv[untouched], live_conv[untouched])


def test_commit_skips_invalid_steps_and_fills_track_slots():
    pool = torch.zeros(1, 4, 2)
    buf = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(1, 2, 3, 2)
    caches = SimpleNamespace(temporal=pool, intermediate_ssm=buf, conv=[], intermediate_conv_window=[])
    ops.scatter_mamba_states_after_mtp_verify(caches, torch.tensor([0, 2]), torch.tensor([-1, 2]),
                                              torch.tensor([3, 1]), torch.tensor([1, -1]))
    assert pool[0, 0].tolist() == [0, 0]           # step -1: nothing committed
    assert pool[0, 2].tolist() == buf[0, 1, 2].tolist()
    assert pool[0, 3].tolist() == buf[0, 0, 1].tolist()  # the track slot of request 0
    assert pool[0, 1].tolist() == [0, 0]


def test_tree_verify_and_kda_are_refused():
    A_log, dt_bias = _params()
    q, k, v, a, b = _inputs(2)
    with pytest.raises(NotImplementedError, match="retrieve_parent_token"):
        ops.fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, torch.zeros(1, HV, V, K),
                                                       torch.tensor([0]), retrieve_parent_token=torch.zeros(2))
    with pytest.raises(NotImplementedError, match="retrieve_next_token"):
        ops.causal_conv1d_update_cpu(torch.zeros(1, DIM, 2), torch.zeros(1, DIM, 3), torch.zeros(DIM, CONV_K),
                                     retrieve_next_token=torch.zeros(2))


def test_torch_ops_take_upstreams_keyword_calls():
    """0.5.23 calls the registered ops with keywords (`gdn_triton.py:152`, `:232`)."""
    from sglang_domino.sglang.cpu import kernel_standin

    kernel_standin.register_torch_ops()
    A_log, dt_bias = _params()
    q, k, v, a, b = _inputs(3)
    pool = torch.randn(2, HV, V, K)
    expect_pool = pool.clone()
    expect = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log, dt_bias, q, k, v, a, b, expect_pool, torch.tensor([1]), cu_seqlens=torch.tensor([0, 3]),
        use_qk_l2norm_in_kernel=True)
    got = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=torch.tensor([1]), cu_seqlens=torch.tensor([0, 3]), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(pool, expect_pool)
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    assert g.shape == beta.shape == (1, 3, HV) and g.dtype == torch.float32


@pytest.fixture
def compiled_rule():
    """The delta rule compiled for one-token decode and an 8-token verify, as a server with
    `--enable-torch-compile` compiles it (`compile_rule`); the eager loop again afterwards."""
    ops.compile_rule({1, 8}, HV, V, K, torch.float32)
    yield
    ops._Compiled.rule, ops._Compiled.lengths = None, frozenset()


def _rule_graphs() -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(ops._rule_graph.__code__))


def test_the_compiled_rule_gives_the_eager_loops_outputs_states_and_snapshots(compiled_rule):
    """Under `--enable-torch-compile` the verify (8 tokens) and decode (1) run the graphs
    compiled at start-up, called as the compiled target calls them (grad-free, below
    autograd): the eager loop's outputs, verify snapshots and written-back state; another
    length (a prefill) runs the eager loop; no graph is compiled."""
    A_log, dt_bias = _params()
    gen = torch.Generator().manual_seed(5)
    pool = torch.randn(4, HV, V, K, generator=gen)
    slots, rows = torch.tensor([3, 1]), torch.tensor([0, 1])
    q, k, v, a, b = _inputs(16, seed=7)

    def serve():
        live, buf = pool.clone(), torch.zeros(2, 8, HV, V, K)
        verify = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q, k, v, a, b, live, slots, cu_seqlens=torch.tensor([0, 8, 16]),
            use_qk_l2norm_in_kernel=True, disable_state_update=True, intermediate_states_buffer=buf,
            intermediate_state_indices=rows, cache_steps=8)
        decode = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q[:, :2], k[:, :2], v[:, :2], a[:2], b[:2], live, slots,
            cu_seqlens=torch.tensor([0, 1, 2]), use_qk_l2norm_in_kernel=True)
        prefill = ops.chunk_gated_delta_rule_cpu(q[:, :5], k[:, :5], v[:, :5], -a[None, :5].abs(),
                                                 b[None, :5].sigmoid(),
                                                 initial_state=live, initial_state_indices=slots[:1],
                                                 cu_seqlens=torch.tensor([0, 5]), use_qk_l2norm_in_kernel=True)[0]
        return verify, buf, decode, prefill, live

    with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
        graphs = _rule_graphs()
        compiled = serve()
        assert _rule_graphs() == graphs
        rule, ops._Compiled.rule = ops._Compiled.rule, None
        try:
            eager = serve()
        finally:
            ops._Compiled.rule = rule
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
