"""`sglang_domino.sglang.cpu.compiled.context`: the draft's context (the target's hidden
states projected, then every draft layer's K and V) as one compiled graph, written into a
real KV pool of 0.5.23, against the same math written out with upstream's modules (its
`RMSNorm`, its `RotaryEmbedding`), every row or the prefix-valid rows of each request.
Served end to end by the `domino_adaptive_compiled` server of `tests/e2e/test_e2e_cpu.py`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.sglang.cpu.layers import Holder, rms_norm

pytest.importorskip("sglang")

HIDDEN, FEATURES, HEADS, KV_HEADS, HEAD_DIM = 32, 96, 4, 2, 8


def _rotary():
    """Upstream's `RotaryEmbedding`, built as in a CPU server (where it takes no custom kernel)."""
    from unittest import mock

    from sglang.srt.layers.rotary_embedding import base

    with mock.patch.object(base, "_is_cpu", True):
        return base.RotaryEmbedding(HEAD_DIM, HEAD_DIM, 512, 10000, True, torch.float32)


def _draft(seed=0):
    g = torch.Generator().manual_seed(seed)

    def norm(size):
        return rms_norm(size, g)

    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layers = []
    for i in range(2):
        qkv = Holder(weight=torch.randn(q_size + 2 * kv_size, HIDDEN, generator=g) / HIDDEN ** 0.5,
                     bias=torch.randn(q_size + 2 * kv_size, generator=g) if i else None)
        attn = Holder(qkv_proj=qkv, k_norm=norm(HEAD_DIM), q_size=q_size, kv_size=kv_size, head_dim=HEAD_DIM,
                      num_kv_heads=KV_HEADS, attn=SimpleNamespace(layer_id=i, k_scale=None, v_scale=None),
                      rotary_emb=_rotary())
        layers.append(Holder(self_attn=attn))
    fc = Holder(weight=torch.randn(HIDDEN, FEATURES, generator=g) / FEATURES ** 0.5, bias=None)
    return Holder(layers=torch.nn.ModuleList(layers), fc=fc, hidden_norm=norm(HIDDEN))


@torch.no_grad()
def _reference(draft, hidden, positions):
    """Upstream's append, written out: `project_target_hidden`, then per layer
    `kv_proj_only`, `apply_k_norm`, `apply_k_rope`."""
    ctx = draft.hidden_norm.forward_native(F.linear(hidden, draft.fc.weight))
    out = []
    for layer in draft.layers:
        attn = layer.self_attn
        weight = attn.qkv_proj.weight[attn.q_size:]
        bias = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[attn.q_size:]
        k, v = F.linear(ctx, weight, bias).split([attn.kv_size, attn.kv_size], -1)
        k = attn.k_norm.forward_native(k.reshape(-1, HEAD_DIM)).view(k.shape)
        _, k = attn.rotary_emb.forward_native(positions, torch.empty_like(k), k)
        out.append((k.view(-1, KV_HEADS, HEAD_DIM), v.reshape(-1, KV_HEADS, HEAD_DIM)))
    return out


def _pool():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(size=64, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=HEAD_DIM,
                            layer_num=2, device="cpu", enable_memory_saver=False)


@pytest.fixture(scope="module")
def compiled():
    """One draft and its compiled context for the module (compiling takes most of its time),
    its projections packed for oneDNN as served."""
    from sglang_domino.sglang.cpu.compiled import packed_linear
    from sglang_domino.sglang.cpu.compiled.context import CompiledContext

    draft = _draft()
    context = CompiledContext(draft)
    # the context projection and each layer's K/V rows (2 x 2 x 16 of 32 + 64 rows of 32 inputs, float32)
    assert context.pack() == (3, 4 * (HIDDEN * FEATURES + 2 * 2 * KV_HEADS * HEAD_DIM * HIDDEN))
    assert getattr(draft.layers[0].self_attn.qkv_proj, packed_linear.ATTR, None) is None   # the layers' own: not here
    context.warm(torch.float32, FEATURES)
    return draft, context


def test_every_row_is_written_at_its_slot_as_upstreams_math_gives_it(compiled):
    from sglang_domino.sglang.cpu.compiled.context import write

    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    draft, context = compiled
    graphs = len(_debug_get_cache_entry_list(type(context)._kv.__code__))
    for rows in (1, 3, 17):   # a decode row, a few, a prefill
        g = torch.Generator().manual_seed(rows)
        hidden = torch.randn(rows + 1, FEATURES, generator=g)     # one trailing padding row
        positions = torch.randint(0, 400, (rows,), generator=g)
        slots = torch.randperm(60, generator=g)[:rows] + 1
        pool = _pool()
        write(context, pool, target_hidden=hidden, cache_loc=slots, positions=positions.to(torch.int32))
        for i, (k, v) in enumerate(_reference(draft, hidden[:rows], positions)):
            torch.testing.assert_close(pool.get_key_buffer(i)[slots], k, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(pool.get_value_buffer(i)[slots], v, rtol=1e-4, atol=1e-5)
        untouched = torch.ones(65, dtype=torch.bool)
        untouched[slots] = False
        assert not pool.get_key_buffer(0)[untouched].any()
    assert len(_debug_get_cache_entry_list(type(context)._kv.__code__)) == graphs   # the warm-up's graphs served


def test_a_prefix_valid_write_keeps_each_requests_committed_rows_only(compiled):
    """`cache_loc_2d` [bs, cols] and `commit_lens`: as upstream's `set_kv_buffer_prefix_valid`."""
    from sglang_domino.sglang.cpu.compiled.context import write

    draft, context = compiled
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, FEATURES, generator=g)
    positions = torch.arange(6) + 10
    loc_2d = torch.tensor([[3, 4, 5], [7, 8, 9]])
    commit = torch.tensor([2, 0], dtype=torch.int32)
    ours, upstream = _pool(), _pool()
    write(context, ours, target_hidden=hidden, cache_loc=loc_2d.reshape(-1), positions=positions,
          cache_loc_2d=loc_2d, commit_lens=commit)
    for i, (k, v) in enumerate(_reference(draft, hidden, positions)):
        upstream.set_kv_buffer_prefix_valid(draft.layers[i].self_attn.attn, loc_2d, commit, k, v)
        torch.testing.assert_close(ours.get_key_buffer(i), upstream.get_key_buffer(i), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.get_value_buffer(i), upstream.get_value_buffer(i), rtol=1e-4, atol=1e-5)
    assert ours.get_key_buffer(0)[[3, 4]].any() and not ours.get_key_buffer(0)[[5, 7, 8, 9]].any()
    # nothing committed: nothing written
    empty = _pool()
    write(context, empty, target_hidden=hidden, cache_loc=loc_2d.reshape(-1), positions=positions,
          cache_loc_2d=loc_2d, commit_lens=torch.zeros(2, dtype=torch.int32))
    assert not empty.get_key_buffer(0).any()
