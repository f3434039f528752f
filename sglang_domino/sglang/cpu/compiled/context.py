"""The draft's context written into its KV cache by one compiled graph on CPU.

After every verify (and every prefill), 0.5.23 writes the committed tokens' context into
the DFLASH draft's KV cache (`DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc`):
the target's captured hidden states through the draft's `fc` and `hidden_norm`, then in
every draft layer K and V (K normed and rotated) written at the tokens' slots. On a GPU a
fused helper batches the layers; on CPU upstream runs it eagerly through its modules,
about 2.8 ms a call on the CPU test bed (2-core Intel Xeon, 2 draft layers), almost all of
it fixed cost: timed inside a width-1 server at concurrency 16, the projection alone took
0.9 ms, each layer's K/V, norm, rotary and prefix-valid write 0.9 ms more.

Here, where the draft's layers run compiled (`--enable-torch-compile`, `compiled_forward.py`),
the projection and every layer's K and V are one `torch.compile`
graph over upstream's own pieces of math (`RMSNorm.forward_native`,
`RotaryEmbedding.forward_native`, the fused QKV weight's K/V rows, as upstream's
`kv_proj_only`), and each layer's rows are written with the pool's `set_kv_buffer`, the
rows a prefix-valid write keeps selected once for every layer (upstream's CPU branch of
`set_kv_buffer_prefix_valid` selects them the same way, per layer). Graphs for one row and
for many are compiled with the draft's layers, before the first request.

Only what the context writes changes hands here, never what is committed: the draft reads
it, and the target verifies what the draft proposes.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from . import packed_linear
from .switches import Graph, guarded_inputs


class CompiledContext:
    """`(target hidden states, positions) -> [(K, V) per draft layer]` under one graph,
    for a `DFlashDraftModel` that `compiled_forward.refusal` accepts."""

    def __init__(self, draft_model):
        self.model = draft_model
        self.layers = list(draft_model.layers)
        self._compiled = Graph(self._kv)

    @staticmethod
    def kv_rows(attn) -> slice:
        """The fused QKV weight's K and V rows."""
        return slice(attn.q_size, attn.q_size + 2 * attn.kv_size)

    def pack(self) -> tuple[int, int]:
        """Pack the context projection and every layer's K/V rows for oneDNN
        (`packed_linear`): (how many, bytes)."""
        fc = self.model.fc
        packed = [(fc, packed_linear.ATTR)] if packed_linear.pack(fc, fc.weight) else []
        for layer in self.layers:
            qkv = layer.self_attn.qkv_proj
            if packed_linear.pack(qkv, qkv.weight[self.kv_rows(layer.self_attn)], packed_linear.KV_ROWS_ATTR):
                packed.append((qkv, packed_linear.KV_ROWS_ATTR))
        return len(packed), sum(packed_linear.packed_bytes(m, attr) for m, attr in packed)

    def _kv(self, target_hidden: torch.Tensor, positions: torch.Tensor):
        model = self.model
        ctx = model.hidden_norm.forward_native(packed_linear.project(target_hidden, model.fc))
        out = []
        for layer in self.layers:
            attn = layer.self_attn
            qkv, rows = attn.qkv_proj, self.kv_rows(attn)
            bias = qkv.bias[rows] if qkv.bias is not None else None
            k, v = packed_linear.linear(ctx, qkv.weight[rows], bias, getattr(qkv, packed_linear.KV_ROWS_ATTR, None)) \
                .split([attn.kv_size, attn.kv_size], dim=-1)
            k = attn.k_norm.forward_native(k.reshape(-1, attn.head_dim)).view(k.shape)
            _, k = attn.rotary_emb.forward_native(positions, k, k)
            out.append((k.reshape(-1, attn.num_kv_heads, attn.head_dim),
                        v.reshape(-1, attn.num_kv_heads, attn.head_dim)))
        return out

    def __call__(self, target_hidden: torch.Tensor, positions: torch.Tensor):
        """Run in inference mode on inference tensors (dynamo's guards tell them apart, see
        `CompiledLayers.__call__`)."""
        with torch.inference_mode():
            target_hidden, positions = guarded_inputs((target_hidden, positions))
            return self._compiled(target_hidden, positions.to(torch.int64))

    def warm(self, dtype: torch.dtype, features: int) -> float:
        """Compile the graphs for one row and for many; seconds taken. The row counts a
        write serves are not run here: a decode step commits anything from one token to its
        batch's rows, up to 1024 counts at a batch cap of 64, where oneDNN's first product
        at a new count costs about 2 ms in float32 (packed, three projections), several
        seconds of start-up to save that much once per count while serving."""
        t0 = time.perf_counter()
        for rows in (1, 2):
            self(torch.zeros(rows, features, dtype=dtype), torch.zeros(rows, dtype=torch.int64))
        return time.perf_counter() - t0


def write(context: CompiledContext, pool, *, target_hidden: torch.Tensor, cache_loc: torch.Tensor,
          positions: torch.Tensor, cache_loc_2d: Optional[torch.Tensor] = None,
          commit_lens: Optional[torch.Tensor] = None, **_) -> None:
    """Upstream's `_append_target_hidden_to_draft_kv_by_loc` arguments, written into the
    draft's KV `pool`: every row at its slot, or with `cache_loc_2d` ([bs, cols], the same
    slots row-major) and `commit_lens` the first `commit_lens[r]` of request r's."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    n = int(cache_loc.numel())
    if n == 0:
        return
    target_hidden = target_hidden[:n]   # trailing alignment padding, as upstream drops it
    loc = cache_loc.to(torch.int64)
    kv = context(target_hidden, positions)
    keep = None
    if cache_loc_2d is not None:
        if commit_lens is None:
            raise ValueError("sglang-domino context write: cache_loc_2d needs commit_lens")
        cols = torch.arange(int(cache_loc_2d.shape[1]))
        valid = (cols[None, :] < commit_lens.to(torch.int64)[:, None]).reshape(-1)
        if not bool(valid.all()):   # a host tensor on CPU
            keep = torch.nonzero(valid).flatten()
            if int(keep.numel()) == 0:
                return
            loc = cache_loc_2d.reshape(-1).to(torch.int64).index_select(0, keep)
    for layer, (k, v) in zip(context.layers, kv):
        if keep is not None:
            k, v = k.index_select(0, keep), v.index_select(0, keep)
        attn = layer.self_attn.attn
        pool.set_kv_buffer(attn, KVWriteLoc(loc, physical=True), k, v, attn.k_scale, attn.v_scale)


__all__ = ["CompiledContext", "write"]
