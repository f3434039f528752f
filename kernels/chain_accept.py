"""Chain speculative-sampling acceptance with a sparse draft distribution, one Triton
program per request.

Reference: `sglang_domino.accept.accept_probs`, held equal token for token when both get
the same `Uniforms` (tests/test_kernels.py; benchmarks/gpu_check.py at real sizes).

Why sparse. The Domino draft's q is dense over the vocabulary only for proposal 0; the
later proposals put their mass on a per-request candidate pool of K tokens shared by
the block. A dense q buffer [b, n, V] costs 583 MB in fp32 at Qwen3-8B's vocabulary
(151,936), n = 15 and batch 64, and it is written only to be read back once here.
SGLang 0.5.23's `chain_speculative_sampling_triton`
(`sglang/kernels/ops/speculative/reject_sampling.py`) needs that dense `draft_probs`,
and sglang cannot be installed on the GPU check machine anyway, so this is our own
kernel on the compact layout:

  * `q_draft[b, k]` = q_k(d_k): the accept tests read only scalars;
  * `q_first[b, V]`: q_0, dense;
  * `pool_ids[b, K]` (unique ids) and `q_rest[b, k-1, j]` = q_k(pool_ids[b, j]) for
    k = 1..n-1; q_k is 0 off the pool. Without a pool pass pool_ids = arange(V)
    expanded and q_rest dense.
  * point-mass mode (q_draft, q_first, pool_ids, q_rest all None): q_k is a point mass
    on d_k, the greedy draft.

Per request: draft k is accepted while u_k * q_k(d_k) < p_k(d_k) and q_k(d_k) > 0; at the
first rejected row j (or row n after n acceptances) the next token is drawn from the
residual max(p_j - q_j, 0) (p_n itself after n acceptances) by inverse CDF: the first
vocabulary index whose running sum exceeds u_final * total, clamped to V-1. When the
residual has no mass (only by rounding or degenerate inputs) it falls back to p_j, as
the reference does. Draft and pool ids are clamped into [0, V-1] (int64); q_draft[b, k]
must be 0 where d_k is off the pool (it is what the densified q holds there).

Equality with the reference is exact for the acceptance lengths (the same fp32 products
and comparisons) and for the next token up to the order of fp32 summation: both walk a
CDF of V terms, ~1e-7 of the total apart, so at V=151,936 (a token holds ~1e-5) they
can pick neighbouring tokens when u_final * total falls that close to a boundary
(benchmarks/gpu_check.py counts such ties; at the test sizes there are none).

Rows 0 (dense q_first) and the point-mass case compute the residual on the fly while
reading p. Pool rows write it into `target_probs` in place (scatter over the K pool
entries): target_probs is CLOBBERED. The write happens only after an exact test that
the residual has mass (counts of positive entries, no rounded sums), so the fallback
to the unmodified p_j stays possible. The running sum is kept per block as the last
element of `tl.cumsum` plus the carry, in both the total and the scan pass, so the
scan always finds an index when u_final * total < total, as the reference does.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang_domino.accept import Uniforms

DEFAULT_BLOCK = 4096

# What Triton may specialise a compiled variant on. Integers: none (a variant per width or
# vocabulary would compile while serving). Pointers: Triton compiles a variant per
# 16-byte alignment of each pointer. The scalar-read ones carry none here, since at batch
# 1 the step passes views of its buffers ("candidates[:, 1:]", "u[:, n]": a [1, n] slice
# counts as contiguous) whose addresses are not 16-byte aligned, and the start-up warm-up
# (fresh tensors) would not have built that variant. The tile-read ones (the vocabulary
# and pool rows) keep their alignment for vector loads: `_tiles_aligned` copies a
# misaligned one, so the kernel only ever sees the aligned variant.
NO_VALUE_SPECIALIZATION = ("n", "V", "K", "pool_stride")
NO_ALIGNMENT_SPECIALIZATION = ("draft_ptr", "q_draft_ptr", "u_steps_ptr", "u_final_ptr", "accepted_ptr", "next_ptr")


@triton.jit
def _pool_tile(pool, q_row, row, s, offs, K, V):
    """One tile of a pool row: (in range, clamped ids, q on the pool, p at those ids)."""
    m = s + offs < K
    ids = tl.load(pool + s + offs, mask=m, other=0)
    ids = tl.minimum(tl.maximum(ids, 0), V - 1)
    q = tl.load(q_row + s + offs, mask=m, other=0.0)
    p = tl.load(row + ids, mask=m, other=0.0)
    return m, ids, q, p


@triton.jit
def _residual(p, q_first_row, idx, m, sub_first, drop, d_j, POINT_MASS: tl.constexpr):
    """One block of the weights to sample from: max(p - q_first, 0) when sub_first, p
    without d_j when drop (point mass), else p as read."""
    if POINT_MASS:
        r = tl.where(drop & (idx == d_j), 0.0, p)
    else:
        q = tl.load(q_first_row + idx, mask=m & sub_first, other=0.0)
        r = tl.where(sub_first, tl.maximum(p - q, 0.0), p)
    return r


# n == 1 or K == 1 must not become constexprs: j and the counters are loop-carried.
@triton.jit(do_not_specialize=NO_VALUE_SPECIALIZATION, do_not_specialize_on_alignment=NO_ALIGNMENT_SPECIALIZATION)
def _chain_accept_kernel(draft_ptr, q_draft_ptr, q_first_ptr, pool_ptr, q_rest_ptr, p_ptr, u_steps_ptr, u_final_ptr,
                         accepted_ptr, next_ptr, n, V, K, pool_stride,
                         POINT_MASS: tl.constexpr, BLOCK: tl.constexpr):
    req = tl.program_id(0).to(tl.int64)
    p_req = p_ptr + req * (n + 1) * V
    offs = tl.arange(0, BLOCK)

    # 1. The accept tests, scalars only: j = the first k that fails, n when none does.
    j = n
    for k in range(0, n):
        d = tl.load(draft_ptr + req * n + k)
        d = tl.minimum(tl.maximum(d, 0), V - 1)
        p_d = tl.load(p_req + k * V + d)
        u = tl.load(u_steps_ptr + req * n + k)
        if POINT_MASS:
            ok = u < p_d
        else:
            q_d = tl.load(q_draft_ptr + req * n + k)
            ok = (u * q_d < p_d) & (q_d > 0)
        j = tl.minimum(j, tl.where(ok, n, k))
    rejected = j < n
    row = p_req + j.to(tl.int64) * V
    d_j = tl.load(draft_ptr + req * n + tl.minimum(j, n - 1))
    d_j = tl.minimum(tl.maximum(d_j, 0), V - 1)

    # 2. Pool rows (1 <= j < n): p_j <- max(p_j - q_j, 0) on the pool, in place, when
    # the residual has mass. It has mass iff some entry is positive: a pool entry with
    # p > q, or an off-pool entry with p > 0 (#positive in the row > #positive on the
    # pool; ids are unique).
    if not POINT_MASS:
        if rejected & (j > 0):
            q_row = q_rest_ptr + (req * (n - 1) + (j - 1)) * K
            pool = pool_ptr + req * pool_stride
            res_pos = 0
            pool_pos = 0
            for s in range(0, K, BLOCK):
                m, ids, q, p = _pool_tile(pool, q_row, row, s, offs, K, V)
                r = tl.maximum(p - q, 0.0)
                res_pos += tl.sum(((r > 0) & m).to(tl.int32), axis=0)
                pool_pos += tl.sum(((p > 0) & m).to(tl.int32), axis=0)
            has_mass = res_pos > 0
            if res_pos == 0:
                row_pos = 0
                for s in range(0, V, BLOCK):
                    idx = s + offs
                    p = tl.load(row + idx, mask=idx < V, other=0.0)
                    row_pos += tl.sum((p > 0).to(tl.int32), axis=0)
                has_mass = row_pos > pool_pos
            if has_mass:
                for s in range(0, K, BLOCK):
                    m, ids, q, p = _pool_tile(pool, q_row, row, s, offs, K, V)
                    tl.store(row + ids, tl.maximum(p - q, 0.0), mask=m)
    # The scatter's writes must be visible to every thread of the passes below.
    tl.debug_barrier()

    # The residual the passes below read from the row: row 0 subtracts q_first on the
    # fly, point mass drops d_j; pool rows (already written) and row n use the row as is.
    sub_first = rejected & (j == 0)
    q_first_row = q_first_ptr + req * V

    # 3. Total mass of the residual, summed as the scan sums; p's (the fallback) only
    # when the residual has none.
    total = 0.0
    for s in range(0, V, BLOCK):
        idx = s + offs
        m = idx < V
        p = tl.load(row + idx, mask=m, other=0.0)
        r = _residual(p, q_first_row, idx, m, sub_first, rejected, d_j, POINT_MASS)
        total = tl.max(tl.cumsum(r, axis=0) + total, axis=0)
    use_r = total > 0
    if total == 0:
        for s in range(0, V, BLOCK):
            idx = s + offs
            p = tl.load(row + idx, mask=idx < V, other=0.0)
            total = tl.max(tl.cumsum(p, axis=0) + total, axis=0)
    thr = tl.load(u_final_ptr + req) * total

    # 4. Inverse CDF: the first index whose running sum exceeds thr, clamped to V-1.
    # Without use_r both flags are off and the weights are p itself.
    nxt = V - 1
    carry = 0.0
    s = 0
    searching = True
    while searching & (s < V):
        idx = s + offs
        m = idx < V
        p = tl.load(row + idx, mask=m, other=0.0)
        w = _residual(p, q_first_row, idx, m, sub_first & use_r, rejected & use_r, d_j, POINT_MASS)
        cdf = tl.cumsum(w, axis=0) + carry
        first = tl.min(tl.where((cdf > thr) & m, idx, V), axis=0)
        searching = first == V
        nxt = tl.minimum(nxt, first)
        carry = tl.max(cdf, axis=0)
        s += BLOCK

    tl.store(accepted_ptr + req, j.to(tl.int64))
    tl.store(next_ptr + req, nxt.to(tl.int64))


def _misaligned(t: torch.Tensor) -> bool:
    """Whether a view starts off a 16-byte boundary of its storage (the caching allocator
    aligns every block it hands out). Read from the view's metadata, never its address:
    fake tensors have none."""
    return (t.storage_offset() * t.element_size()) % 16 != 0


def _tiles_aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` as the kernel's tile loads want it: contiguous and 16-byte aligned (a copy when
    it is not)."""
    t = t.contiguous()
    return t.clone() if _misaligned(t) else t


def _check_shape(name: str, t: torch.Tensor, expected: tuple) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def accept_chain(draft_tokens: torch.Tensor, q_draft: Optional[torch.Tensor], q_first: Optional[torch.Tensor],
                 pool_ids: Optional[torch.Tensor], q_rest: Optional[torch.Tensor], target_probs: torch.Tensor,
                 uniforms: Uniforms, *, block: int = DEFAULT_BLOCK, num_warps: int = 8
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain acceptance of `draft_tokens` [b, n] against `target_probs` [b, n+1, V] (fp32,
    contiguous, CLOBBERED: the residual of a rejected pool row is written into it).

    q: `q_draft` [b, n] = q_k(d_k); `q_first` [b, V] = q_0; `pool_ids` [b, K] (unique)
    and `q_rest` [b, n-1, K] = q_k on the pool for k >= 1 (both may be None when n = 1).
    All four None: point-mass (greedy) draft. `uniforms`: steps [b, n], final [b].
    `block` (a power of two) is the vocabulary / pool tile of one step.

    Returns (accepted [b] int64, next [b] int64), equal to
    `accept_probs(draft_tokens, densify_q(q_first, pool_ids, q_rest, V), target_probs,
    uniforms=uniforms)` (point-mass: draft_probs None)."""
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens: expected shape (b, n), got {tuple(draft_tokens.shape)}")
    b, n = draft_tokens.shape
    if n < 1:
        raise ValueError(f"draft_tokens: expected n >= 1 drafts, got shape {tuple(draft_tokens.shape)}")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs: expected shape ({b}, {n + 1}, V), got {tuple(target_probs.shape)}")
    V = target_probs.shape[-1]
    _check_shape("target_probs", target_probs, (b, n + 1, V))
    if target_probs.dtype != torch.float32 or not target_probs.is_contiguous():
        raise ValueError(f"target_probs: expected contiguous float32 (it is written in place), "
                         f"got {target_probs.dtype}{'' if target_probs.is_contiguous() else ', non-contiguous'}")
    _check_shape("uniforms.steps", uniforms.steps, (b, n))
    _check_shape("uniforms.final", uniforms.final, (b,))
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: expected a power of two, got {block}")
    device = target_probs.device

    point_mass = q_draft is None
    if point_mass:
        named = (("q_first", q_first), ("pool_ids", pool_ids), ("q_rest", q_rest))
        given = [name for name, t in named if t is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: expected None in point-mass mode (q_draft is None)")
        K = 0
    else:
        _check_shape("q_draft", q_draft, (b, n))
        if q_first is None:
            raise ValueError(f"q_first: expected shape {(b, V)}, got None")
        _check_shape("q_first", q_first, (b, V))
        if (pool_ids is None) != (q_rest is None) or (pool_ids is None and n > 1):
            missing = "pool_ids" if pool_ids is None else "q_rest"
            raise ValueError(f"{missing}: expected a tensor (pool_ids [b, K] and q_rest [b, n-1, K] go together"
                             f" and are needed when n > 1), got None")
        if pool_ids is None:
            K = 0
        else:
            if pool_ids.dim() != 2:
                raise ValueError(f"pool_ids: expected shape ({b}, K), got {tuple(pool_ids.shape)}")
            K = pool_ids.shape[1]
            _check_shape("pool_ids", pool_ids, (b, K))
            if K > V:
                raise ValueError(f"pool_ids: expected at most V={V} (unique) ids per request, got shape "
                                 f"{tuple(pool_ids.shape)}")
            _check_shape("q_rest", q_rest, (b, n - 1, K))

    draft = draft_tokens.to(device=device, dtype=torch.int64).contiguous()
    u_steps = uniforms.steps.to(device=device, dtype=torch.float32).contiguous()
    u_final = uniforms.final.to(device=device, dtype=torch.float32).contiguous()
    accepted = torch.empty(b, dtype=torch.int64, device=device)
    nxt = torch.empty(b, dtype=torch.int64, device=device)
    if b == 0:
        return accepted, nxt
    f32 = dict(device=device, dtype=torch.float32)
    # Pointers a program does not read still take part in the variant's key: fresh
    # (aligned) placeholders of the right dtype, so no caller's view changes it.
    if point_mass:
        q_d = q_f = q_r = torch.empty(1, **f32)   # unused by the POINT_MASS program
        pool = torch.empty(1, dtype=torch.int64, device=device)
    else:
        q_d = q_draft.to(**f32).contiguous()
        q_f = _tiles_aligned(q_first.to(**f32))
        if n > 1:
            pool = pool_ids.to(device=device, dtype=torch.int64)
            if pool.stride(-1) != 1 or _misaligned(pool):
                pool = _tiles_aligned(pool)   # arange(V).expand(b, V) keeps its stride-0 rows
            q_r = _tiles_aligned(q_rest.to(**f32))
        else:                               # unused: no pool row when n = 1 (q_rest may be empty)
            pool, q_r = torch.empty(1, dtype=torch.int64, device=device), torch.empty(1, **f32)
    probs = _tiles_aligned(target_probs)     # a copy only for a misaligned view (it is clobbered anyway)
    _chain_accept_kernel[(b,)](draft, q_d, q_f, pool, q_r, probs, u_steps, u_final, accepted, nxt,
                               n, V, K, pool.stride(0), POINT_MASS=point_mass, BLOCK=block, num_warps=num_warps)
    return accepted, nxt


def densify_q(q_first: torch.Tensor, pool_ids: Optional[torch.Tensor], q_rest: Optional[torch.Tensor],
              V: int) -> torch.Tensor:
    """The dense q [b, n, V] of the compact layout (0 off the pool): what the reference
    `accept_probs` takes as draft_probs."""
    b = q_first.shape[0]
    _check_shape("q_first", q_first, (b, V))
    rest = 0 if q_rest is None else q_rest.shape[1]
    q = torch.zeros(b, 1 + rest, V, dtype=torch.float32, device=q_first.device)
    q[:, 0] = q_first
    if rest:
        q[:, 1:].scatter_(2, pool_ids[:, None, :].expand(b, rest, -1).long(), q_rest.float())
    return q
