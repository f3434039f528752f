"""Pure-PyTorch CPU implementations of the `sgl_kernel` ops SGLang 0.5.23's CPU engine
calls on the DFLASH / Domino serving path, served as the module `sgl_kernel` by the
import hook in `platform.py` when the real `sgl_kernel` cannot be imported (PyPI has no
CPU build).

Implemented (call sites in the 0.5.23 wheel):
  * `assign_req_to_token_pool_cpu`  - `srt/mem_cache/allocation.assign_req_to_token_pool_func`
    (decode KV over-allocation, `alloc_for_spec_decode`, and the plain decode path);
  * `assign_extend_cache_locs_cpu`  - `kernels/ops/speculative/cache_locs`:
    `assign_extend_cache_locs_func` (DFLASH draft block slots, from
    `DFlashWorkerV2.forward_batch_generation`) and `fill_front_out_cache_loc_func`;
  * `copy_all_layer_kv_cache_cpu`   - `kernels/ops/kvcache/cache_move.copy_all_layer_kv_cache_func`
    (KV row moves; imported at module load by every CPU process);
  * `torch.ops.sgl_kernel.murmur_hash32_cpu` - `kernels/ops/sampling/murmur_hash.murmur_hash32`
    (seeded sampling under `--enable-deterministic-inference`, `sampler.multinomial_with_seed`,
    and the q rule's seeded coins), registered as a torch op when the stand-in is built.

Hybrid (gated delta-net) targets: `sgl_kernel.mamba` (`causal_conv1d_fn_cpu`,
`causal_conv1d_update_cpu`, `chunk_gated_delta_rule_cpu`) and the `torch.ops.sgl_kernel`
GDN and Qwen3.5 ops, from `gdn_ops` and `qwen3_5_ops`.

Every other attribute resolves to a stub that raises `NotImplementedError` naming the
op when *called* (SGLang imports many ops by name at module load, so the names must
exist; calling one must fail loudly, never return garbage).
"""

from __future__ import annotations

import ctypes
import types

import torch

__version__ = "0.0.0+sglang-domino-cpu"

IMPLEMENTED = ("assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu", "copy_all_layer_kv_cache_cpu")


def _spans(start_offset: torch.Tensor, end_offset: torch.Tensor):
    starts = start_offset.reshape(-1).tolist()
    ends = end_offset.reshape(-1).tolist()
    offset = 0
    for i, (s, e) in enumerate(zip(starts, ends)):
        n = int(e) - int(s)
        if n < 0:
            raise ValueError(f"sgl_kernel stand-in: request {i} has end {e} < start {s}")
        yield i, int(s), int(e), offset
        offset += n


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For request i: `req_to_token[req_pool_indices[i], start[i]:end[i]] =
    out_cache_loc[o_i : o_i + end[i] - start[i]]`, o_i = sum of the earlier lengths
    (the Triton `srt/mem_cache/allocation.assign_req_to_token_pool`)."""
    rows = req_pool_indices.reshape(-1).tolist()
    flat = out_cache_loc.reshape(-1)
    for i, s, e, o in _spans(start_offset, end_offset):
        if e > pool_len:
            raise ValueError(f"sgl_kernel stand-in: end {e} beyond the pool row length {pool_len}")
        req_to_token[int(rows[i]), s:e] = flat[o:o + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """The gather direction: `out_cache_loc[o_i : o_i + n_i] =
    req_to_token[req_pool_indices[i], start[i]:end[i]]` (the Triton
    `kernels/ops/speculative/cache_locs.assign_extend_cache_locs`)."""
    rows = req_pool_indices.reshape(-1).tolist()
    flat = out_cache_loc.view(-1)
    for i, s, e, o in _spans(start_offset, end_offset):
        if e > pool_len:
            raise ValueError(f"sgl_kernel stand-in: end {e} beyond the pool row length {pool_len}")
        flat[o:o + e - s] = req_to_token[int(rows[i]), s:e].to(flat.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor,
                                tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """For every buffer b (base address `data_ptrs[b]`, row size `strides[b]` bytes), copy
    row `src_loc[j]` to row `tgt_loc[j]` for all j; all sources are read before any
    target is written (the Triton `copy_all_layer_kv_cache_tiled`,
    `kernels/ops/kvcache/cache_move.py`)."""
    src = src_loc.reshape(-1).tolist()
    tgt = tgt_loc.reshape(-1).tolist()
    if len(src) != len(tgt):
        raise ValueError(f"sgl_kernel stand-in: {len(src)} source rows but {len(tgt)} target rows")
    for base, row_bytes in zip(data_ptrs.reshape(-1).tolist(), strides.reshape(-1).tolist()):
        base, row_bytes = int(base), int(row_bytes)
        rows = [ctypes.string_at(base + int(s) * row_bytes, row_bytes) for s in src]
        for t, data in zip(tgt, rows):
            ctypes.memmove(base + int(t) * row_bytes, data, row_bytes)


_U32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """One MurmurHash3 (x86, 32-bit) block round; values are uint32 held in int64, whose
    wrapping products keep the low 32 bits exact."""
    k = _rotl32((k * 0xCC9E2D51) & _U32, 15)
    k = (k * 0x1B873593) & _U32
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _U32


def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """[n] seeds, [n] positions, [m] columns -> [n, m] hashes: MurmurHash3 over the four
    4-byte blocks (seed low, seed high, position, column), length 16, as upstream's Triton
    `kernels/ops/sampling/murmur_hash.murmur_hash32_kernel` hashes them on GPU.
    Returned as int64 holding the uint32 value (callers convert to float64)."""
    seed = seed.reshape(-1).to(torch.int64)
    h = torch.zeros_like(seed)
    h = _mix(h, seed & _U32)
    h = _mix(h, (seed >> 32) & _U32)
    h = _mix(h, positions.reshape(-1).to(torch.int64) & _U32)[:, None]
    h = _mix(h, (col_indices.reshape(-1).to(torch.int64) & _U32)[None, :])
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _U32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


_torch_ops = None


def register_torch_ops() -> None:
    """`torch.ops.sgl_kernel.*` entries the CPU path calls (the real sgl_kernel registers
    them from its C++ extension). Idempotent; skipped where an op of that name exists."""
    global _torch_ops
    if _torch_ops is not None or hasattr(torch.ops.sgl_kernel, "murmur_hash32_cpu"):
        return
    from .hybrid import gdn_ops, qwen3_5_ops

    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    lib.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")
    lib.impl("murmur_hash32_cpu", murmur_hash32_cpu, "CPU")
    gdn_ops.register(lib)
    qwen3_5_ops.register(lib)
    _torch_ops = lib


class MissingOpError(NotImplementedError):
    pass


def _missing(name: str, reason: str):
    def unavailable(*args, **kwargs):
        raise MissingOpError(
            f"sgl_kernel.{name} was called, but the real sgl_kernel could not be imported "
            f"({reason}) and sglang-domino's CPU stand-in does not implement it "
            f"(implemented: {', '.join(IMPLEMENTED)})."
        )

    unavailable.__name__ = name
    unavailable.__qualname__ = name
    unavailable._sglang_domino_missing = True
    return unavailable


def _mamba_module() -> types.ModuleType:
    """`sgl_kernel.mamba`, imported by name by every hybrid (mambaish) model's backends on
    CPU (the `is_cpu()` branches of `gdn_backend`, `gdn_triton` and `kda_backend`)."""
    import importlib.machinery
    import sys

    from .hybrid import gdn_ops

    mod = types.ModuleType("sgl_kernel.mamba", "sglang-domino CPU stand-in for sgl_kernel.mamba")
    mod.__spec__ = importlib.machinery.ModuleSpec("sgl_kernel.mamba", None)
    mod.__file__ = gdn_ops.__file__
    for name in gdn_ops.MAMBA_FUNCTIONS:
        setattr(mod, name, getattr(gdn_ops, name))
    sys.modules["sgl_kernel.mamba"] = mod
    return mod


def build_module(reason: str) -> types.ModuleType:
    """The module object served as `sgl_kernel` (a package with an empty path)."""
    import importlib.machinery

    mod = types.ModuleType("sgl_kernel", "sglang-domino CPU stand-in for sgl_kernel")
    mod.__spec__ = importlib.machinery.ModuleSpec("sgl_kernel", None, is_package=True)
    mod.__spec__.submodule_search_locations = []
    mod.__path__ = []
    mod.__file__ = __file__
    mod.__version__ = __version__
    mod.__sglang_domino_standin__ = True
    mod.STANDIN_REASON = reason
    for name in IMPLEMENTED:
        setattr(mod, name, globals()[name])
    mod.mamba = _mamba_module()
    register_torch_ops()

    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _missing(name, reason)
        setattr(mod, name, stub)
        return stub

    mod.__getattr__ = __getattr__
    return mod
