"""Replay-based state rollback for DFLASH on a gated delta-net (GDN, Qwen3.5) target, opt-in
with 0.5.23's own `--enable-linear-replayssm-spec` (issue 21, part 1).

0.5.23's GDN ReplaySSM speculative verify ("compact circular ring", see
`cpu/hybrid/gdn_replay.py`) keeps, per request, the committed checkpoint (the pool's `temporal`)
and the (d, k, g) records of the tokens committed since, instead of a full recurrent state
per verified position (`intermediate_ssm`, which the pool then does not allocate). The
verify reconstructs the window's outputs from them and writes the window's records past
the committed ones; the commit advances the cursors by the accepted count, so the
rejected drafts' records are simply overwritten next time, and folds a request's records
into its checkpoint when the ring would fill. 0.5.23 wires that for MTP/EAGLE-style
workers (`spec_utils.commit_mamba_states_after_verify`) but not for DFLASH, which it
refuses outright with a non-KDA target. Installed in the schedulers at scheduler start
(`scheduler_start.py`) when the server runs DFLASH with the flag (group
`hooks.HYBRID_REPLAY`):

  * `around_build_hybrid_req_pool` (`KVCacheConfigurator._build_hybrid_req_pool`): the
    "requires a KDA model" refusal lifted for a GDN target, nothing else; the ring length
    checked against the verify window first (a start-up refusal naming the fix), and the
    state memory logged once the pool is built.
  * `around_update_mamba_state_after_mtp_verify` (`HybridLinearAttnBackend`, DFLASH's
    commit): on a pool with the GDN rings, 0.5.23's ReplaySSM commit sequence of
    `spec_utils` (cursors, fold of the flagged rows, conv-window rollback); anything else
    (KDA, no rings) goes to upstream's method unchanged.

The verify needs no hook: `GDNAttnBackend` routes a TARGET_VERIFY to
`_replayssm_target_verify` as soon as the pool has the rings. On CPU the Triton kernels
are replaced by `cpu/hybrid/gdn_replay.py` (rows of the `cpu stand-in` group).

Fold policy: 0.5.23 folds every commit only for a non-fp32 checkpoint. Here every commit
also folds while the radix cache is on: a finished request donates `temporal` to the radix
tree under its full length, and 0.5.23 shortens that length by the unfolded records only
for the decode ring (`replayssm_write_pos`), not for the speculative one; folded, the
donated checkpoint is exactly the committed state. With `--disable-radix-cache` and
L >= 2 x window, folds are deferred as upstream does (L < 2 x window folds every commit).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

PREFIX = "sglang-domino hybrid replay"

# set at scheduler start from the server's arguments (`prepare`)
_fold_every_commit = True
_first_commit_logged = False


def enabled(server_args) -> bool:
    """DFLASH with `--enable-linear-replayssm-spec`."""
    return bool(getattr(server_args, "enable_linear_replayssm_spec", False)) and \
        str(getattr(server_args, "speculative_algorithm", None) or "").upper() == "DFLASH"


def prepare(server_args) -> None:
    """Before the group is installed: refuse what cannot work, naming the fix; the commit's
    folding mode from the server's arguments."""
    global _fold_every_commit
    if str(getattr(server_args, "disaggregation_mode", "null")) == "decode":
        raise ValueError(
            f"{PREFIX}: --enable-linear-replayssm-spec with DFLASH is not wired for a PD decode server yet "
            "(0.5.23's decode request pool for hybrid targets is not checked with the replay rings): drop "
            "--enable-linear-replayssm-spec on the decode server (it then keeps per-position states)")
    _fold_every_commit = not bool(getattr(server_args, "disable_radix_cache", False))


def check_ring(ring_len: int, window: int) -> None:
    """The ring holds a whole verify window past the committed records (power of two: its
    positions wrap with a mask)."""
    if ring_len < 1 or ring_len & (ring_len - 1):
        raise ValueError(
            f"{PREFIX}: --linear-replayssm-cache-len {ring_len} is not a power of two; the GDN replay ring "
            f"wraps with a mask: use --linear-replayssm-cache-len {max(_pow2_at_least(2 * window), 1)}")
    if ring_len < window:
        raise ValueError(
            f"{PREFIX}: --linear-replayssm-cache-len {ring_len} is shorter than the verify window ({window} "
            f"tokens): a verify writes one record per verified token; use --linear-replayssm-cache-len "
            f"{_pow2_at_least(2 * window)} (>= 2 x window defers folds; >= window folds every commit)")


def _pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


# -- the pool: the KDA-only refusal lifted for GDN -------------------------------------------
def around_build_hybrid_req_pool(original, self, *args, **kwargs):
    """0.5.23 refuses DFLASH with the flag unless the target is KDA ("a non-KDA model there
    would scatter a None intermediate_ssm", true of upstream's commit, not of this plugin's,
    `around_update_mamba_state_after_mtp_verify`). For a GDN target the check reads a
    stand-in KDA config for the one call; the configurator's field is restored after it.
    The method reads the field nowhere else but in `gdn or kda` (true either way)."""
    from sglang.srt.runtime_context import get_exec, get_spec

    mamba = get_exec().mamba
    algo = str(get_spec().speculative_algorithm or "").upper()
    if not (mamba.enable_linear_replayssm_spec and algo == "DFLASH" and self.hybrid_kda_config is None
            and self.hybrid_gdn_config is not None):
        return original(self, *args, **kwargs)
    window = int(get_spec().speculative_num_draft_tokens)
    ring_len = int(mamba.linear_replayssm_cache_len)
    check_ring(ring_len, window)
    self.hybrid_kda_config = _GdnForDflash()
    try:
        pool = original(self, *args, **kwargs)
    finally:
        self.hybrid_kda_config = None
    _log_pool(pool, ring_len, window)
    return pool


class _GdnForDflash:
    """Read by 0.5.23's pool builder as "a KDA config is there" for one call; never used."""

    def __repr__(self) -> str:
        return "<sglang-domino: GDN target served by DominoDFlashWorker>"


def state_memory(mamba_pool, window: int) -> dict:
    """Bytes the pool holds for speculative recurrent state: the replay rings (d, k, g and
    low parts), the per-position states actually allocated (`intermediate_ssm`, None under
    replay), and what those would take for the same rows (upstream's shape: layers x
    (rows) x window x the state)."""
    cache = mamba_pool.mamba_cache
    rings = sum(t.numel() * t.element_size() for t in (
        cache.replayssm_d, cache.replayssm_k, cache.replayssm_g, cache.replayssm_rawv, cache.replayssm_rawk,
        cache.replayssm_beta) if t is not None)
    inter = cache.intermediate_ssm
    temporal = cache.temporal
    rows = cache.intermediate_conv_window[0].shape[1]
    snapshot = temporal.shape[0] * rows * int(window) * temporal[0, 0].numel() * temporal.element_size()
    return dict(rows=int(rows), ring_bytes=int(rings),
                intermediate_ssm_bytes=0 if inter is None else int(inter.numel() * inter.element_size()),
                snapshot_bytes=int(snapshot), checkpoint_bytes_per_row=int(temporal[:, 0].numel()
                                                                            * temporal.element_size()))


def _log_pool(req_pool, ring_len: int, window: int) -> None:
    mamba_pool = getattr(req_pool, "mamba_pool", None)
    if mamba_pool is None or getattr(mamba_pool, "replayssm_cache_base", None) is None:
        raise RuntimeError(f"{PREFIX}: 0.5.23's pool allocated no GDN replay rings; cannot serve the flag")
    mem = state_memory(mamba_pool, window)
    if mem["intermediate_ssm_bytes"]:
        raise RuntimeError(f"{PREFIX}: per-position recurrent states were allocated under replay")
    folds = ("every commit (radix cache on)" if _fold_every_commit
             else "every commit (L < 2 x window)" if ring_len < 2 * window else f"when a request's records pass "
             f"{ring_len - 2 * window}")
    logger.info(
        "%s: GDN ReplaySSM verify for DFLASH, ring L=%d for a %d-token window over %d request rows; per-position "
        "recurrent states: none (intermediate_ssm 0 bytes; snapshots would take %d bytes, %d per request row); "
        "replay rings %d bytes (%d per request row); checkpoint folded %s",
        PREFIX, ring_len, window, mem["rows"], mem["snapshot_bytes"], mem["snapshot_bytes"] // mem["rows"],
        mem["ring_bytes"], mem["ring_bytes"] // mem["rows"], folds)


# -- the commit -------------------------------------------------------------------------------
def uses_gdn_replay(mamba_pool) -> bool:
    return (getattr(mamba_pool, "replayssm_cache_base", None) is not None
            and not getattr(mamba_pool, "replayssm_is_kda", False)
            and not getattr(mamba_pool, "replayssm_spec_fold", False))


def around_update_mamba_state_after_mtp_verify(original, self, last_correct_step_indices, mamba_track_indices,
                                               mamba_steps_to_track, model, req_pool_indices=None, **kwargs):
    """DFLASH's commit of the accepted prefix on a pool with GDN replay rings: the sequence
    of 0.5.23's `spec_utils.commit_mamba_states_after_verify` (GDN circular branch), with
    the slot and row indices this method derives (its PP stable-row case included)."""
    backend = self.linear_attn_backend
    req_pool = backend.req_to_token_pool
    mamba_pool = req_pool.mamba_pool
    if not uses_gdn_replay(mamba_pool):
        return original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                        req_pool_indices=req_pool_indices, **kwargs)
    if req_pool_indices is None:
        raise RuntimeError(f"{PREFIX}: the commit needs the batch's req_pool_indices (the ring rows)")
    from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled
    from sglang.srt.runtime_context import get_spec

    bs = last_correct_step_indices.shape[0]
    rows = req_pool_indices[:bs]
    src_indices_raw = rows if pp_spec_stable_rows_enabled() else None
    if mamba_track_indices is not None:
        mamba_track_indices = backend._translate_mamba_indices(mamba_track_indices)
    if src_indices_raw is not None:
        slots = backend._translate_mamba_indices(req_pool.get_mamba_indices(rows))
    else:
        slots = backend.forward_metadata.mamba_cache_indices[:bs]
    commit_accepted_prefix(
        req_pool.get_speculative_mamba2_params_all_layers(), mamba_pool, slots=slots, rows=rows,
        last_correct_step_indices=last_correct_step_indices, max_spec_len=int(get_spec().speculative_num_draft_tokens),
        mamba_track_indices=mamba_track_indices, mamba_steps_to_track=mamba_steps_to_track,
        src_indices_raw=src_indices_raw, fold_every_commit=_fold_every_commit)
    self._update_ple_state_after_mtp_verify(slots, last_correct_step_indices, mamba_track_indices,
                                            mamba_steps_to_track, src_indices_raw)
    global _first_commit_logged
    if not _first_commit_logged:
        _first_commit_logged = True
        logger.info("%s: first commit replayed (%d request(s)): cursors advanced, no per-position state read",
                    PREFIX, int(bs))


def commit_accepted_prefix(spec_state, mamba_pool, *, slots, rows, last_correct_step_indices, max_spec_len: int,
                           mamba_track_indices=None, mamba_steps_to_track=None, src_indices_raw=None,
                           fold_every_commit: bool = True) -> None:
    """0.5.23 `spec_utils.commit_mamba_states_after_verify`, GDN circular branch: the
    cursors advanced by the accepted count (bonus included), the flagged rows' records
    folded into their checkpoints (all layers), the conv windows rolled back to the last
    accepted position. The kernels are looked up in their modules at call time, so the
    CPU replacements (`cpu/hybrid/gdn_replay.py`) serve on CPU."""
    from sglang.kernels.ops.attention.linear import gdn_replayssm_spec_decode as decode
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as scatter

    accept_lens = last_correct_step_indices + 1
    decode.commit_gdn_replayssm_spec(
        write_pos=mamba_pool.replayssm_spec_write_pos, cache_base=mamba_pool.replayssm_cache_base,
        is_flush=mamba_pool.replayssm_is_flush, num_accepted=accept_lens, replay_indices=rows,
        max_cache_len=spec_state.replayssm_d.shape[-2], max_spec_len=int(max_spec_len),
        fold_every_commit=bool(fold_every_commit) or spec_state.temporal.dtype != torch.float32,
        null_block_id=-1)
    decode.commit_gdn_replayssm_circular(
        checkpoint_state=spec_state.temporal, d_cache=spec_state.replayssm_d, k_cache=spec_state.replayssm_k,
        g_cache=spec_state.replayssm_g, d_residual_cache=spec_state.replayssm_rawv,
        k_residual_cache=spec_state.replayssm_rawk, state_batch_indices=slots, replay_indices=rows,
        write_pos=mamba_pool.replayssm_spec_write_pos, cache_base=mamba_pool.replayssm_cache_base,
        is_flush=mamba_pool.replayssm_is_flush, accept_lens=accept_lens, mamba_track_indices=mamba_track_indices,
        mamba_steps_to_track=mamba_steps_to_track, null_block_id=-1)
    for conv, windows in zip(spec_state.conv, spec_state.intermediate_conv_window):
        scatter.fused_conv_window_scatter_with_mask(conv, windows, slots, last_correct_step_indices,
                                                    src_indices_raw)
        if mamba_track_indices is not None:
            scatter.fused_conv_window_scatter_with_mask(conv, windows, mamba_track_indices, mamba_steps_to_track,
                                                        src_indices_raw)
