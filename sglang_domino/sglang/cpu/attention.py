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

Under the compiled CPU step (`--enable-torch-compile`) the same batches, and one
request's decode row, go to a C++ kernel that reads the paged cache in place
(`sglang_domino.kernels.cpu_paged_attention`, built when the model is compiled,
`use_kernel`); `attend` is its reference. Inputs it does not take (a cache in another
dtype than the query's) stay on `attend`. There the compiled graphs' attention op also
skips upstream's per-layer dispatch (`RadixAttention.forward`, the backend's `forward`
and `forward_decode` / `forward_extend`, this module's hooks: about 0.3 ms a layer on a
2-core CPU, three times the kernel) where a forward's batch allows it (`Plan`): the
same KV write and the same attention, decided once per forward.

`SGLANG_DOMINO_DEBUG=upstream-cpu-attention` keeps upstream's loops (for side-by-side
measurements); any other value but `batched` (the default) is refused.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

from ...kernels import cpu_paged_attention
from ..environment import debug

MODES = ("batched", "upstream")


class _Kernel:
    op = None   # the paged-attention kernel's op, where the compiled step built it (`use_kernel`)


def use_kernel(op) -> None:
    """Serve the batched attention (and one request's decode row) with the C++ kernel `op`
    (`cpu_paged_attention.build`) in this process; None: `attend` again."""
    _Kernel.op = op


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


def attend_paged(query, output, k_cache, v_cache, req_to_token, req_pool_indices, kv_lens, q_len: int, *,
                 scaling=None, enable_gqa: bool = False, causal: bool = False,
                 sliding_window_size: Optional[int] = None) -> torch.Tensor:
    """`attend` through the kernel where this process has it and it takes these inputs."""
    op = _Kernel.op
    if op is None or not cpu_paged_attention.suits(query, output, k_cache, v_cache, req_to_token):
        return attend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, kv_lens, q_len,
                      scaling=scaling, enable_gqa=enable_gqa, causal=causal, sliding_window_size=sliding_window_size)
    # grouped-query heads follow from the shapes there, as SDPA's enable_gqa does here
    return cpu_paged_attention.paged_attention(op, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                               kv_lens, q_len, scaling=scaling, causal=causal,
                                               sliding_window_size=sliding_window_size)


class _Layer:
    """What a `RadixAttention` module's attention reads off it, once per module (its
    attributes do not change while serving)."""

    def __init__(self, module):
        from sglang.srt.layers.radix_attention import AttentionType

        self.cross = bool(module.is_cross_attention)
        self.heads, self.kv_heads, self.v_heads = module.tp_q_head_num, module.tp_k_head_num, module.tp_v_head_num
        self.dim, self.v_dim, self.layer_id = module.qk_head_dim, module.v_head_dim, module.layer_id
        self.scale = float(module.scaling) if module.scaling is not None else self.dim ** -0.5
        self.causal = module.attn_type != AttentionType.ENCODER_ONLY      # in an extend
        window = module.sliding_window_size
        self.window = int(window) if window is not None and window > -1 else -1


_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _layer(module) -> _Layer:
    info = _LAYERS.get(module)
    if info is None:
        info = _LAYERS[module] = _Layer(module)
    return info


class Plan:
    """One forward's softmax attention straight through the kernel, layer by layer, as
    upstream's `torch_native` backend would run it with this module's hooks: the layer's
    K and V written with the pool's own `set_kv_buffer` at the batch's `out_cache_loc`
    (what `forward_decode` / `forward_extend` write), then every request's `q_len` new
    rows attend to its `seq_lens` cached tokens (decode: no causal mask, the window
    counted from the row; extend: causal unless the layer is encoder-only, the window
    only when causal). Built by `plan`, once per forward."""

    def __init__(self, backend, batch, q_len: int, decode: bool, lens: Optional[torch.Tensor] = None):
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        self.q_len, self.decode = q_len, decode
        self.pool = backend.token_to_kv_pool
        self.table = backend.req_to_token_pool.req_to_token
        self.loc = KVWriteLoc(batch.out_cache_loc, backend.swa_out_cache_loc)
        self.rows = batch.req_pool_indices.to(torch.int64).contiguous()
        self.lens = (batch.seq_lens if lens is None else lens).to(torch.int64).contiguous()

    def __call__(self, module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
        """Layer `module`'s attention output `[rows, heads * v_head_dim]`, its KV written;
        None (nothing done) for a cross-attention layer: upstream's path then."""
        layer = _layer(module)
        if layer.cross:
            return None
        # the views RadixAttention.forward takes
        self.pool.set_kv_buffer(module, self.loc, k.view(-1, layer.kv_heads, layer.dim),
                                v.view(-1, layer.v_heads, layer.v_dim))
        causal = not self.decode and layer.causal
        window = layer.window if self.decode or causal else -1
        query = q.view(-1, layer.heads, layer.dim)
        out = q.new_empty(query.shape[0], layer.heads * layer.v_dim)
        output = out.view(-1, layer.heads, layer.v_dim)
        attend_paged(query, output, self.pool.get_key_buffer(layer.layer_id),
                     self.pool.get_value_buffer(layer.layer_id), self.table, self.rows, self.lens, self.q_len,
                     scaling=layer.scale, enable_gqa=layer.heads != layer.kv_heads, causal=causal,
                     sliding_window_size=window)
        return out


def plan(batch, q: torch.Tensor) -> Optional[Plan]:
    """The `Plan` of a forward whose first attention layer gets `q`, where this process
    has the kernel and upstream's path would be `torch_native` over a plain MHA pool with
    a batch this module batches (a decode step, or every request adding the same number
    of rows, without encoder lengths or padded rows); None otherwise (upstream's path)."""
    if _Kernel.op is None or batch is None:
        return None
    from sglang.srt.layers.attention.graph_utils import padded_extend_real_tokens
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor import forward_context

    if not forward_context.has_forward_context():
        return None
    backend = forward_context.get_attn_backend()   # what RadixAttention.forward calls
    if type(backend) is not TorchNativeAttnBackend or type(backend.token_to_kv_pool) is not MHATokenToKVPool:
        return None
    mode = batch.forward_mode
    if getattr(batch, "encoder_lens", None) is not None or mode.is_idle():
        return None
    if mode.is_decode():
        return Plan(backend, batch, 1, decode=True)
    if mode.is_target_verify() and batch.extend_seq_lens is None:
        # a DFLASH verify or draft block, run as `dflash.around_torch_native_forward_extend`
        # runs it: W new rows after each request's `seq_lens`
        from .dflash import verify_width

        width = verify_width(batch, int(q.shape[0]))
        return None if width is None else Plan(backend, batch, width, decode=False, lens=batch.seq_lens + width)
    width = _uniform(batch.extend_seq_lens)
    if width is None or padded_extend_real_tokens(q, batch) is not None:
        return None
    return Plan(backend, batch, width, decode=False)


def around_sdpa_forward_decode(original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                               seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                               is_cross_attn=False, sliding_window_size=None):
    """`TorchNativeAttnBackend._run_sdpa_forward_decode`: one row per request."""
    # one request without the kernel: upstream's loop is already one call, and a little
    # cheaper than the gather here
    if encoder_lens is not None or is_cross_attn or (int(seq_lens.shape[0]) <= 1 and _Kernel.op is None):
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                        is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    # upstream's decode row sees every key without a causal mask, its window counted
    # from the row's own position (the last): the same as a causal row here
    return attend_paged(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, 1,
                        scaling=scaling, enable_gqa=enable_gqa, causal=sliding_window_size is not None,
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
    return attend_paged(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, width,
                        scaling=scaling, enable_gqa=enable_gqa, causal=causal, sliding_window_size=sliding_window_size)


def _uniform(lengths: Optional[torch.Tensor]) -> Optional[int]:
    """The common length of every request's new rows; None when they differ (or none)."""
    if lengths is None or int(lengths.shape[0]) == 0:
        return None
    first = int(lengths[0])
    return first if first > 0 and bool((lengths == first).all()) else None


__all__ = ["MODES", "Plan", "wanted", "attend", "attend_paged", "around_sdpa_forward_decode",
           "around_sdpa_forward_extend", "mode", "plan", "use_kernel"]
