"""PyTorch references for the commit side of SGLang 0.5.23's gated delta-net ReplaySSM
kernels: protocol 1's cursors and materialisation (`commit_gdn_replayssm_spec`,
`commit_gdn_replayssm_circular`), protocol 2's verify with a raw ring and its fold
(`fused_sigmoid_gating_delta_rule_update`, `commit_gdn_replayssm_fold_*`), and the conv
window's rollback (`fused_conv_window_scatter_with_mask`). The protocols, the paths in the
wheel and the math are in `gdn_replay.py`'s docstring; each function has the signature of
the upstream entry point it stands in for and is held equal to the Triton kernel in
`tests/sglang/cpu/test_gdn_replay.py`."""

from __future__ import annotations

from typing import Optional

import torch

from sglang_domino.sglang.cpu.hybrid import gdn_ops
from sglang_domino.sglang.cpu.hybrid.gdn_replay import (SOFTPLUS_THRESHOLD, compute_gates, expand_heads,
                                                        normalise_rows, pad_windows, round_to, step_delta_rule)


# ---------------------------------------------------------------------------
# Protocol 1, commit: cursors, then materialisation.
# ---------------------------------------------------------------------------
def commit_gdn_replayssm_spec(write_pos, cache_base, is_flush, num_accepted, replay_indices, max_cache_len: int,
                              max_spec_len: int, fold_every_commit: bool = False,
                              cache_buf_len: Optional[int] = None, null_block_id: int = 0) -> None:
    """Stands in for decode.py:1234 (kernel :813): advance each row's cursors by its accepted
    count (bonus included) and flag the rows whose next window could overrun the ring."""
    if cache_buf_len is None:
        cache_buf_len = max_cache_len
    rows = replay_indices.long()
    valid = rows > null_block_id
    if not bool(valid.any()):
        return
    rows = rows[valid]
    accepted = num_accepted[valid].long()
    wp, base, flushing = write_pos[rows].long(), cache_base[rows].long(), is_flush[rows] != 0
    new_base = torch.where(flushing & (accepted > 0), (base + wp) & (cache_buf_len - 1), base)
    new_wp = torch.where(flushing, accepted, wp + accepted)
    # flagged one window early, so a verify's writes (wp + spec_len <= L) never wrap onto history
    next_flush = new_wp > 0 if fold_every_commit else (new_wp + 2 * max_spec_len) > max_cache_len
    write_pos[rows] = new_wp.to(write_pos.dtype)
    cache_base[rows] = new_base.to(cache_base.dtype)
    is_flush[rows] = next_flush.to(is_flush.dtype)


def materialise_records(old_state, keys, key_low, updates, gates, counts, low_dtype):
    """old [n, HV, V, K] fp32 advanced through the first `counts` of L compact records:
    exp(sum g) old + sum_t exp(sum_{u>t} g_u) d_t k_t^T, the scaled d split into hi + lo in
    the key-ring dtype (as decode.py:598 does before its dots). keys/key_low [n, HV, L, K]."""
    L = gates.shape[-1]
    on = torch.arange(L)[None, :] < counts[:, None]                     # [n, L]
    g = torch.where(on[:, None, :], gates, torch.zeros(()))
    prefix = torch.cumsum(g, dim=-1)
    total = g.sum(-1)
    decay = torch.where(on[:, None, :], torch.exp(total[..., None] - prefix), torch.zeros(()))
    scaled = updates * decay[..., None]                                  # [n, HV, L, V]
    hi = round_to(scaled, low_dtype)
    lo = round_to(scaled - hi, low_dtype)
    delta = torch.einsum("nhtk,nhtv->nhvk", keys, hi) + torch.einsum("nhtk,nhtv->nhvk", keys, lo)
    if key_low is not None:
        delta = delta + torch.einsum("nhtk,nhtv->nhvk", key_low, hi) + torch.einsum("nhtk,nhtv->nhvk", key_low, lo)
    return old_state * torch.exp(total)[..., None, None] + delta


def commit_gdn_replayssm_circular(*, checkpoint_state, d_cache, k_cache, g_cache, d_residual_cache, k_residual_cache,
                                  state_batch_indices, replay_indices, write_pos, cache_base, is_flush, accept_lens,
                                  mamba_track_indices=None, mamba_steps_to_track=None,
                                  null_block_id: int = -1) -> None:
    """Stands in for decode.py:1269 (kernels :598, :773). All layers: checkpoint
    [layers, slots, HV, V, K], rings [layers, rows, heads, L, dim]. Flagged rows fold their
    write_pos records into the checkpoint and reset their cursors; track rows get the state
    after `write_pos - accept_len + step + 1` records in their track slot. `write_pos` must
    already include this step's accepted prefix (`commit_gdn_replayssm_spec` first)."""
    num_layers, _, HV = checkpoint_state.shape[:3]
    L = d_cache.shape[-2]
    slots, rows = state_batch_indices.long(), replay_indices.long()
    live = slots > null_block_id
    if not bool(live.any()):
        return
    has_residual = d_residual_cache is not None and k_residual_cache is not None
    n_history = write_pos[rows[live]].long()
    folding = is_flush[rows[live]] != 0
    tracking = torch.zeros_like(folding)
    if mamba_track_indices is not None and mamba_steps_to_track is not None:
        track_slots = mamba_track_indices[live].long()
        steps = mamba_steps_to_track[live].long()
        tracking = (track_slots > null_block_id) & (steps >= 0)
        track_len = n_history - accept_lens[live].long() + steps + 1
    live_slots, live_rows = slots[live], rows[live]
    phys = (cache_base[live_rows].long()[:, None] + torch.arange(L)[None, :]) & (L - 1)   # [n, L]
    r = live_rows[:, None]
    for layer in range(num_layers):
        if not bool((folding | tracking).any()):
            break
        keys = expand_heads(k_cache[layer][r, :, phys].transpose(1, 2).float(), HV, 1)    # [n, HV, L, K]
        updates = d_cache[layer][r, :, phys].transpose(1, 2).float()                    # [n, HV, L, V]
        key_low = None
        if has_residual:
            key_low = expand_heads(k_residual_cache[layer][r, :, phys].transpose(1, 2).float(), HV, 1)
            updates = updates + d_residual_cache[layer][r, :, phys].transpose(1, 2).float()
        gates = g_cache[layer][r, :, phys].transpose(1, 2).float()                      # [n, HV, L]
        old = checkpoint_state[layer][live_slots].float()
        if bool(folding.any()):
            new = materialise_records(old, keys, key_low, updates, gates, n_history, k_cache.dtype)
            checkpoint_state[layer][live_slots[folding]] = new[folding].to(checkpoint_state.dtype)
        if bool(tracking.any()):
            snap = materialise_records(old, keys, key_low, updates, gates, track_len, k_cache.dtype)
            checkpoint_state[layer][track_slots[tracking]] = snap[tracking].to(checkpoint_state.dtype)
    # the finishing kernel: folded rows start a fresh history after their records
    done = live_rows[folding]
    if done.numel():
        cache_base[done] = ((cache_base[done].long() + write_pos[done].long()) & (L - 1)).to(cache_base.dtype)
        write_pos[done] = 0
        is_flush[done] = 0


# ---------------------------------------------------------------------------
# Protocol 2: raw ring written by the recurrent verify, folded at commit.
# ---------------------------------------------------------------------------
def store_ring_inputs(k, v, a, b, A_log, dt_bias, initial_state_indices, cu_seqlens, replayssm_rawv, replayssm_rawk,
                      replayssm_g, replayssm_beta, softplus_beta: float = 1.0,
                      softplus_threshold: float = SOFTPLUS_THRESHOLD) -> None:
    """recurrent.py:370-432 (the CACHE_RING store, GDN): step t < L of row n's window puts its
    raw v, pre-norm k, g and beta at ring position t of slot initial_state_indices[n] (>= 0).
    k [1, T, H, K], v [1, T, HV, V], a, b [T, HV] (or [1, T, HV]); rings per layer."""
    HV = v.shape[-2]
    L = replayssm_rawv.shape[-2]
    cu = cu_seqlens if cu_seqlens is not None else torch.tensor([0, v.shape[1]])
    tokens, valid = pad_windows(cu)
    slots = initial_state_indices.long()[: tokens.shape[0]]
    keep = valid & (slots[:, None] >= 0) & (torch.arange(tokens.shape[1])[None, :] < L)
    if not bool(keep.any()):
        return
    g, beta = compute_gates(a.reshape(-1, HV), b.reshape(-1, HV), A_log, dt_bias, softplus_beta, softplus_threshold)
    tok = tokens[keep]
    pos = torch.arange(tokens.shape[1])[None, :].expand_as(tokens)[keep]
    slot = slots[:, None].expand_as(tokens)[keep]
    replayssm_rawv[slot, :, pos] = v[0, tok].to(replayssm_rawv.dtype)
    replayssm_rawk[slot, :, pos] = k[0, tok].to(replayssm_rawk.dtype)
    replayssm_g[slot, :, pos] = g[tok]
    replayssm_beta[slot, :, pos] = beta[tok]


def fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                                           initial_state_source, initial_state_indices, scale=None,
                                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, is_kda=False,
                                           lower_bound=None, disable_state_update=False,
                                           intermediate_states_buffer=None, intermediate_state_indices=None,
                                           cache_steps=None, retrieve_parent_token=None, cache_ring=False,
                                           replayssm_rawv=None, replayssm_rawk=None, replayssm_g=None,
                                           replayssm_beta=None, match_cutedsl_decode=False):
    """Stands in for recurrent.py:538 on the GDN linear-chain paths: the recurrence of
    `gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu` (note: it rounds the state to the
    pool's dtype after every token, as decoding stores it; the Triton kernel keeps fp32
    between the tokens of one call) plus, with `cache_ring`, the ring store."""
    if is_kda or lower_bound is not None or match_cutedsl_decode:
        raise NotImplementedError("gdn_replay.fused_sigmoid_gating_delta_rule_update: GDN gate only")
    if cache_ring:
        store_ring_inputs(k, v, a, b, A_log, dt_bias, initial_state_indices, cu_seqlens, replayssm_rawv,
                          replayssm_rawk, replayssm_g, replayssm_beta, softplus_beta, softplus_threshold)
    return gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices, cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, softplus_beta=softplus_beta,
        softplus_threshold=softplus_threshold, scale=scale, disable_state_update=disable_state_update,
        intermediate_states_buffer=intermediate_states_buffer, intermediate_state_indices=intermediate_state_indices,
        cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token)


def commit_gdn_replayssm_fold_all_layers(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache,
                                         ssm_state_indices, accept_lens, max_cache_len: int, num_k_heads: int,
                                         mamba_track_indices=None, mamba_steps_to_track=None,
                                         use_qk_l2norm_in_kernel: bool = True, null_block_id: int = -1) -> None:
    """Stands in for fold.py:145 (kernel :19): for each live row, the first accept_lens[n]
    ring records of its slot (position t = window step t) replayed into the checkpoint, all
    layers; the state after step mamba_steps_to_track[n] also goes to its track slot."""
    num_v_heads = checkpoint_state.shape[2]
    slots = ssm_state_indices.long()
    counts = accept_lens.long()
    live = (slots > null_block_id) & (counts > 0)
    if not bool(live.any()):
        return
    # rows without a track slot get step -1, which no t reaches
    track_slots = torch.full_like(slots, -1)
    track_at = torch.full_like(slots, -1)
    if mamba_track_indices is not None and mamba_steps_to_track is not None:
        track_slots = mamba_track_indices.long()
        track_at = torch.where(track_slots > null_block_id, mamba_steps_to_track.long(), -1)
    slots, counts, track_slots, track_at = slots[live], counts[live], track_slots[live], track_at[live]
    state = checkpoint_state[:, slots].float()                            # [layers, n, HV, V, K]
    for t in range(min(int(counts.max()), max_cache_len)):
        k = expand_heads(rawk_cache[:, slots, :, t].float(), num_v_heads, 2)
        if use_qk_l2norm_in_kernel:
            k = normalise_rows(k)
        stepped = step_delta_rule(state, k, rawv_cache[:, slots, :, t].float(), g_cache[:, slots, :, t].float(),
                                  beta_cache[:, slots, :, t].float())
        state = torch.where((t < counts)[None, :, None, None, None], stepped, state)
        snap = (track_at == t) & (t < counts)
        if bool(snap.any()):
            checkpoint_state[:, track_slots[snap]] = state[:, snap].to(checkpoint_state.dtype)
    checkpoint_state[:, slots] = state.to(checkpoint_state.dtype)


def fused_conv_window_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None) -> None:
    """Stands in for `mamba_state_scatter_triton.py:487` (CUDA/XPU only upstream): conv state
    dst[:, dst_indices[r]] <- window src[:, src_rows[r], step[r]] where step >= 0."""
    gdn_ops._scatter_steps(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def commit_gdn_replayssm_fold_after_verify(*, spec_state, state_batch_indices, accept_lens, last_correct_step_indices,
                                           mamba_track_indices=None, mamba_steps_to_track=None, src_indices_raw=None,
                                           null_block_id: int = -1) -> None:
    """Stands in for fold.py:220: the fold of every layer's accepted window into `temporal`,
    then the conv rollback (and the track slot's window under extra_buffer)."""
    commit_gdn_replayssm_fold_all_layers(
        checkpoint_state=spec_state.temporal, rawv_cache=spec_state.replayssm_rawv,
        rawk_cache=spec_state.replayssm_rawk, g_cache=spec_state.replayssm_g, beta_cache=spec_state.replayssm_beta,
        ssm_state_indices=state_batch_indices, accept_lens=accept_lens,
        max_cache_len=spec_state.replayssm_rawv.shape[-2], num_k_heads=spec_state.replayssm_rawk.shape[2],
        mamba_track_indices=mamba_track_indices, mamba_steps_to_track=mamba_steps_to_track,
        null_block_id=null_block_id)
    for conv, windows in zip(spec_state.conv, spec_state.intermediate_conv_window):
        fused_conv_window_scatter_with_mask(conv, windows, state_batch_indices, last_correct_step_indices,
                                            src_indices_raw)
        if mamba_track_indices is not None and mamba_steps_to_track is not None:
            fused_conv_window_scatter_with_mask(conv, windows, mamba_track_indices, mamba_steps_to_track,
                                                src_indices_raw)
