"""PyTorch references for SGLang 0.5.23's gated delta-net (GDN) ReplaySSM speculative-verify
kernels: the rollback of a GDN target's recurrent state without a full state per drafted
position. Each public function here has the signature of the upstream entry point it
stands in for, so a later step can install it as the CPU replacement; each is held equal to
the Triton kernel (run under the Triton interpreter) in `tests/sglang/cpu/test_gdn_replay.py`.
All state math is float32; what the kernels round to a buffer's dtype is rounded here too.

Paths below are in the 0.5.23 wheel, under `sglang/kernels/ops/attention/linear/`
(`decode.py` = `gdn_replayssm_spec_decode.py`, `fold.py` = `gdn_replayssm_spec_fold.py`,
`recurrent.py` = `fused_sigmoid_gating_recurrent.py`).

The gated delta rule, per token t and value head (state S [V, K], k L2-normalised, q
L2-normalised and scaled): S <- exp(g_t) S;  d_t = beta_t (v_t - S k_t);  S <- S + d_t k_t^T;
o_t = S q_t, with g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b). Unrolled over
a window from a start state S0 (G = inclusive cumsum of g):
    S_i = exp(G_i) S0 + sum_{j <= i} exp(G_i - G_j) d_j k_j^T.
ReplaySSM keeps S0 (the "checkpoint", the pool's `temporal`) and the per-token records
(d_j, k_j, g_j) of committed tokens in a per-request ring, instead of S after every draft.

Two protocols exist upstream; 0.5.23 wires only the first for GDN
(`srt/mem_cache/memory_pool.py:675`: `replayssm_spec_fold = spec flag and is_kda`):

1. Compact circular ring (GDN, `--enable-linear-replayssm-spec`). Per request row r (the
   req-pool index): rings d [HV, L, V], k [H, L, K] (normalised keys), g [HV, L] fp32, and,
   when the ring dtype is not fp32, the low parts of d and k (`replayssm_rawv`/`rawk`);
   cursors write_pos[r] (committed records since the checkpoint), cache_base[r] (ring start),
   is_flush[r]. The live state = checkpoint folded through write_pos records from cache_base.
   * `gdn_replayssm_spec_decode` (decode.py:1068; kernels decode.py:53 and :483): the verify.
     launch_mode "verify" (what `GDNAttnBackend._replayssm_target_verify`,
     `srt/layers/attention/linear/gdn_backend.py:1441`, uses): for each non-flush row,
     the outputs of the whole window from the checkpoint, the history records and the
     window's own tokens, via the chunked form d = (I + A)^{-1} r, A_ij = beta_i
     exp(G_i - G_j) k_i.k_j (i > j), r_i = beta_i (v_i - exp(G_i) S_w k_i), S_w the
     state at the window start; the window's records (d hi/lo, normalised k hi/lo, g) go
     to ring positions write_pos + s, where write_pos + s < L. No state is written. A row
     whose mamba slot is the null sentinel gets zero output; a flush row is skipped.
     "flush" (and "both") first replays, for flush rows, the raw records (raw v, raw k,
     g, beta: the exact-raw layout, buffers `rawv/rawk/beta`) token by token into the
     checkpoint (decode.py:483), then computes those rows' outputs with no history.
     (0.5.23's GDN pool allocates no beta ring, so only "verify" is reachable there: the
     commit below materialises flagged rows and clears the flag before the next verify.)
   * `commit_gdn_replayssm_spec` (decode.py:1234; kernel :813): advance the cursors by
     the accepted count n (bonus included): write_pos += n (on a row still flagged:
     write_pos = n, and cache_base += write_pos when n > 0), then flag the row for materialisation when write_pos +
     2 * max_spec_len > L (or write_pos > 0 with `fold_every_commit`, which
     `spec_utils.commit_mamba_states_after_verify` sets for non-fp32 checkpoints).
     Rejected drafts cost nothing: their records lie past write_pos and are overwritten.
   * `commit_gdn_replayssm_circular` (decode.py:1269; kernels :598 and :773), all layers at
     once: for flagged rows, checkpoint <- exp(sum g) checkpoint + sum_t exp(sum_{u>t} g_u)
     d_t k_t^T over the write_pos records (d and k as hi + lo), then cache_base += write_pos,
     write_pos = 0, flag cleared; for radix-track rows, the state after the track step
     (write_pos - n + step + 1 records) to the track slot, leaving the live row alone.
   Both are called from `srt/speculative/spec_utils.py:1083-1158`
   (`commit_mamba_states_after_verify`), followed by the usual conv-window scatter.

2. Fold-every-commit (raw ring, keyed by the mamba slot; GDN branch present upstream but
   unreachable in 0.5.23): the ordinary recurrent verify runs with `cache_ring=True`
   (recurrent.py:370-432: raw v, pre-norm k, g, beta of step t < L of the window stored at
   ring position t; outputs as usual, no per-position states), and the commit replays the
   accepted prefix into the checkpoint (`commit_gdn_replayssm_fold_all_layers`, fold.py:145,
   kernel :19; `commit_gdn_replayssm_fold_after_verify`, fold.py:220, adds the conv scatter).

Conv state: no replay. Both protocols keep 0.5.23's per-position conv windows
(`intermediate_conv_window`) and roll back with `fused_conv_window_scatter_with_mask`
(`kernels/ops/mamba/mamba_state_scatter_triton.py:487`, CUDA/XPU only), mirrored here.

Null sentinel: SGLang passes `null_block_id=-1`; a slot index <= null_block_id is a padded row.

This module holds the shared pieces and the verify (`gdn_replayssm_spec_decode`); the commits,
the fold-every-commit protocol and the conv-window scatter are `gdn_replay_commit.py`.
"""

from __future__ import annotations

from typing import Optional

import torch

SOFTPLUS_THRESHOLD = 20.0
NORM_EPS = 1e-6


# ---------------------------------------------------------------------------
# Shared pieces.
# ---------------------------------------------------------------------------
def compute_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                  softplus_beta: float = 1.0, softplus_threshold: float = SOFTPLUS_THRESHOLD):
    """(g, beta) float32 in the kernels' exact form: log(1 + exp(x)) below the threshold (not
    log1p) and beta = 1 / (1 + exp(-b)), so the fp32 values match what the rings store."""
    x = a.float() + dt_bias.float()
    bx = softplus_beta * x
    softplus = torch.where(bx <= softplus_threshold, torch.log(1.0 + torch.exp(bx)) / softplus_beta, x)
    return -torch.exp(A_log.float()) * softplus, 1.0 / (1.0 + torch.exp(-b.float()))


def normalise_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the last dim, division form with eps inside the sqrt, as the kernels do."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def expand_heads(x: torch.Tensor, num_v_heads: int, dim: int) -> torch.Tensor:
    """Key-head tensors to value heads: value head hv reads key head hv // (HV / H)."""
    ratio = num_v_heads // x.shape[dim]
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=dim)


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to dtype and back to float32 (a kernel storing or casting to dtype)."""
    return x.to(dtype).float()


def pad_windows(query_start_loc: torch.Tensor):
    """Packed varlen windows as a padded [B, S] grid: token index (clamped to the row's first
    token on padding lanes, as the kernel clamps) and the valid-lane mask."""
    bounds = query_start_loc.long()
    bos, lens = bounds[:-1], bounds[1:] - bounds[:-1]
    width = int(lens.max()) if lens.numel() else 0
    lanes = torch.arange(width)
    valid = lanes[None, :] < lens[:, None]
    tokens = torch.where(valid, bos[:, None] + lanes[None, :], bos[:, None])
    return tokens, valid


def step_delta_rule(state: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor) -> torch.Tensor:
    """One gated delta-rule step, in the recurrent kernel's op order. state [..., V, K] fp32,
    k [..., K] (normalised), v [..., V], g and beta [...] -> the new state."""
    state = state * torch.exp(g)[..., None, None]
    update = (v - (state * k[..., None, :]).sum(-1)) * beta[..., None]
    return state + update[..., :, None] * k[..., None, :]


# ---------------------------------------------------------------------------
# Protocol 1, verify: decode.py gdn_replayssm_spec_decode.
# ---------------------------------------------------------------------------
def fold_raw_history(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, ssm_state_indices,
                     replay_indices, write_pos, cache_base, is_flush, max_cache_len: int,
                     use_qk_l2norm_in_kernel: bool, null_block_id: int) -> None:
    """decode.py:483 `gdn_replayssm_exact_fold_kernel`: on flush rows with write_pos > 0, the
    write_pos raw records from cache_base replayed token by token into the checkpoint."""
    slots, rows = ssm_state_indices.long(), replay_indices.long()
    active = slots > null_block_id
    rows_safe = torch.where(active, rows, 0)
    counts = torch.where(active & (is_flush[rows_safe] != 0), write_pos[rows_safe].long(), 0)
    active = counts > 0
    if not bool(active.any()):
        return
    slots, rows, counts = slots[active], rows[active], counts[active]
    base = cache_base[rows].long()
    num_v_heads = checkpoint_state.shape[1]
    state = checkpoint_state[slots].float()
    for t in range(int(counts.max())):
        phys = (base + t) & (max_cache_len - 1)
        k = expand_heads(rawk_cache[rows, :, phys].float(), num_v_heads, 1)   # [n, HV, K]
        if use_qk_l2norm_in_kernel:
            k = normalise_rows(k)
        stepped = step_delta_rule(state, k, rawv_cache[rows, :, phys].float(), g_cache[rows, :, phys].float(),
                                  beta_cache[rows, :, phys].float())
        state = torch.where((t < counts)[:, None, None, None], stepped, state)
    checkpoint_state[slots] = state.to(checkpoint_state.dtype)


def invert_unit_lower(a_mat: torch.Tensor) -> torch.Tensor:
    """(I + A)^{-1} for strictly lower-triangular A [..., S, S]."""
    eye = torch.eye(a_mat.shape[-1], dtype=a_mat.dtype).expand_as(a_mat)
    return torch.linalg.solve_triangular(eye + a_mat, eye, upper=False, unitriangular=True)


def verify_rows(q, k, v, a, b, A_log, dt_bias, out, checkpoint_state, d_cache, k_cache, g_cache, rawv_cache,
                rawk_cache, beta_cache, query_start_loc, ssm_state_indices, replay_indices, write_pos, cache_base,
                is_flush, scale: float, max_cache_len: int, use_qk_l2norm_in_kernel: bool, flush_pass: bool,
                null_block_id: int) -> None:
    """decode.py:53 `gdn_replayssm_spec_circular_kernel` for every row at once (flush_pass =
    its IS_FLUSH variant): window outputs to `out`, window records to the rings."""
    HV = v.shape[1]
    L = max_cache_len
    state_fp32 = checkpoint_state.dtype == torch.float32
    exact_raw = rawv_cache is not None and rawk_cache is not None and beta_cache is not None
    residual = rawv_cache is not None and rawk_cache is not None and beta_cache is None
    k_residual_on = residual and not state_fp32   # the kernel folds k's low part only then

    tokens, valid = pad_windows(query_start_loc)                        # [B, S]
    slots, rows = ssm_state_indices.long(), replay_indices.long()
    live = slots > null_block_id
    rows_safe = torch.where(live, rows, 0)
    flushing = is_flush[rows_safe] != 0
    if not flush_pass:
        # padded rows read as zeros; flush rows are the flush pass's business
        dead = ~live
        if bool(dead.any()) and tokens.shape[1]:
            out[tokens[dead][valid[dead]]] = 0
        active = live & ~flushing
    else:
        active = live & flushing
    if not bool(active.any()) or tokens.shape[1] == 0:
        return
    tokens, valid, slots, rows = tokens[active], valid[active], slots[active], rows[active]
    n, S = tokens.shape
    mask = valid.float()

    # gates and per-window cumulative decay (padding lanes: g = beta = 0)
    g_s, beta_s = compute_gates(a[tokens], b[tokens], A_log, dt_bias)    # [n, S, HV]
    g_s, beta_s = g_s * mask[..., None], beta_s * mask[..., None]
    G = torch.cumsum(g_s, dim=1)

    # normalised q/k; the dtype each takes into the dots follows the checkpoint dtype
    q_raw, k_raw = q[tokens].float(), k[tokens].float()                # [n, S, H, K]
    if use_qk_l2norm_in_kernel:
        q_rn = 1.0 / torch.sqrt((q_raw * q_raw).sum(-1, keepdim=True) + NORM_EPS)
        k_rn = 1.0 / torch.sqrt((k_raw * k_raw).sum(-1, keepdim=True) + NORM_EPS)
    else:
        q_rn = k_rn = torch.ones_like(q_raw[..., :1])
    q_precise = q_raw * (q_rn * scale) * mask[..., None, None]
    k_precise = k_raw * k_rn * mask[..., None, None]
    k_store = k_precise.to(k_cache.dtype)
    k_low = (k_precise - k_store.float()).to(k.dtype)
    if state_fp32:
        q_dot, k_dot = q_precise, k_precise
    else:
        q_dot, k_dot = round_to(q_precise, q.dtype), k_store.float()
    qv, kv = expand_heads(q_dot, HV, 2), expand_heads(k_dot, HV, 2)     # [n, S, HV, K]
    k_low_v = expand_heads(k_low.float(), HV, 2)

    # checkpoint projections (a 16-bit checkpoint enters the dots in the key-ring dtype)
    ckpt = checkpoint_state[slots].float() if state_fp32 else round_to(checkpoint_state[slots], k_cache.dtype)
    hw_q = torch.einsum("nhvk,nshk->nhvs", ckpt, qv)
    hw_k = torch.einsum("nhvk,nshk->nhvs", ckpt, kv)
    kk = torch.einsum("nihk,njhk->nhij", kv, kv)
    kq = torch.einsum("nihk,njhk->nhij", kv, qv)
    if k_residual_on:
        hw_k = hw_k + torch.einsum("nhvk,nshk->nhvs", ckpt, k_low_v)
        kk = kk + (torch.einsum("nihk,njhk->nhij", kv, k_low_v) + torch.einsum("nihk,njhk->nhij", k_low_v, kv)
                   + torch.einsum("nihk,njhk->nhij", k_low_v, k_low_v))
        kq = kq + torch.einsum("nihk,njhk->nhij", k_low_v, qv)

    wp = write_pos[rows].long()
    base = cache_base[rows].long()
    if not flush_pass:
        hw_q, hw_k = add_history(hw_q, hw_k, qv, kv, d_cache, k_cache, g_cache, rows, wp, base, L, state_fp32)

    # intra-window: d = (I + A)^{-1} r, then o_j = exp(G_j) S_w q_j + sum_{i<=j} exp(G_j - G_i) (k_i.q_j) d_i
    lanes = torch.arange(S)
    pair = valid[:, :, None] & valid[:, None, :]                        # [n, i, j]
    Gh, betah = G.transpose(1, 2), beta_s.transpose(1, 2)              # [n, HV, S]
    lower = (lanes[:, None] > lanes[None, :]) & pair
    a_mat = torch.where(lower[:, None], betah[..., :, None] * torch.exp(Gh[..., :, None] - Gh[..., None, :]) * kk,
                        torch.zeros(()))
    t_mat = invert_unit_lower(a_mat)
    v_win = v[tokens].float() * mask[..., None, None]                  # [n, S, HV, V]
    r_mat = betah[:, :, None, :] * (v_win.permute(0, 2, 3, 1) - torch.exp(Gh)[:, :, None, :] * hw_k)  # [n, HV, V, S]
    d_spec = torch.einsum("nhvj,nhij->nhvi", r_mat, t_mat)
    causal = (lanes[:, None] <= lanes[None, :]) & pair
    f_mat = torch.where(causal[:, None], torch.exp(Gh[..., None, :] - Gh[..., :, None]) * kq, torch.zeros(()))
    o_win = torch.exp(Gh)[:, :, None, :] * hw_q + torch.einsum("nhvi,nhij->nhvj", d_spec, f_mat)
    out[tokens[valid]] = o_win.permute(0, 3, 1, 2)[valid].to(out.dtype)

    store_window(d_spec, k_store, k_low, k_raw, v_win, g_s, beta_s, valid, rows, wp, base, L, d_cache, k_cache,
                 g_cache, rawv_cache, rawk_cache, beta_cache, exact_raw, residual)


def add_history(hw_q, hw_k, qv, kv, d_cache, k_cache, g_cache, rows, wp, base, L: int, state_fp32: bool):
    """Project the committed history onto the window: S_w = exp(sum g) S0 + sum_c exp(sum_{u>c}
    g_u) d_c k_c^T, read from the wp records at ring positions base + c (hi parts only)."""
    HV = g_cache.shape[1]
    c = torch.arange(L)
    hist = c[None, :] < wp[:, None]                                      # [n, L]
    phys = (base[:, None] + c[None, :]) & (L - 1)
    r = rows[:, None]
    g_hist = torch.where(hist[:, None, :], g_cache[r, :, phys].float().transpose(1, 2), torch.zeros(()))  # [n, HV, L]
    prefix = torch.cumsum(g_hist, dim=-1)
    total = g_hist.sum(-1)
    decay = torch.where(hist[:, None, :], torch.exp(total[..., None] - prefix), torch.zeros(()))
    d_hist = torch.where(hist[:, :, None, None], d_cache[r, :, phys].float(), torch.zeros(()))  # [n, L, HV, V]
    d_scaled = d_hist.permute(0, 2, 3, 1) * decay[:, :, None, :]         # [n, HV, V, L]
    k_hist = torch.where(hist[:, :, None, None], k_cache[r, :, phys].float(), torch.zeros(()))  # [n, L, H, K]
    k_hist = expand_heads(k_hist, HV, 2)
    scores_q = torch.einsum("nchk,nshk->nhcs", k_hist, qv)
    scores_k = torch.einsum("nchk,nshk->nhcs", k_hist, kv)
    if not state_fp32:
        # a 16-bit checkpoint's history dot runs in the d ring's dtype
        d_scaled = round_to(d_scaled, d_cache.dtype)
        scores_q, scores_k = round_to(scores_q, d_cache.dtype), round_to(scores_k, d_cache.dtype)
    total_decay = torch.exp(total)[:, :, None, None]
    hw_q = total_decay * hw_q + torch.einsum("nhvc,nhcs->nhvs", d_scaled, scores_q)
    hw_k = total_decay * hw_k + torch.einsum("nhvc,nhcs->nhvs", d_scaled, scores_k)
    return hw_q, hw_k


def store_window(d_spec, k_store, k_low, k_raw, v_win, g_s, beta_s, valid, rows, wp, base, L: int, d_cache, k_cache,
                 g_cache, rawv_cache, rawk_cache, beta_cache, exact_raw: bool, residual: bool) -> None:
    """Write lane s's records at ring position base + wp + s, for lanes with wp + s < L (a
    window past the ring end would otherwise overwrite committed history)."""
    S = valid.shape[1]
    lanes = torch.arange(S)
    keep = valid & ((wp[:, None] + lanes[None, :]) < L)
    if not bool(keep.any()):
        return
    phys = ((base[:, None] + wp[:, None] + lanes[None, :]) & (L - 1))[keep]
    r = rows[:, None].expand(-1, S)[keep]
    d_lanes = d_spec.permute(0, 3, 1, 2)[keep]                            # [m, HV, V]
    d_hi = d_lanes.to(d_cache.dtype)
    d_cache[r, :, phys] = d_hi
    k_cache[r, :, phys] = k_store[keep].to(k_cache.dtype)
    g_cache[r, :, phys] = g_s[keep].to(g_cache.dtype)
    if exact_raw:
        rawv_cache[r, :, phys] = v_win[keep].to(rawv_cache.dtype)
        rawk_cache[r, :, phys] = k_raw[keep].to(rawk_cache.dtype)
        beta_cache[r, :, phys] = beta_s[keep].to(beta_cache.dtype)
    elif residual:
        rawv_cache[r, :, phys] = (d_lanes - d_hi.float()).to(rawv_cache.dtype)
        rawk_cache[r, :, phys] = k_low[keep].to(rawk_cache.dtype)


def gdn_replayssm_spec_decode(q, k, v, a, b, A_log, dt_bias, checkpoint_state, d_cache, k_cache, g_cache,
                              rawv_cache, rawk_cache, beta_cache, out, query_start_loc, ssm_state_indices,
                              replay_indices, write_pos, cache_base, is_flush, max_cache_len: int,
                              max_spec_len: int, scale: Optional[float] = None, use_qk_l2norm_in_kernel: bool = True,
                              null_block_id: int = 0, block_v: int = 64, num_warps: int = 1, num_stages: int = 2,
                              nk: int = 2, bs_min: int = 4, block_v_flush: int = 64, num_warps_flush: int = 1,
                              num_stages_flush: int = 2, nk_flush: int = 2, launch_mode: str = "both",
                              dot_precision: str = "ieee"):
    """Stands in for decode.py:1068 (tiling arguments accepted and ignored). q, k [T, H, K],
    v [T, HV, V], a, b [T, HV] packed by `query_start_loc`; checkpoint [slots, HV, V, K];
    rings keyed by `replay_indices`, checkpoint by `ssm_state_indices`. Returns `out`."""
    if max_cache_len & (max_cache_len - 1):
        raise ValueError(f"circular cache requires power-of-two max_cache_len, got {max_cache_len}")
    if scale is None:
        scale = checkpoint_state.shape[-1] ** -0.5
    common = dict(query_start_loc=query_start_loc, ssm_state_indices=ssm_state_indices,
                  replay_indices=replay_indices, write_pos=write_pos, cache_base=cache_base, is_flush=is_flush)
    if launch_mode in ("both", "flush"):
        if rawv_cache is None or rawk_cache is None or beta_cache is None:
            raise ValueError("raw replay buffers are required for exact-fold launch")
        fold_raw_history(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, ssm_state_indices,
                         replay_indices, write_pos, cache_base, is_flush, max_cache_len, use_qk_l2norm_in_kernel,
                         null_block_id)
    passes = {"both": (False, True), "verify": (False,), "flush": (True,)}[launch_mode]
    for flush_pass in passes:
        verify_rows(q, k, v, a, b, A_log, dt_bias, out, checkpoint_state, d_cache, k_cache, g_cache, rawv_cache,
                    rawk_cache, beta_cache, scale=scale, max_cache_len=max_cache_len,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, flush_pass=flush_pass,
                    null_block_id=null_block_id, **common)
    return out
