"""Replay-based state rollback (`--enable-linear-replayssm-spec`) for DFLASH on a hybrid
(gated delta-net + attention) target, served by a real `sglang serve --device cpu`.

One server, with the constant draft of `test_hybrid_cpu.py`: every verify accepts exactly
the run of the constant token the target produces next, so the verify count is known from
the Transformers oracle, at acceptance lengths from 0 to the whole window.

The target is `tiny.build_hybrid_target`'s with a recurrent state that matters: its
delta-net layers barely decay (A_log = -4) and write louder into the residual stream. The
stock tiny target's greedy output does not depend on the recurrent state at all (its
conv windows and attention layers carry it: serving it with the recurrent commit skipped
still matches Transformers), so it cannot check a rollback of that state; this one can.

The server runs with the radix cache off and a ring of 64 records for the 16-token window:
folds are then deferred (a request's records accumulate over several verifies before they
are folded into its checkpoint), so each verify reads committed history from the ring, a
path the radix-cache setting (every commit folds) never takes. No per-position recurrent
state is allocated: 0.5.23's start-up log and the plugin's say so.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.e2e.client import _stream_and_abort
from tests.e2e.test_hybrid_cpu import (CONSTANT_TOKEN, HYBRID_ARGS, MAX_TOKENS, _check_known_acceptance,
                                       _generate_all_at_once, _used_tokens, tie_free_prompts)
from tests.helpers import tiny
from tests.helpers.servers import BASE_ARGS, BLOCK, adaptive_config_file, server_env

pytestmark = pytest.mark.sglang_e2e

RING = 64
# the delta-net layers' recurrent state: slow decay, louder output
A_LOG = -4.0
OUT_SCALE = 4.0


def _remembering_target(path: str):
    """`tiny.build_hybrid_target`'s target with the delta-net layers changed as above, saved
    to `path`; returns the HF model."""
    from sglang_domino.testing import save_tiny_hybrid_target

    return save_tiny_hybrid_target(path, num_layers=len(tiny.HYBRID_LAYERS), full_attention_interval=2, a_log=A_LOG,
                                   linear_out_scale=OUT_SCALE)


@pytest.fixture(scope="module")
def remembering(sglang_tmp):
    root = os.path.join(sglang_tmp, "hybrid-replay")
    paths = {"target": os.path.join(root, "target"), "constant": os.path.join(root, "constant")}
    target = _remembering_target(paths["target"])
    tiny.build_constant_dflash(paths["constant"], target, CONSTANT_TOKEN, BLOCK)
    paths["prompts"], paths["oracle"] = tie_free_prompts(target)
    return paths


def _replay_server(start, remembering, name, ring, *extra):
    args = ["--model-path", remembering["target"], *BASE_ARGS, *HYBRID_ARGS, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", remembering["constant"], "--speculative-dflash-block-size", str(BLOCK),
            "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", str(ring), *extra]
    return start(args, f"hybrid-replay-{name}", env=server_env(start.tmp))


def _no_state_snapshots(log: str, ring: int, window: int) -> str:
    """0.5.23's pool lines and the plugin's: no per-position recurrent state allocated, the
    compact rings instead; returns the plugin's line."""
    assert "intermediate_ssm_state_cache size: 0.00GB" in log
    assert f"GDN ReplaySSM ring buffers allocated (record_len={ring}, fold=False)" in log
    line = re.search(rf"hybrid replay: GDN ReplaySSM verify for DFLASH, ring L={ring} for a {window}-token "
                     r"window .*", log)
    assert line, log[-4000:]
    assert "per-position recurrent states: none (intermediate_ssm 0 bytes" in line.group(0)
    assert "hybrid replay: first commit replayed" in log
    return line.group(0)


def test_replay_rollback_commits_the_accepted_prefix_state(start, remembering):
    server = _replay_server(start, remembering, "tp1", RING, "--disable-radix-cache")
    try:
        _check_known_acceptance(server, remembering, one_at_a_time=True)
        info = server.get("/server_info")
        assert info["enable_linear_replayssm_spec"] is True
        assert info["linear_replayssm_cache_len"] == RING
        line = _no_state_snapshots(server.log(), RING, BLOCK)
        assert f"checkpoint folded when a request's records pass {RING - 2 * BLOCK}" in line
    finally:
        server.stop()


def test_replay_at_tp2_with_b8_the_radix_cache_and_an_abort(start, remembering):
    """`--tp-size 2` (each rank replays its shard of the heads), b8 (the 16-token draft
    block, 8 verified: the ring checked against the 8-token window), the radix cache on (every
    commit folds, so a finished request donates its exact state) and the default ring of 16.
    A request aborted mid-decode leaves no slot behind: 0.5.23's idle check (strict by
    default) would stop the scheduler on a leaked request, KV or state slot, and the batch
    after it would fail."""
    server = _replay_server(start, remembering, "tp2-b8", 16, "--tp-size", "2", "--speculative-num-draft-tokens", "8")
    try:
        _check_known_acceptance(server, remembering, one_at_a_time=False, window=8)
        aborted = {}
        _stream_and_abort(server, aborted)
        chunks, meta = aborted["abort"]
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert 3 <= meta["completion_tokens"] < 1000
        assert _used_tokens(server) == 0
        # the same prompts again, now partly served from the radix cache's donated states
        _check_known_acceptance(server, remembering, one_at_a_time=False, window=8)
        log = server.log()
        assert "every commit (radix cache on)" in _no_state_snapshots(log, 16, 8)
        assert "memory leak detected" not in log
    finally:
        server.stop()


def test_replay_with_adaptive_widths(start, remembering):
    """`--speculative-adaptive`: each step verifies a width of {16, 8, 4, 2, 1} (the constant
    draft's short runs make the narrow ones win), so the ring takes windows of every width;
    the tokens are Transformers' whatever the width. The state pool holds 4 requests
    (`--max-mamba-cache-size 4`, one slot each without the radix cache) of the 16 asked for:
    `/server_info` reports the 4 admitted, and the start-up log says why once."""
    server = _replay_server(start, remembering, "adaptive", 32, "--disable-radix-cache", "--speculative-adaptive",
                            "--speculative-adaptive-config", adaptive_config_file(remembering),
                            "--max-mamba-cache-size", "4")
    try:
        info = server.get("/server_info")
        assert (info["max_running_requests"], info["requested_max_running_requests"]) == (4, 16)
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 4
        for body, want in zip(_generate_all_at_once(server, remembering["prompts"]) +
                              _generate_all_at_once(server, remembering["prompts"][::-1]),
                              remembering["oracle"] + remembering["oracle"][::-1]):
            assert body["output_ids"] == want[:MAX_TOKENS]
        assert _used_tokens(server) == 0
        log = server.log()
        _no_state_snapshots(log, 32, BLOCK)
        assert log.count("sglang-domino: max_running_requests is") == 1
        assert ("sglang-domino: max_running_requests is 4, below the requested 16: capped by the mamba state pool "
                "(max_mamba_cache_size=4, 1 slot per request)") in log
        widths = {int(w) for w in re.findall(r"adaptive verify: width (\d+) first chosen", log)}
        assert len(widths) >= 2 and min(widths) < BLOCK, widths
    finally:
        server.stop()
