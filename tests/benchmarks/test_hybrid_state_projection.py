"""The hybrid-state projection (benchmarks/hybrid_state_projection.py): arithmetic only, no server.

The issue's figures for Qwen3.6-27B (one state ~150 MB, ~77 MB per GPU at TP 2, ~1.2 GB per request at b16,
~39 GB written per verify step at concurrency 32) are rounded; they are checked here within 5 % (per state and
per request) and 10 % (per step, which here also counts the commit copy the issue leaves out)."""

import os

import pytest

from benchmarks import hybrid_state_projection as hsp
from benchmarks.hybrid_state_projection import QWEN3_NEXT_80B, QWEN3_NEXT_80B_FP8, QWEN36_27B

TP = 2


def close(value, target, rel):
    return abs(value - target) <= rel * target


def test_27b_state_matches_the_issue():
    assert QWEN36_27B.gdn_layers == 48 and QWEN36_27B.attn_layers == 16
    assert close(hsp.state_bytes(QWEN36_27B, 1), 150e6, 0.05)  # whole model: 151.0 MB SSM + 2.9 MB conv
    assert close(hsp.state_bytes(QWEN36_27B, TP), 77e6, 0.01)  # 76,972,032 bytes per GPU
    assert hsp.ssm_bytes(QWEN36_27B, TP) == 48 * 24 * 128 * 128 * 4


def test_27b_b16_snapshot_matches_the_issue():
    spec = hsp.spec_reserved_bytes(QWEN36_27B, TP, 16, "snapshot")
    assert close(spec, 1.2e9, 0.05)  # reserved per request per GPU
    verify = 16 * hsp.state_bytes(QWEN36_27B, TP)  # the issue's "written per request per verify step"
    assert close(verify, 1.2e9, 0.05)
    assert close(hsp.written_per_request(QWEN36_27B, TP, 16, "snapshot"), 1.2e9, 0.10)  # + commit copy
    assert close(32 * verify, 39e9, 0.05)
    assert close(hsp.written_per_step(QWEN36_27B, TP, 16, "snapshot", 32), 39e9, 0.10)


@pytest.mark.parametrize("model", [QWEN36_27B, QWEN3_NEXT_80B])
@pytest.mark.parametrize("d", [16, 8])
def test_replay_reserves_about_one_state_plus_a_small_ring(model, d):
    state = hsp.state_bytes(model, TP)
    ring = hsp.ring_bytes(model, TP)
    assert ring < state / 5
    replay = hsp.reserved_bytes(model, TP, d, "replay")
    assert state < replay < 1.35 * state
    assert replay < hsp.reserved_bytes(model, TP, d, "snapshot") / 5
    assert hsp.written_per_request(model, TP, d, "replay") < hsp.written_per_request(model, TP, d, "snapshot") / 5


@pytest.mark.parametrize("model", [QWEN36_27B, QWEN3_NEXT_80B])
def test_b8_halves_the_snapshot_term(model):
    b16, b8 = (hsp.spec_reserved_bytes(model, TP, d, "snapshot") for d in (16, 8))
    assert 0.5 <= b8 / b16 < 0.51  # the SSM part halves exactly; the deduplicated conv windows almost
    assert 8 * hsp.ssm_bytes(model, TP) * 2 == 16 * hsp.ssm_bytes(model, TP)
    w16, w8 = (hsp.written_per_request(model, TP, d, "snapshot") for d in (16, 8))
    assert 0.5 < w8 / w16 < 0.55  # plus the one commit copy


@pytest.mark.parametrize("model", [QWEN36_27B, QWEN3_NEXT_80B_FP8])
@pytest.mark.parametrize("slots", [1, 5])
@pytest.mark.parametrize("d", [16, 8])
def test_the_cap_grows_under_replay(model, slots, d):
    budget = 80 * hsp.GIB * 0.9
    weights, kv = hsp.weight_bytes(model, TP), 8192 * hsp.kv_bytes_per_token(model, TP)
    snapshot, replay = (hsp.concurrency_cap(budget, weights, kv, hsp.reserved_bytes(model, TP, d, x, slots))
                        for x in ("snapshot", "replay"))
    assert 0 < snapshot < replay


def test_the_cap_formula():
    assert hsp.concurrency_cap(100, 40, 5, 10) == 4
    assert hsp.concurrency_cap(100, 100, 5, 10) == 0
    assert hsp.concurrency_cap(100, 120, 5, 10) == 0


def test_weights_and_kv():
    # The public Qwen3-Next-80B-A3B-Instruct checkpoint holds 81,324,862,720 parameters, ~1.65 B of them in the
    # MTP layer, which DFLASH does not load.
    assert close(sum(hsp.param_counts(QWEN3_NEXT_80B).values()), 81_324_862_720 - 1_650_000_000, 0.002)
    assert close(sum(hsp.param_counts(QWEN36_27B).values()), 27.4e9, 0.01)
    assert hsp.weight_bytes(QWEN3_NEXT_80B, TP) > 80 * hsp.GIB * 0.9  # bf16 does not fit at TP 2 on 80 GB
    assert close(hsp.weight_bytes(QWEN3_NEXT_80B_FP8, TP), 40.2e9, 0.01)
    assert hsp.kv_bytes_per_token(QWEN36_27B, TP) == 16 * 2 * 2 * 256 * 2
    assert hsp.kv_bytes_per_token(QWEN3_NEXT_80B, TP) == 12 * 2 * 1 * 256 * 2
    # A dense model streams all its weights (but the embedding table) whatever the batch; a MoE one more with more
    # tokens, up to all experts.
    assert hsp.weight_read_bytes(QWEN36_27B, TP, 16) == hsp.weight_read_bytes(QWEN36_27B, TP, 512)
    small, big = (hsp.weight_read_bytes(QWEN3_NEXT_80B, TP, n) for n in (16, 512))
    assert small < big <= hsp.weight_bytes(QWEN3_NEXT_80B, TP)


def test_ring_length_must_hold_the_window():
    with pytest.raises(ValueError, match="at least D=16"):
        hsp.spec_reserved_bytes(QWEN36_27B, TP, 16, "replay", ring_len=8)
    with pytest.raises(ValueError, match="power of two"):
        hsp.spec_reserved_bytes(QWEN36_27B, TP, 8, "replay", ring_len=24)


@pytest.mark.parametrize("model", [QWEN36_27B, QWEN3_NEXT_80B])
def test_state_and_ring_equal_sglangs_own_accounting(model):
    """The same bytes as 0.5.23's Mamba2CacheParams.mamba_cache_per_req and replayssm_ring_bytes_per_req."""
    torch = pytest.importorskip("torch")
    mamba_utils = pytest.importorskip("sglang.srt.configs.mamba_utils")
    shape = mamba_utils.Mamba2StateShape.create(
        tp_world_size=TP, intermediate_size=model.lin_value_heads * model.lin_value_dim,
        n_groups=model.lin_key_heads, num_heads=model.lin_value_heads, head_dim=model.lin_value_dim,
        state_size=model.lin_key_dim, conv_kernel=model.conv_kernel)
    params = mamba_utils.Mamba2CacheParams(
        shape=shape, layers=list(range(model.gdn_layers)),
        dtype=mamba_utils.Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))
    assert params.mamba_cache_per_req == hsp.state_bytes(model, TP)
    assert params.replayssm_ring_bytes_per_req(16) == hsp.ring_bytes(model, TP, 16)
    assert shape.conv == [(hsp.conv_dim(model, TP), model.conv_kernel - 1)]


def test_the_script_writes_a_labelled_table(tmp_path, capsys):
    out = tmp_path / "projection.md"
    hsp.main(["--out", str(out), "--context-len", "4096"])
    text = out.read_text()
    assert text.startswith("# Projection: arithmetic from the configs, not a measurement")
    assert capsys.readouterr().out == text + "\n"
    for needle in ("| Qwen3.6-27B | 16 | snapshot | 1.29 GB | 1.22 GB |", "context 4096 tokens",
                   "weights do not fit", "not an option of the wheel"):
        assert needle in text


def test_the_committed_table_is_current():
    path = os.path.join(os.path.dirname(hsp.__file__), "results", "hybrid_state_projection.md")
    with open(path) as f:
        assert f.read() == hsp.report(), "rerun: python -m benchmarks.hybrid_state_projection"
