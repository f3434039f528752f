"""The batched torch_native attention (`cpu/attention.py`) against 0.5.23's own per-request
loops (`TorchNativeAttnBackend._run_sdpa_forward_decode` / `_run_sdpa_forward_extend`),
called unbound on the same caches: decode, a verify block (causal), the draft's block
(non-causal), sliding windows, GQA, unequal lengths; batches it does not batch go to
upstream."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402

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


def _unbound(fn):
    # upstream's loops read nothing from `self` but the sliding-window mask helper
    return lambda *args, **kwargs: fn(TorchNativeAttnBackend.__new__(TorchNativeAttnBackend), *args, **kwargs)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("gqa", [True, False])
@pytest.mark.parametrize("requests", [3, 1])
def test_decode_batch_equals_upstreams_loop(window, gqa, requests):
    g, k, v, req_to_token = _cache()
    heads = HEADS if gqa else KV_HEADS
    seq_lens = torch.tensor([7, 30, 1])[:requests]
    pools = torch.tensor([2, 0, 1])[:requests]
    q = torch.randn(requests, heads, DIM, generator=g)
    want = _unbound(UPSTREAM_DECODE)(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, None,
                                     scaling=0.3, enable_gqa=gqa, sliding_window_size=window)
    got = attention.around_sdpa_forward_decode(UPSTREAM_DECODE, None, q, torch.empty_like(q), k, v, req_to_token,
                                               pools, seq_lens, None, scaling=0.3, enable_gqa=gqa,
                                               sliding_window_size=window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 4)])
def test_a_block_of_w_rows_per_request_equals_upstreams_loop(causal, window):
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
    monkeypatch.setenv(attention.MODE_ENV, "upstream")
    assert attention.mode() == "upstream" and attention.install() is False
    monkeypatch.setenv(attention.MODE_ENV, "fast")
    with pytest.raises(ValueError, match="SGLANG_DOMINO_CPU_ATTENTION='fast'"):
        attention.mode()


def test_a_prefill_of_equal_prompts_equals_upstreams_loop():
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


def _decode(q, k, v, req_to_token, pools, seq_lens):
    want = _unbound(UPSTREAM_DECODE)(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, None,
                                     enable_gqa=True)
    got = attention.attend(q, torch.empty_like(q), k, v, req_to_token, pools, seq_lens, 1, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    return attention._plans.entry[-1] if attention._plans.entry is not None else None


def test_the_layers_of_a_forward_share_one_plan_and_a_pool_write_or_new_lengths_replan():
    """Every layer of a forward reads other caches through the same plan. A write to a
    request's pool row (a finished request's row given to a new one of the same length) or
    other lengths, even in new tensors of equal values, make a new plan; equal values in new
    tensors reuse it."""
    g, k, v, req_to_token = _cache(5)
    k2, v2 = torch.randn_like(k), torch.randn_like(v)
    pools, seq_lens = torch.tensor([0, 2]), torch.tensor([11, 6])
    q = torch.randn(2, HEADS, DIM, generator=g)
    first = _decode(q, k, v, req_to_token, pools, seq_lens)
    assert _decode(q, k2, v2, req_to_token, pools, seq_lens) is first                  # the next layer
    assert _decode(q, k, v, req_to_token, pools.clone(), seq_lens.clone()) is first    # equal values
    with torch.inference_mode():   # the scheduler's writes: also under inference mode
        req_to_token[2, :6] = torch.randperm(SLOTS, generator=g)[:6].to(torch.int32)
    rewritten = _decode(q, k, v, req_to_token, pools, seq_lens)
    assert rewritten is not first
    assert _decode(q, k, v, req_to_token, pools, torch.tensor([11, 7])) is not rewritten
    assert _decode(q, k, v, req_to_token, torch.tensor([1, 2]), torch.tensor([11, 7])) is not rewritten


def test_a_pool_without_a_version_counter_is_planned_every_time():
    g, k, v, req_to_token = _cache(6)
    with torch.inference_mode():
        pool = req_to_token.clone()
    pools, seq_lens = torch.tensor([1, 3]), torch.tensor([5, 9])
    q = torch.randn(2, HEADS, DIM, generator=g)
    _decode(q, k, v, pool, pools, seq_lens)
    assert attention._plans.entry is None
