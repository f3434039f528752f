"""The batched torch_native attention (`cpu/attention.py`) against 0.5.23's own per-request
loops (`TorchNativeAttnBackend._run_sdpa_forward_decode` / `_run_sdpa_forward_extend`),
called unbound on the same caches: decode, a verify block (causal), the draft's block
(non-causal), sliding windows, GQA, unequal lengths; batches it does not batch go to
upstream. Each equality runs twice: through `attend`, and through the C++ paged-attention
kernel the compiled step serves it with (`kernels/cpu_paged_attention`), which is also
held equal to `attend` directly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402

from sglang_domino.kernels import cpu_paged_attention  # noqa: E402
from sglang_domino.sglang.seam import hooks  # noqa: E402
from sglang_domino.sglang.cpu import attention  # noqa: E402

UPSTREAM_DECODE = TorchNativeAttnBackend._run_sdpa_forward_decode
UPSTREAM_EXTEND = TorchNativeAttnBackend._run_sdpa_forward_extend
HEADS, KV_HEADS, DIM, SLOTS = 4, 2, 8, 200


def _cache(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(SLOTS, KV_HEADS, DIM, generator=g).to(dtype)
    v = torch.randn(SLOTS, KV_HEADS, DIM, generator=g).to(dtype)
    # rows of 40 slots, shuffled; row 3 unused; stale slot ids past each request's length
    req_to_token = torch.randperm(SLOTS, generator=g)[:160].view(4, 40).to(torch.int32)
    return g, k, v, req_to_token


@pytest.fixture(scope="session")
def kernel_op():
    """The kernel, built once per machine into the compile cache the servers use."""
    import os

    from sglang_domino.sglang.cpu.compiled import switches

    return cpu_paged_attention.build(os.path.join(switches.cache_dir(), "kernels"))


@pytest.fixture(params=["attend", "kernel"])
def path(request, kernel_op):
    """The batched attention through `attend`, or through the kernel (as under the compiled step)."""
    attention.use_kernel(kernel_op if request.param == "kernel" else None)
    yield request.param
    attention.use_kernel(None)


def _unbound(fn):
    # upstream's loops read nothing from `self` but the sliding-window mask helper
    return lambda *args, **kwargs: fn(TorchNativeAttnBackend.__new__(TorchNativeAttnBackend), *args, **kwargs)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("gqa", [True, False])
def test_decode_batch_equals_upstreams_loop(window, gqa, path):
    g, k, v, req_to_token = _cache()
    heads = HEADS if gqa else KV_HEADS
    seq_lens = torch.tensor([7, 30, 1])
    pools = torch.tensor([2, 0, 1])
    q = torch.randn(3, heads, DIM, generator=g)
    want = _unbound(UPSTREAM_DECODE)(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, None,
                                     scaling=0.3, enable_gqa=gqa, sliding_window_size=window)
    got = attention.around_sdpa_forward_decode(UPSTREAM_DECODE, None, q, torch.empty_like(q), k, v, req_to_token,
                                               pools, seq_lens, None, scaling=0.3, enable_gqa=gqa,
                                               sliding_window_size=window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 4)])
def test_a_block_of_w_rows_per_request_equals_upstreams_loop(causal, window, path):
    """A target verify (causal) or the draft's block (non-causal) of W = 5 rows after
    prefixes of different lengths."""
    g, k, v, req_to_token = _cache(1)
    width = 5
    prefix = torch.tensor([0, 12, 30, 3])
    pools = torch.tensor([1, 3, 0, 2])
    q = torch.randn(4 * width, HEADS, DIM, generator=g)
    args = (k, v, req_to_token, pools, prefix + width, prefix, torch.full_like(prefix, width), None)
    kwargs = dict(scaling=None, enable_gqa=True, causal=causal, sliding_window_size=window)
    want = _unbound(UPSTREAM_EXTEND)(q, torch.empty_like(q), *args, **kwargs)
    got = attention.around_sdpa_forward_extend(UPSTREAM_EXTEND, None, q, torch.empty_like(q), *args, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 4)])
@pytest.mark.parametrize("pools", [[2], [1, 3, 0]])
def test_one_row_per_request_goes_to_the_decode_path_and_equals_upstreams_extend_loop(causal, window, pools,
                                                                                       monkeypatch, path):
    """An adaptive width-1 verify: one row per request is run as a decode row (upstream's
    decode loop for one request), with upstream's extend loop's result."""
    g, k, v, req_to_token = _cache(4)
    pools = torch.tensor(pools)
    prefix = torch.tensor([9, 30, 0])[: len(pools)]
    q = torch.randn(len(pools), HEADS, DIM, generator=g)
    args = (k, v, req_to_token, pools, prefix + 1, prefix, torch.ones_like(prefix), None)
    kwargs = dict(scaling=None, enable_gqa=True, causal=causal, sliding_window_size=window)
    want = _unbound(UPSTREAM_EXTEND)(q, torch.empty_like(q), *args, **kwargs)
    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    decoded = []
    monkeypatch.setattr(TorchNativeAttnBackend, "_run_sdpa_forward_decode",
                        lambda self, *a, **kw: decoded.append(len(a[5])) or UPSTREAM_DECODE(self, *a, **kw))
    got = attention.around_sdpa_forward_extend(UPSTREAM_EXTEND, backend, q, torch.empty_like(q), *args, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert decoded == [len(pools)]


def test_unequal_prefills_and_cross_attention_go_to_upstream():
    g, k, v, req_to_token = _cache(2)
    calls = []

    def upstream(*args, **kwargs):
        calls.append(args)
        return "upstream"

    q = torch.randn(7, HEADS, DIM, generator=g)
    unequal = attention.around_sdpa_forward_extend(
        upstream, None, q, torch.empty_like(q), k, v, req_to_token, torch.tensor([0, 1]), torch.tensor([3, 4]),
        torch.tensor([0, 0]), torch.tensor([3, 4]), None)
    cross = attention.around_sdpa_forward_decode(
        upstream, None, q[:2], torch.empty_like(q[:2]), k, v, req_to_token, torch.tensor([0, 1]),
        torch.tensor([3, 4]), torch.tensor([2, 2]), is_cross_attn=True)
    assert unequal == cross == "upstream" and len(calls) == 2


def test_bf16_caches_are_read_in_the_query_dtype_as_upstream_does():
    g, k, v, req_to_token = _cache(3, dtype=torch.bfloat16)
    seq_lens, pools = torch.tensor([9, 4]), torch.tensor([0, 1])
    q = torch.randn(2, HEADS, DIM, generator=g)
    want = _unbound(UPSTREAM_DECODE)(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, None,
                                     enable_gqa=True)
    got = attention.attend(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, 1, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_mode_is_read_from_the_environment_and_checked(monkeypatch):
    monkeypatch.delenv("SGLANG_DOMINO_DEBUG", raising=False)
    assert attention.mode() == "batched"
    monkeypatch.setenv("SGLANG_DOMINO_DEBUG", "upstream-cpu-attention")
    assert attention.mode() == "upstream" and hooks.install_group(hooks.CPU_ATTENTION) is False
    monkeypatch.setenv("SGLANG_DOMINO_DEBUG", "upstream-cpu-attn")
    with pytest.raises(ValueError, match="SGLANG_DOMINO_DEBUG='upstream-cpu-attn': upstream-cpu-attn unknown"):
        attention.mode()


def test_a_prefill_of_equal_prompts_equals_upstreams_loop(path):
    """No cached prefix, every request the same length: SDPA's own causal kernel."""
    g, k, v, req_to_token = _cache(4)
    length, pools = 9, torch.tensor([0, 2])
    lens = torch.full((2,), length)
    q = torch.randn(2 * length, HEADS, DIM, generator=g)
    args = (k, v, req_to_token, pools, lens, torch.zeros_like(lens), lens, None)
    want = _unbound(UPSTREAM_EXTEND)(q, torch.empty_like(q), *args, enable_gqa=True, causal=True)
    got = attention.around_sdpa_forward_extend(UPSTREAM_EXTEND, None, q, torch.empty_like(q), *args,
                                               enable_gqa=True, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pools", [[2], [2, 0, 1]], ids=["one request", "three requests"])
def test_one_requests_decode_row_goes_to_the_kernel_where_the_process_has_it(path, pools, monkeypatch):
    """Without the kernel one request's decode row is upstream's loop; with it, the kernel's
    (equal to upstream's either way, above)."""
    g, k, v, req_to_token = _cache(5)
    seq_lens = torch.tensor([11, 30, 2])[: len(pools)]
    q = torch.randn(len(pools), HEADS, DIM, generator=g)
    upstream, kernel = [], []
    monkeypatch.setattr(attention._Kernel, "op", attention._Kernel.op and
                        (lambda *a: kernel.append(1) or cpu_paged_attention.torch.ops.sglang_domino_cpu
                         .paged_attention.default(*a)))
    got = attention.around_sdpa_forward_decode(lambda *a, **kw: upstream.append(1) or UPSTREAM_DECODE(*a, **kw),
                                               TorchNativeAttnBackend.__new__(TorchNativeAttnBackend), q,
                                               torch.empty_like(q), k, v, req_to_token, torch.tensor(pools),
                                               seq_lens, None, enable_gqa=True)
    want = _unbound(UPSTREAM_DECODE)(q, torch.empty_like(q), k, v, req_to_token, torch.tensor(pools), seq_lens, None,
                                     enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if path == "kernel":
        assert kernel == [1] and upstream == []
    else:
        assert kernel == [] and upstream == ([1] if len(pools) == 1 else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 64), (3, 3, 12), (4, 1, 20)])
@pytest.mark.parametrize("q_len,causal,window", [(1, False, None), (6, True, None), (6, False, None), (6, True, 5),
                                                 (1, True, 3)])
def test_the_kernel_equals_attend(kernel_op, dtype, heads, kv_heads, dim, q_len, causal, window):
    """The kernel against its reference on unequal lengths, grouped heads, head dims that are
    not a multiple of its 8 lanes, bfloat16, a query and output with padded row strides (as
    upstream's views hand them over)."""
    g = torch.Generator().manual_seed(heads * 100 + dim + q_len)
    slots = 300
    k = torch.randn(slots, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(slots, kv_heads, dim, generator=g).to(dtype)
    req_to_token = torch.randperm(slots, generator=g)[:240].view(4, 60).to(torch.int32)
    pools, lens = torch.tensor([3, 0, 2]), torch.tensor([q_len, 41, 60])
    padded = torch.randn(3 * q_len, heads + 1, dim, generator=g).to(dtype)
    q = padded[:, :heads]                                      # row stride (heads + 1) * dim
    out = torch.zeros(3 * q_len, heads + 2, dim, dtype=dtype)[:, 1:heads + 1]
    kwargs = dict(scaling=0.2, causal=causal, sliding_window_size=window)
    want = attention.attend(q, torch.empty(3 * q_len, heads, dim, dtype=dtype), k, v, req_to_token, pools, lens, q_len,
                            enable_gqa=heads != kv_heads, **kwargs)
    assert cpu_paged_attention.suits(q, out, k, v, req_to_token)
    got = cpu_paged_attention.paged_attention(kernel_op, q, out, k, v, req_to_token, pools, lens, q_len, **kwargs)
    tol = dict(rtol=1e-5, atol=2e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, want, **tol)


def test_a_cache_in_another_dtype_than_the_query_stays_on_attend(kernel_op):
    """The kernel reads the cache in the query's dtype only; upstream casts a differing cache
    to the query's, which `attend` does."""
    g, k, v, req_to_token = _cache(3, dtype=torch.bfloat16)
    q = torch.randn(2, HEADS, DIM, generator=g)
    assert not cpu_paged_attention.suits(q, torch.empty_like(q), k, v, req_to_token)
    attention.use_kernel(lambda *a: pytest.fail("the kernel was called"))
    try:
        got = attention.attend_paged(q, torch.empty_like(q), k, v, req_to_token, torch.tensor([0, 1]),
                                     torch.tensor([9, 4]), 1, enable_gqa=True)
    finally:
        attention.use_kernel(None)
    want = attention.attend(q, torch.empty_like(q), k, v, req_to_token, torch.tensor([0, 1]), torch.tensor([9, 4]), 1,
                            enable_gqa=True)
    torch.testing.assert_close(got, want)


def _radix(attn_type, window=None):
    from sglang.srt.layers.radix_attention import AttentionType, RadixAttention

    return RadixAttention(num_heads=HEADS, head_dim=DIM, scaling=0.3, num_kv_heads=KV_HEADS, layer_id=1,
                          sliding_window_size=window, attn_type=getattr(AttentionType, attn_type))


def _served(seed):
    """A torch_native backend over a real MHA pool (its cache filled at random) and a
    token table of two requests."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    g = torch.Generator().manual_seed(seed)
    pool = MHATokenToKVPool(size=SLOTS, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=DIM,
                            layer_num=2, device="cpu", enable_memory_saver=False)
    for buffers in (pool.k_buffer, pool.v_buffer):
        for b in buffers:
            b.copy_(torch.randn(b.shape, generator=g))
    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    backend.token_to_kv_pool, backend.swa_out_cache_loc = pool, None
    table = torch.randperm(SLOTS - 1, generator=g)[:160].add(1).view(4, 40).to(torch.int32)
    backend.req_to_token_pool = type("ReqToToken", (), {"req_to_token": table})()
    return g, backend


@pytest.mark.parametrize("mode,width,attn_type,window", [
    ("DECODE", 1, "DECODER", None), ("DECODE", 1, "DECODER", 3), ("TARGET_VERIFY", 4, "DECODER", None),
    ("TARGET_VERIFY", 4, "DECODER", 3), ("EXTEND", 4, "ENCODER_ONLY", None), ("TARGET_VERIFY", 1, "DECODER", None),
    ("DFLASH_VERIFY", 4, "DECODER", None), ("DFLASH_VERIFY", 4, "ENCODER_ONLY", None)])
def test_a_planned_forward_writes_and_attends_as_upstreams_backend(kernel_op, mode, width, attn_type, window,
                                                                   monkeypatch):
    """The compiled step's attention without upstream's per-layer dispatch (`attention.Plan`)
    against `RadixAttention.forward` through 0.5.23's own torch_native backend (its loops,
    unhooked): the same KV cache afterwards, the same output, for a decode step, a verify
    (causal, with and without a window), the draft's non-causal block, a width-1 verify,
    and DFLASH's verify and draft block as they arrive (TARGET_VERIFY without extend
    lengths, `seq_lens` the prefix: the CPU port's `dflash.around_torch_native_forward_extend`
    upstream)."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from sglang_domino.sglang.cpu import dflash

    seq_lens, pools = torch.tensor([9 + width, 30 + width]), torch.tensor([2, 0])
    dflash_batch = mode == "DFLASH_VERIFY"
    if dflash_batch:
        original = TorchNativeAttnBackend.forward_extend
        monkeypatch.setattr(TorchNativeAttnBackend, "forward_extend", lambda self, *a, **kw:
                            dflash.around_torch_native_forward_extend(original, self, *a, **kw))
    results = []
    for planned in (False, True):
        g, backend = _served(7)
        table = backend.req_to_token_pool.req_to_token
        loc = torch.cat([table[p, int(n) - width:int(n)] for p, n in zip(pools, seq_lens)]).to(torch.int64)
        batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY if dflash_batch else getattr(ForwardMode, mode),
                                req_pool_indices=pools, seq_lens=seq_lens - width if dflash_batch else seq_lens,
                                extend_seq_lens=None if dflash_batch else torch.full((2,), width),
                                extend_prefix_lens=None if dflash_batch else seq_lens - width, batch_size=2,
                                out_cache_loc=loc, encoder_lens=None, global_num_token_non_padded_cpu=None,
                                moe_num_token_non_padded=None)
        q = torch.randn(2 * width, HEADS * DIM, generator=g)
        k, v = torch.randn(2 * width, KV_HEADS * DIM, generator=g), torch.randn(2 * width, KV_HEADS * DIM, generator=g)
        module = _radix(attn_type, window)
        attention.use_kernel(kernel_op if planned else None)
        try:
            with forward_context(ForwardContext(attn_backend=backend)):
                step = attention.plan(batch, q)
                assert (step is not None) == planned
                out = step(module, q, k, v) if planned else module(q, k, v, batch)
        finally:
            attention.use_kernel(None)
        results.append((out.reshape(2 * width, -1), backend.token_to_kv_pool.k_buffer[1].clone(),
                        backend.token_to_kv_pool.v_buffer[1].clone()))
    (want, want_k, want_v), (got, got_k, got_v) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_a_forward_the_plan_does_not_cover_keeps_upstreams_path(kernel_op):
    """No kernel, no forward context, another backend, unequal extends, padded rows: no plan."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    _, backend = _served(8)
    q = torch.zeros(6, HEADS * DIM)
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, req_pool_indices=torch.tensor([0, 1]),
                            seq_lens=torch.tensor([5, 9]), extend_seq_lens=torch.tensor([3, 3]),
                            out_cache_loc=torch.arange(6), encoder_lens=None, global_num_token_non_padded_cpu=None)
    assert attention.plan(batch, q) is None                              # no kernel in this process
    attention.use_kernel(kernel_op)
    try:
        assert attention.plan(batch, q) is None                          # no forward in progress
        with forward_context(ForwardContext(attn_backend=backend)):
            assert attention.plan(batch, q) is not None
            assert attention.plan(SimpleNamespace(**{**vars(batch), "extend_seq_lens": torch.tensor([2, 4])}),
                                  q) is None
            assert attention.plan(SimpleNamespace(**{**vars(batch), "global_num_token_non_padded_cpu": 4}), q) is None
        other = SimpleNamespace(token_to_kv_pool=backend.token_to_kv_pool)
        with forward_context(ForwardContext(attn_backend=other)):
            assert attention.plan(batch, q) is None
    finally:
        attention.use_kernel(None)


def test_the_kernel_refuses_a_slot_outside_the_cache(kernel_op):
    """A slot id past the cache (upstream's gather raises IndexError there) is an error,
    not a read out of bounds."""
    g, k, v, req_to_token = _cache(6)
    table = req_to_token.clone()
    table[1, 3] = SLOTS + 5
    q = torch.randn(1, HEADS, DIM, generator=g)
    with pytest.raises(RuntimeError, match=f"slot {SLOTS + 5} of request 0 outside the cache"):
        cpu_paged_attention.paged_attention(kernel_op, q, torch.empty_like(q), k, v, table, torch.tensor([1]),
                                            torch.tensor([6]), 1)
