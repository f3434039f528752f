"""Batched attention for 0.5.23's `torch_native` backend on CPU.

0.5.23 serves `--device cpu` attention with `TorchNativeAttnBackend` wherever Intel AMX is
missing (and for every DFLASH draft). Its two attention loops run one request at a time,
a dozen small ops per request and layer, and its extend loop computes attention for the
request's whole sequence, prefix included, then keeps only the new rows: a verify of W
tokens after a context of L costs (L + W) x (L + W) scores instead of W x (L + W), in
every target layer at every decode step of a speculative server (and in the draft's
block).

Here a batch whose requests all add the same number of query rows (a decode step of
several requests: 1; a speculative verify or draft block: W; a prefill of equal prompts) runs as one
`scaled_dot_product_attention` call per layer over keys gathered into a padded
[batch, heads, L_max, dim] block, with a boolean mask for each request's length and, when
causal, each row's position (and sliding window). Other batches (prefills of unequal
lengths, encoder lengths, cross attention) go to upstream's loop unchanged.

`SGLANG_DOMINO_DEBUG=upstream-cpu-attention` keeps upstream's loops (for side-by-side
measurements); any other value but `batched` (the default) is refused.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

from ..environment import debug

MODES = ("batched", "upstream")


def mode() -> str:
    """`batched`, unless `SGLANG_DOMINO_DEBUG` lists `upstream-cpu-attention`."""
    return "upstream" if debug("upstream-cpu-attention") else "batched"


def wanted(_context=None) -> bool:
    """The `cpu attention` group's predicate (`hooks.install_moment`): the batched loops
    unless `SGLANG_DOMINO_DEBUG=upstream-cpu-attention`."""
    return mode() == "batched"


def attend(query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: torch.Tensor, q_len: int, *,
           scaling=None, enable_gqa: bool = False, causal: bool = False,
           sliding_window_size: Optional[int] = None) -> torch.Tensor:
    """Each request's last `q_len` rows attend to its first `kv_lens[r]` cached tokens.

    query, output: [bs * q_len, heads, dim] (requests in order, rows in order);
    k_cache, v_cache: [slots, kv_heads, dim]; `req_to_token[req_pool_indices[r], j]` is
    the slot of request r's token j. Causal: row i of request r sits at position
    kv_lens[r] - q_len + i and sees keys up to it (within `sliding_window_size` when
    given); otherwise every row sees all kv_lens[r] keys."""
    bs = int(kv_lens.shape[0])
    heads, dim = int(query.shape[1]), int(query.shape[2])
    longest, ragged = int(kv_lens.max()), bool(kv_lens.min() < kv_lens.max())   # host tensors on CPU
    cols = torch.arange(longest, device=query.device)
    # row gathers (`index_select`), not advanced indexing: the same values, 2.8-4.8x faster
    # for 64-1000 rows in a micro-benchmark (one thread, 2-core AMD EPYC, 2026-12-06)
    slots = req_to_token.index_select(0, req_pool_indices.to(torch.int64))[:, :longest].to(torch.int64)  # [bs, L]
    lens = kv_lens.to(torch.int64)[:, None, None]                        # [bs, 1, 1]
    key_pos = cols[None, None, :]                                        # [1, 1, L]
    if ragged:
        # a shorter request's row past its length holds whatever slot was there before: read slot 0, masked
        slots = torch.where(key_pos[:, 0] < lens[:, 0], slots, 0)
    flat = slots.reshape(-1)
    keys = k_cache.index_select(0, flat).view(bs, longest, *k_cache.shape[1:]).permute(0, 2, 1, 3)  # [bs, kv_heads, L, dim]
    values = v_cache.index_select(0, flat).view(bs, longest, *v_cache.shape[1:]).permute(0, 2, 1, 3)
    q = query.view(bs, q_len, heads, dim).permute(0, 2, 1, 3)
    if keys.dtype != q.dtype:  # as upstream: the cache may be stored in another dtype
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    windowed = sliding_window_size is not None and sliding_window_size > -1
    # a mask only where one is needed: SDPA's fused kernel otherwise (a decode step of equal
    # lengths; one request's decode row); a causal single row sees all of its keys
    mask, is_causal = None, False
    if causal and not ragged and not windowed and q_len == longest:
        is_causal = True    # rows and keys aligned (a prefill without a cached prefix): SDPA's own causal kernel
    elif ragged or windowed or (causal and q_len > 1):
        allowed = key_pos < lens                                         # [bs, 1, L]
        row_pos = lens - q_len + torch.arange(q_len, device=query.device)[None, :, None]   # [bs, q, 1]
        if causal:
            allowed = allowed & (key_pos <= row_pos)
        if windowed:
            allowed = allowed & (key_pos >= row_pos - sliding_window_size)
        mask = allowed[:, None]
    out = scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal, scale=scaling,
                                       enable_gqa=enable_gqa)
    output.copy_(out.permute(0, 2, 1, 3).reshape(bs * q_len, heads, -1))
    return output


def around_sdpa_forward_decode(original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                               seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                               is_cross_attn=False, sliding_window_size=None):
    """`TorchNativeAttnBackend._run_sdpa_forward_decode`: one row per request."""
    # one request: upstream's loop is already one call, and a little cheaper than the gather here
    if encoder_lens is not None or is_cross_attn or int(seq_lens.shape[0]) <= 1:
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                        is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    # upstream's decode row sees every key without a causal mask, its window counted
    # from the row's own position (the last): the same as a causal row here
    return attend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, 1, scaling=scaling,
                  enable_gqa=enable_gqa, causal=sliding_window_size is not None,
                  sliding_window_size=sliding_window_size)


def around_sdpa_forward_extend(original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                               seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                               enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
    """`TorchNativeAttnBackend._run_sdpa_forward_extend`: batched when every request adds
    the same number of rows (a decode-time verify or draft block, equal prefills)."""
    width = _uniform(extend_seq_lens)
    if encoder_lens is not None or is_cross_attn or width is None:
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa,
                        causal=causal, is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    if width == 1:
        # one row per request (an adaptive width-1 verify) is a decode row, which sees every
        # key up to its own: the decode path (upstream's loop for one request, as above)
        return self._run_sdpa_forward_decode(query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                             seq_lens, scaling=scaling, enable_gqa=enable_gqa, causal=False,
                                             sliding_window_size=sliding_window_size)
    return attend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, width,
                  scaling=scaling, enable_gqa=enable_gqa, causal=causal, sliding_window_size=sliding_window_size)


def _uniform(lengths: Optional[torch.Tensor]) -> Optional[int]:
    """The common length of every request's new rows; None when they differ (or none)."""
    if lengths is None or int(lengths.shape[0]) == 0:
        return None
    first = int(lengths[0])
    return first if first > 0 and bool((lengths == first).all()) else None


__all__ = ["MODES", "wanted", "attend", "around_sdpa_forward_decode", "around_sdpa_forward_extend", "mode"]
