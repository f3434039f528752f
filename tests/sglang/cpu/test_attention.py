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


def _unbound(fn):
    # upstream's loops read nothing from `self` but the sliding-window mask helper
    return lambda *args, **kwargs: fn(TorchNativeAttnBackend.__new__(TorchNativeAttnBackend), *args, **kwargs)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("gqa", [True, False])
def test_decode_batch_equals_upstreams_loop(window, gqa):
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


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 4)])
@pytest.mark.parametrize("pools", [[2], [1, 3, 0]])
def test_one_row_per_request_goes_to_the_decode_path_and_equals_upstreams_extend_loop(causal, window, pools,
                                                                                       monkeypatch):
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
