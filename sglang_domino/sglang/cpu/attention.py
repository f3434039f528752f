"""Batched attention for 0.5.23's `torch_native` backend on CPU.

0.5.23 serves `--device cpu` attention with `TorchNativeAttnBackend` wherever Intel AMX is
missing (and for every DFLASH draft). Its two attention loops run one request at a time,
a dozen small ops per request and layer, and its extend loop computes attention for the
request's whole sequence, prefix included, then keeps only the new rows: a verify of W
tokens after a context of L costs (L + W) x (L + W) scores instead of W x (L + W), in
every target layer at every decode step of a speculative server (and in the draft's
block).

Here a batch whose requests all add the same number of query rows (a decode step: 1; a
speculative verify or draft block: W; a prefill of equal prompts) runs as one
`scaled_dot_product_attention` call per layer over keys gathered into a padded
[batch, heads, L_max, dim] block, with a boolean mask for each request's length and, when
causal, each row's position (and sliding window). Where the keys are and what each row
sees is the same in every layer of a forward: the first layer plans it (`plan`), the
others reuse the plan. Other batches (prefills of unequal lengths, encoder lengths, cross
attention) go to upstream's loop unchanged.

`SGLANG_DOMINO_CPU_ATTENTION=upstream` keeps upstream's loops (for side-by-side
measurements); any other value but `batched` (the default) is refused.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

MODE_ENV = "SGLANG_DOMINO_CPU_ATTENTION"
MODES = ("batched", "upstream")


def mode() -> str:
    value = os.environ.get(MODE_ENV, "batched").strip().lower() or "batched"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def install() -> bool:
    """Install the `cpu attention` group of `hooks.py` (once per process) unless
    `SGLANG_DOMINO_CPU_ATTENTION=upstream`; returns whether it is in place."""
    if mode() == "upstream":
        return False
    from .. import hooks

    hooks.install(hooks.CPU_ATTENTION)
    return True


class Plan(NamedTuple):
    """What every layer of one forward shares: where each request's keys are and what each
    row may see. Only the caches differ from layer to layer."""
    slots: torch.Tensor               # [bs * L] cache slot of each request's key j (slot 0 past its length)
    longest: int                      # L: the longest request's key count
    mask: Optional[torch.Tensor]      # [bs, 1, q_len or 1, L] rows' allowed keys; None: SDPA's own rule
    is_causal: bool


class _PlanCache:
    """The last plan and what it was made from. A forward calls `attend` once per layer with
    the same `req_to_token`, `req_pool_indices` and lengths, so only its first layer plans.

    The small index tensors are compared by value (a request's pool row and length; a
    forward may build them anew, and an inference tensor has no version counter). The
    `req_to_token` pool is compared by identity and version counter: the entry holds it, so
    no other tensor can take its id, and every write to it advances the counter (also under
    `torch.inference_mode`), as a finished request's reused pool row is written. A pool
    without a counter (an inference tensor) is never cached."""

    def __init__(self):
        self.entry: Optional[tuple] = None   # (req_to_token, its version, pool rows, lengths, args, plan)

    def get(self, req_to_token, req_pool_indices, kv_lens, args) -> Optional[Plan]:
        if self.entry is None or req_to_token.is_inference():
            return None
        pool, version, rows, lens, old_args, cached = self.entry
        if (pool is req_to_token and version == req_to_token._version and old_args == args
                and rows.shape == req_pool_indices.shape and torch.equal(rows, req_pool_indices)
                and lens.shape == kv_lens.shape and torch.equal(lens, kv_lens)):
            return cached
        return None

    def put(self, req_to_token, req_pool_indices, kv_lens, args, fresh: Plan) -> Plan:
        self.entry = None if req_to_token.is_inference() else (
            req_to_token, req_to_token._version, req_pool_indices.clone(), kv_lens.clone(), args, fresh)
        return fresh


_plans = _PlanCache()


def plan(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: torch.Tensor, q_len: int, *,
         causal: bool, sliding_window_size: Optional[int], device) -> Plan:
    """`attend`'s key slots and mask for a batch (see `attend`); computed once per forward."""
    args = (int(q_len), bool(causal), sliding_window_size, torch.device(device))
    cached = _plans.get(req_to_token, req_pool_indices, kv_lens, args)
    if cached is not None:
        return cached
    bs = int(kv_lens.shape[0])
    longest, ragged = int(kv_lens.max()), bool(kv_lens.min() < kv_lens.max())   # host tensors on CPU
    cols = torch.arange(longest, device=device)
    slots = req_to_token[req_pool_indices.to(torch.int64)[:, None], cols[None, :]].to(torch.int64)  # [bs, L]
    lens = kv_lens.to(device=device, dtype=torch.int64)[:, None, None]   # [bs, 1, 1]
    key_pos = cols[None, None, :]                                        # [1, 1, L]
    if ragged:
        # a shorter request's row past its length holds whatever slot was there before: read slot 0, masked
        slots = torch.where(key_pos[:, 0] < lens[:, 0], slots, 0)
    windowed = sliding_window_size is not None and sliding_window_size > -1
    # a mask only where one is needed: SDPA's fused kernel otherwise (a decode step of equal
    # lengths; one request's decode row); a causal single row sees all of its keys
    mask, is_causal = None, False
    if causal and not ragged and not windowed and q_len == longest:
        is_causal = True    # rows and keys aligned (a prefill without a cached prefix): SDPA's own causal kernel
    elif ragged or windowed or (causal and q_len > 1):
        allowed = key_pos < lens                                         # [bs, 1, L]
        row_pos = lens - q_len + torch.arange(q_len, device=device)[None, :, None]   # [bs, q, 1]
        if causal:
            allowed = allowed & (key_pos <= row_pos)
        if windowed:
            allowed = allowed & (key_pos >= row_pos - sliding_window_size)
        mask = allowed[:, None]
    return _plans.put(req_to_token, req_pool_indices, kv_lens, args,
                      Plan(slots.reshape(bs * longest), longest, mask, is_causal))


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
    p = plan(req_to_token, req_pool_indices, kv_lens, q_len, causal=causal,
             sliding_window_size=sliding_window_size, device=query.device)
    # `index_select` of whole rows: on CPU 3-6x cheaper than advanced indexing (200 keys of the test bed: 15 against 92 us)
    keys = k_cache.index_select(0, p.slots).view(bs, p.longest, *k_cache.shape[1:]).permute(0, 2, 1, 3)
    values = v_cache.index_select(0, p.slots).view(bs, p.longest, *v_cache.shape[1:]).permute(0, 2, 1, 3)
    q = query.view(bs, q_len, heads, dim).permute(0, 2, 1, 3)
    if keys.dtype != q.dtype:  # as upstream: the cache may be stored in another dtype
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    out = scaled_dot_product_attention(q, keys, values, attn_mask=p.mask, is_causal=p.is_causal, scale=scaling,
                                       enable_gqa=enable_gqa)
    output.copy_(out.permute(0, 2, 1, 3).reshape(bs * q_len, heads, -1))
    return output


def around_sdpa_forward_decode(original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                               seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                               is_cross_attn=False, sliding_window_size=None):
    """`TorchNativeAttnBackend._run_sdpa_forward_decode`: one row per request."""
    # one request too: with the plan shared by the layers, cheaper than upstream's loop of one
    if encoder_lens is not None or is_cross_attn:
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
    return attend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, width,
                  scaling=scaling, enable_gqa=enable_gqa, causal=causal, sliding_window_size=sliding_window_size)


def _uniform(lengths: Optional[torch.Tensor]) -> Optional[int]:
    """The common length of every request's new rows; None when they differ (or none)."""
    if lengths is None or int(lengths.shape[0]) == 0:
        return None
    first = int(lengths[0])
    return first if first > 0 and bool((lengths == first).all()) else None


__all__ = ["MODE_ENV", "Plan", "attend", "plan", "around_sdpa_forward_decode", "around_sdpa_forward_extend", "install", "mode"]
