"""The `sgl_kernel` CPU stand-in: ops against reference formulas, loud failure for
anything else, and the import hook's real-first behaviour."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from sglang_domino.sglang.cpu.hybrid import gdn_ops
from sglang_domino.sglang.cpu import kernel_standin, platform


def _layout(bs=4, pool_len=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.randint(0, 10_000, (6, pool_len), generator=g, dtype=torch.int32)
    req_pool_indices = torch.randperm(6, generator=g)[:bs].to(torch.int64)
    start = torch.randint(0, 20, (bs,), generator=g).to(torch.int64)
    length = torch.tensor([0, 3, 7, 16][:bs], dtype=torch.int64)
    return req_to_token, req_pool_indices, start, start + length


def test_assign_req_to_token_pool_writes_each_span():
    req_to_token, rows, start, end = _layout()
    total = int((end - start).sum())
    locs = torch.arange(1000, 1000 + total, dtype=torch.int64)
    want = req_to_token.clone()
    o = 0
    for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist()):
        want[r, s:e] = locs[o:o + e - s].to(torch.int32)
        o += e - s
    got = req_to_token.clone()
    kernel_standin.assign_req_to_token_pool_cpu(rows, got, start, end, locs, got.shape[1])
    assert torch.equal(got, want)
    assert not torch.equal(got, req_to_token)


def test_assign_extend_cache_locs_gathers_each_span():
    req_to_token, rows, start, end = _layout(seed=3)
    want = torch.cat([req_to_token[r, s:e] for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist())])
    out = torch.full((int((end - start).sum()),), -1, dtype=torch.int64)
    kernel_standin.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, req_to_token.shape[1])
    assert torch.equal(out, want.to(torch.int64))


def test_assign_extend_then_assign_req_round_trips():
    req_to_token, rows, start, end = _layout(seed=5)
    out = torch.empty((int((end - start).sum()),), dtype=torch.int64)
    kernel_standin.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, req_to_token.shape[1])
    fresh = torch.zeros_like(req_to_token)
    kernel_standin.assign_req_to_token_pool_cpu(rows, fresh, start, end, out, fresh.shape[1])
    for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist()):
        assert torch.equal(fresh[r, s:e], req_to_token[r, s:e])


def test_spans_past_the_pool_row_are_refused():
    req_to_token, rows, start, end = _layout()
    with pytest.raises(ValueError, match="beyond the pool row"):
        kernel_standin.assign_extend_cache_locs_cpu(rows, req_to_token, start, end + 100,
                                             torch.empty(1000, dtype=torch.int64), req_to_token.shape[1])


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    g = torch.Generator().manual_seed(0)
    buffers = [torch.randn(12, 2, 4, generator=g), torch.randn(12, 6, generator=g).half()]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    src = torch.tensor([1, 2, 3])
    tgt = torch.tensor([2, 3, 9])  # overlapping: all sources are read first
    kernel_standin.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(buffers, before):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(b, want)


def test_stand_in_module_fails_loudly_for_missing_ops():
    mod = kernel_standin.build_module("no CUDA here")
    assert mod.assign_extend_cache_locs_cpu is kernel_standin.assign_extend_cache_locs_cpu
    stub = mod.fused_add_rmsnorm_cpu  # importable by name, as sglang's modules need ...
    with pytest.raises(NotImplementedError, match="sgl_kernel.fused_add_rmsnorm_cpu was called.*no CUDA here"):
        stub(torch.zeros(1))  # ... but never silently returns
    with pytest.raises(AttributeError):
        mod.__wrapped__


def test_import_hook_tries_the_real_package_first_then_serves_the_stand_in(monkeypatch):
    saved = {k: v for k, v in sys.modules.items() if k == "sgl_kernel" or k.startswith("sgl_kernel.")}
    for k in saved:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert platform.install_sgl_kernel_finder()
    assert not platform.install_sgl_kernel_finder()  # once per process
    try:
        import sgl_kernel

        real_spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", None)
        assert real_spec is not None  # the CUDA-only wheel is installed here ...
        assert sgl_kernel.__sglang_domino_standin__  # ... fails to import, so the stand-in is served
        assert "sgl_kernel" in sgl_kernel.STANDIN_REASON or sgl_kernel.STANDIN_REASON
        # half-imported parts of the real package purged; the stand-in's own `mamba` served
        assert [k for k in sys.modules if k.startswith("sgl_kernel.")] == ["sgl_kernel.mamba"]
        from sgl_kernel.mamba import chunk_gated_delta_rule_cpu

        assert chunk_gated_delta_rule_cpu is gdn_ops.chunk_gated_delta_rule_cpu
        from sgl_kernel import assign_req_to_token_pool_cpu

        assert assign_req_to_token_pool_cpu is kernel_standin.assign_req_to_token_pool_cpu
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("sgl_kernel.speculative")
    finally:
        for k in [k for k in sys.modules if k == "sgl_kernel" or k.startswith("sgl_kernel.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize("argv,env,want", [
    (["sglang", "serve", "--device", "cpu"], {}, True),
    (["sglang", "serve", "--device=cpu"], {}, True),
    (["sglang", "serve", "--device", "cuda"], {}, False),
    (["x"], {"SGLANG_USE_CPU_ENGINE": "1"}, True),
])
def test_cpu_request_detection(monkeypatch, argv, env, want):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert platform._cpu_requested(argv) is want


def _murmur3_x86_32(data: bytes) -> int:
    """MurmurHash3 x86 32-bit, seed 0, straight from its definition (little-endian blocks)."""
    import struct

    h = 0
    for i in range(0, len(data), 4):
        k = struct.unpack("<I", data[i:i + 4])[0]
        k = (k * 0xCC9E2D51) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * 0x1B873593) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_murmur_hash32_matches_the_hash_and_upstreams_triton_kernel():
    """The stand-in's `torch.ops.sgl_kernel.murmur_hash32_cpu` (seeded sampling on CPU):
    MurmurHash3 of (seed as u64, position as u32, column as u32), equal to 0.5.23's Triton
    `murmur_hash32_kernel` (run here under TRITON_INTERPRET=1) on the same inputs."""
    import struct

    import triton
    from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32_kernel

    from sglang_domino.sglang.cpu import kernel_standin

    kernel_standin.register_torch_ops()
    seed = torch.tensor([0, 42, 2**40 + 7, 2**63 - 1], dtype=torch.int64)
    pos = torch.tensor([0, 5, 9, 2**31 + 3], dtype=torch.int64)
    cols = torch.arange(0, 70, 7, dtype=torch.int64)
    got = torch.ops.sgl_kernel.murmur_hash32_cpu.default(seed, pos, cols)
    expected = [[_murmur3_x86_32(struct.pack("<QII", s, p, c)) for c in cols.tolist()]
                for s, p in zip(seed.tolist(), pos.tolist())]
    assert got.tolist() == expected
    out = torch.empty((4, len(cols)), dtype=torch.int64)
    murmur_hash32_kernel[(4, triton.cdiv(len(cols), 16))](seed, pos, cols, out, 4, len(cols), BLOCK_SIZE=16)
    assert out.tolist() == expected
