"""DFLASH's commit on a gated delta-net target with replay rollback
(`sglang_domino/sglang/serving/hybrid_replay.py`), in process, on 0.5.23's own `MambaPool`s.

Two pools of the same target: one as 0.5.23 builds it for DFLASH (a recurrent state per
verified position, `intermediate_ssm`), one with `--enable-linear-replayssm-spec` (replay
rings, no per-position state). Each round verifies the same window on both (the snapshot
path: `gdn_ops`' recurrent verify writing a state per position; the replay path: the
ReplaySSM verify reading the checkpoint and the ring) and commits the same accepted
prefixes: upstream's `HybridLinearAttnBackend.update_mamba_state_after_mtp_verify` on the
first, this plugin's hook of it on the second. At every acceptance length 0..W-1 drafts
(1..W tokens committed), under both fold policies, the replay pool's live state (its
checkpoint folded through its committed records) equals the snapshot pool's committed
state, the conv states are equal, and with a fold every commit the checkpoint itself is
that state. The CPU kernels are those the `cpu stand-in` group installs (`cpu/hybrid/gdn_replay.py`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_domino.sglang.serving import hybrid_replay
from sglang_domino.sglang.cpu.hybrid import gdn_ops
from sglang_domino.sglang.cpu.hybrid import gdn_replay as ref
from sglang_domino.sglang.cpu.hybrid import gdn_replay_commit as ref_commit

pytestmark = pytest.mark.sglang

H, HV, K, V = 1, 2, 16, 16
LAYERS = [0, 2]
WIDTH = 5                          # verified tokens per request (the bonus token first)
RING = 16                          # L: >= 2 x WIDTH, so folds can be deferred
SLOTS = torch.tensor([2, 0, 3])    # mamba (checkpoint) slot per request
ROWS = torch.tensor([1, 2, 0])     # req-pool row (rings, cursors) per request
POOL_SIZE, ROWS_SIZE = 6, 4


def make_pool(replay: bool):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=H, num_heads=HV,
                                    head_dim=V, state_size=K, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=LAYERS,
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    return MambaPool(size=POOL_SIZE, spec_state_size=ROWS_SIZE, cache_params=params, mamba_layer_ids=LAYERS,
                     device="cpu", speculative_num_draft_tokens=WIDTH, speculative_eagle_topk=1,
                     linear_replayssm_cache_len=RING, enable_linear_replayssm_spec=replay)


def fake_backend(pool):
    """What the commit reads of `HybridLinearAttnBackend` (self) for a batch of SLOTS/ROWS."""
    req_pool = SimpleNamespace(mamba_pool=pool, get_speculative_mamba2_params_all_layers=lambda: pool.mamba_cache,
                               get_mamba_indices=lambda rows: SLOTS)
    linear = SimpleNamespace(req_to_token_pool=req_pool, forward_metadata=SimpleNamespace(mamba_cache_indices=SLOTS),
                             accept_lens_pool=None, _translate_mamba_indices=lambda x: x)
    return SimpleNamespace(linear_attn_backend=linear, _update_ple_state_after_mtp_verify=lambda *args: None)


@pytest.fixture
def cpu_kernels(monkeypatch):
    """The `cpu stand-in` rows of the hybrid replay block, and upstream's snapshot scatter on
    CPU (its `cpu stand-in` row), for this test only."""
    from sglang.kernels.ops.attention.linear import gdn_replayssm_spec_decode as decode
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as scatter
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as backend
    from sglang.srt import runtime_context

    monkeypatch.setattr(decode, "commit_gdn_replayssm_spec", ref_commit.commit_gdn_replayssm_spec)
    monkeypatch.setattr(decode, "commit_gdn_replayssm_circular", ref_commit.commit_gdn_replayssm_circular)
    monkeypatch.setattr(scatter, "fused_conv_window_scatter_with_mask", ref_commit.fused_conv_window_scatter_with_mask)
    monkeypatch.setattr(backend, "scatter_mamba_states_after_mtp_verify", gdn_ops.scatter_mamba_states_after_mtp_verify)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: SimpleNamespace(speculative_num_draft_tokens=WIDTH))
    return backend.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify


def layer_params(gen):
    return [(torch.randn(HV, generator=gen).abs().log(), torch.randn(HV, generator=gen)) for _ in LAYERS]


def verify_both(snap, replay, gen, params):
    """One verify window per layer on both pools: the outputs must agree (the replay verify
    reads the checkpoint and the ring; the snapshot verify the live state)."""
    n = len(SLOTS)
    T = n * WIDTH
    qsl = torch.arange(0, T + 1, WIDTH, dtype=torch.int32)
    scache, rcache = snap.mamba_cache, replay.mamba_cache
    for layer, (A_log, dt_bias) in enumerate(params):
        q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
        v, a, b = torch.randn(T, HV, V, generator=gen), torch.randn(T, HV, generator=gen), torch.randn(T, HV,
                                                                                                       generator=gen)
        want = gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q[None], k[None], v[None], a, b, scache.temporal[layer], SLOTS, cu_seqlens=qsl,
            use_qk_l2norm_in_kernel=True, disable_state_update=True,
            intermediate_states_buffer=scache.intermediate_ssm[layer], intermediate_state_indices=torch.arange(n))
        out = torch.full((T, HV, V), float("nan"))
        ref.gdn_replayssm_spec_decode(
            q, k, v, a, b, A_log, dt_bias, rcache.temporal[layer], rcache.replayssm_d[layer],
            rcache.replayssm_k[layer], rcache.replayssm_g[layer], None, None, None, out, qsl, SLOTS, ROWS,
            replay.replayssm_spec_write_pos, replay.replayssm_cache_base, replay.replayssm_is_flush,
            max_cache_len=RING, max_spec_len=WIDTH, scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
            null_block_id=-1, launch_mode="verify")
        torch.testing.assert_close(out, want.reshape(T, HV, V), atol=3e-5, rtol=3e-5)
        # the conv kernel's per-position windows: the same on both pools
        windows = torch.randn(n, WIDTH, *scache.intermediate_conv_window[0].shape[3:], generator=gen)
        scache.intermediate_conv_window[0][layer, :n] = windows
        rcache.intermediate_conv_window[0][layer, :n] = windows


def live_state(replay):
    """The replay pool's live states: each request's checkpoint folded through its committed
    records (on copies, every row forced to fold)."""
    cache = replay.mamba_cache
    temporal = cache.temporal.clone()
    write_pos, base = replay.replayssm_spec_write_pos.clone(), replay.replayssm_cache_base.clone()
    ref_commit.commit_gdn_replayssm_circular(
        checkpoint_state=temporal, d_cache=cache.replayssm_d, k_cache=cache.replayssm_k, g_cache=cache.replayssm_g,
        d_residual_cache=None, k_residual_cache=None, state_batch_indices=SLOTS, replay_indices=ROWS,
        write_pos=write_pos, cache_base=base, is_flush=torch.ones_like(replay.replayssm_is_flush),
        accept_lens=torch.zeros(len(SLOTS), dtype=torch.int32), null_block_id=-1)
    return temporal[:, SLOTS]


def commit_both(upstream_commit, snap, replay, accepts):
    last = torch.tensor(accepts, dtype=torch.int64)
    upstream_commit(fake_backend(snap), last, None, None, None, req_pool_indices=ROWS)
    hybrid_replay.around_update_mamba_state_after_mtp_verify(
        lambda *a, **k: pytest.fail("a pool with GDN rings went to upstream's commit"),
        fake_backend(replay), last, None, None, None, req_pool_indices=ROWS)


def assert_same_committed_state(snap, replay, fold_every_commit):
    s, r = snap.mamba_cache, replay.mamba_cache
    torch.testing.assert_close(live_state(replay), s.temporal[:, SLOTS], atol=3e-5, rtol=3e-5)
    if fold_every_commit:
        torch.testing.assert_close(r.temporal[:, SLOTS], s.temporal[:, SLOTS], atol=3e-5, rtol=3e-5)
        assert int(replay.replayssm_spec_write_pos[ROWS].abs().sum()) == 0
    torch.testing.assert_close(r.conv[0][:, SLOTS], s.conv[0][:, SLOTS], atol=0, rtol=0)


@pytest.mark.parametrize("fold_every_commit", [False, True], ids=["deferred", "every-commit"])
@pytest.mark.parametrize("accepted", range(WIDTH))
def test_commit_holds_the_accepted_prefix_state_at_every_acceptance_length(cpu_kernels, monkeypatch, accepted,
                                                                           fold_every_commit):
    monkeypatch.setattr(hybrid_replay, "_fold_every_commit", fold_every_commit)
    gen = torch.Generator().manual_seed(100 + accepted)
    snap, replay = make_pool(replay=False), make_pool(replay=True)
    assert replay.mamba_cache.intermediate_ssm is None and snap.mamba_cache.intermediate_ssm is not None
    start = torch.randn(snap.mamba_cache.temporal.shape, generator=gen) * 0.5
    conv = torch.randn(snap.mamba_cache.conv[0].shape, generator=gen)
    for pool in (snap, replay):
        pool.mamba_cache.temporal.copy_(start)
        pool.mamba_cache.conv[0].copy_(conv)
    params = layer_params(gen)
    # warm-up: committed history in the rings (deferred: several rounds before a fold)
    for warm in ([2, 1, 4], [0, 4, 3], [3, 3, 1]):
        verify_both(snap, replay, gen, params)
        commit_both(cpu_kernels, snap, replay, warm)
        assert_same_committed_state(snap, replay, fold_every_commit)
    if not fold_every_commit:
        assert int(replay.replayssm_spec_write_pos[ROWS].max()) > 0  # history left in a ring
    # the tested round: each request accepts a different length, `accepted` for the first
    verify_both(snap, replay, gen, params)
    commit_both(cpu_kernels, snap, replay, [(accepted + i) % WIDTH for i in range(len(SLOTS))])
    assert_same_committed_state(snap, replay, fold_every_commit)
    # the rejected drafts' records are dead: the next round still agrees
    verify_both(snap, replay, gen, params)
    commit_both(cpu_kernels, snap, replay, [1, 0, 4])
    assert_same_committed_state(snap, replay, fold_every_commit)


def test_pool_without_rings_keeps_upstreams_commit():
    calls = []
    snap = make_pool(replay=False)
    last = torch.tensor([0, 1, 2])
    hybrid_replay.around_update_mamba_state_after_mtp_verify(
        lambda *a, **k: calls.append((a, k)), fake_backend(snap), last, None, None, "model", req_pool_indices=ROWS)
    assert len(calls) == 1 and calls[0][0][1] is last and calls[0][1]["req_pool_indices"] is ROWS


def test_replay_reserves_no_per_position_state():
    """What the start-up log reports: bytes the rings take against the snapshots'."""
    snap, replay = make_pool(replay=False), make_pool(replay=True)
    s, r = hybrid_replay.state_memory(snap, WIDTH), hybrid_replay.state_memory(replay, WIDTH)
    assert r["intermediate_ssm_bytes"] == 0 and r["snapshot_bytes"] == s["intermediate_ssm_bytes"] > 0
    # per layer and row: d [HV, L, V] + k [H, L, K] + g [HV, L], fp32
    assert r["ring_bytes"] == len(LAYERS) * (ROWS_SIZE + 1) * (HV * RING * V + H * RING * K + HV * RING) * 4
    assert s["ring_bytes"] == 0


def _configurator(kda=None, gdn=object()):
    return SimpleNamespace(hybrid_kda_config=kda, hybrid_gdn_config=gdn)


@pytest.fixture
def dflash_replay(monkeypatch):
    from sglang.srt import runtime_context

    state = SimpleNamespace(algo="DFLASH", flag=True, ring=32, window=16)
    monkeypatch.setattr(runtime_context, "get_exec", lambda: SimpleNamespace(mamba=SimpleNamespace(
        enable_linear_replayssm_spec=state.flag, linear_replayssm_cache_len=state.ring)))
    monkeypatch.setattr(runtime_context, "get_spec", lambda: SimpleNamespace(
        speculative_algorithm=state.algo, speculative_num_draft_tokens=state.window))
    monkeypatch.setattr(hybrid_replay, "_log_pool", lambda *a: None)
    return state


def test_pool_gate_lifts_the_kda_refusal_for_a_gdn_target_only(dflash_replay):
    seen = []

    def original(self, **kwargs):
        seen.append(self.hybrid_kda_config)
        return "pool"

    cfg = _configurator()
    assert hybrid_replay.around_build_hybrid_req_pool(original, cfg, max_num_reqs=4) == "pool"
    assert seen[-1] is not None and cfg.hybrid_kda_config is None   # read once, restored
    kda = object()
    hybrid_replay.around_build_hybrid_req_pool(original, _configurator(kda=kda), max_num_reqs=4)
    assert seen[-1] is kda                                            # KDA untouched
    hybrid_replay.around_build_hybrid_req_pool(original, _configurator(gdn=None), max_num_reqs=4)
    assert seen[-1] is None                                           # neither: upstream refuses
    dflash_replay.algo = "EAGLE"
    hybrid_replay.around_build_hybrid_req_pool(original, _configurator(), max_num_reqs=4)
    assert seen[-1] is None                                           # not DFLASH: untouched


@pytest.mark.parametrize("ring, window, message", [
    (24, 16, "is not a power of two.*--linear-replayssm-cache-len 32"),
    (8, 16, "shorter than the verify window \\(16 tokens\\).*--linear-replayssm-cache-len 32"),
])
def test_pool_gate_refuses_a_ring_that_cannot_hold_a_window(dflash_replay, ring, window, message):
    dflash_replay.ring, dflash_replay.window = ring, window
    with pytest.raises(ValueError, match=message):
        hybrid_replay.around_build_hybrid_req_pool(lambda *a, **k: pytest.fail("built"), _configurator(),
                                                   max_num_reqs=4)


def test_scheduler_start_installs_only_for_dflash_with_the_flag(monkeypatch):
    from sglang_domino.sglang.seam import hooks

    installed = []
    monkeypatch.setattr(hooks, "install", lambda group: installed.append(group))
    args = dict(speculative_algorithm="DFLASH", enable_linear_replayssm_spec=True, disable_radix_cache=True,
                disaggregation_mode="null")
    monkeypatch.setattr(hybrid_replay, "_fold_every_commit", True)
    assert hooks.install_group(hooks.HYBRID_REPLAY, SimpleNamespace(**args)) and installed == [hooks.HYBRID_REPLAY]
    assert hybrid_replay._fold_every_commit is False                  # radix cache off: deferred folds
    off = SimpleNamespace(**{**args, "enable_linear_replayssm_spec": False})
    assert not hooks.install_group(hooks.HYBRID_REPLAY, off)
    assert not hooks.install_group(hooks.HYBRID_REPLAY, SimpleNamespace(**{**args, "speculative_algorithm": "EAGLE"}))
    with pytest.raises(ValueError, match="PD decode server"):
        hooks.install_group(hooks.HYBRID_REPLAY, SimpleNamespace(**{**args, "disaggregation_mode": "decode"}))
    assert installed == [hooks.HYBRID_REPLAY]
