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
import torch

from tests.e2e.test_hybrid_cpu import CONSTANT_TOKEN, HYBRID_ARGS, _check_known_acceptance, tie_free_prompts
from tests.helpers import tiny
from tests.helpers.servers import BASE_ARGS, BLOCK, server_env

pytestmark = pytest.mark.sglang_e2e

RING = 64
# the delta-net layers' recurrent state: slow decay, louder output
A_LOG = -4.0
OUT_SCALE = 4.0


def _remembering_target(path: str):
    """`tiny.build_hybrid_target` with the delta-net layers changed as above, saved in place
    (the checkpoint's tensors rewritten, its config kept); returns the HF model."""
    from safetensors.torch import load_file, save_file

    target = tiny.build_hybrid_target(path)
    weights_path = os.path.join(path, "model.safetensors")
    weights = load_file(weights_path)
    with torch.no_grad():
        for i, layer in enumerate(target.model.layers):
            if not hasattr(layer, "linear_attn"):
                continue
            layer.linear_attn.A_log.fill_(A_LOG)
            layer.linear_attn.out_proj.weight.mul_(OUT_SCALE)
            prefix = f"model.layers.{i}.linear_attn."
            weights[prefix + "A_log"] = layer.linear_attn.A_log.detach().clone()
            weights[prefix + "out_proj.weight"] = layer.linear_attn.out_proj.weight.detach().clone()
    save_file(weights, weights_path, metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def remembering(sglang_tmp):
    root = os.path.join(sglang_tmp, "hybrid-replay")
    paths = {"target": os.path.join(root, "target"), "constant": os.path.join(root, "constant")}
    target = _remembering_target(paths["target"])
    tiny.build_constant_dflash(paths["constant"], target, CONSTANT_TOKEN, BLOCK)
    paths["prompts"], paths["oracle"] = tie_free_prompts(target)
    return paths


def test_replay_rollback_commits_the_accepted_prefix_state(start, remembering):
    args = ["--model-path", remembering["target"], *BASE_ARGS, *HYBRID_ARGS, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", remembering["constant"], "--speculative-dflash-block-size", str(BLOCK),
            "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", str(RING), "--disable-radix-cache"]
    server = start(args, "hybrid-replay", env=server_env(start.tmp))
    try:
        _check_known_acceptance(server, remembering, one_at_a_time=True)
        info = server.get("/server_info")
        assert info["enable_linear_replayssm_spec"] is True
        assert info["linear_replayssm_cache_len"] == RING
        log = server.log()
        # 0.5.23's own pool lines: no per-position states, compact rings
        assert "intermediate_ssm_state_cache size: 0.00GB" in log
        assert f"GDN ReplaySSM ring buffers allocated (record_len={RING}, fold=False)" in log
        # the plugin's: the replay verify and commit serve DFLASH; the snapshots' bytes not reserved
        line = re.search(rf"hybrid replay: GDN ReplaySSM verify for DFLASH, ring L={RING} for a {BLOCK}-token "
                         r"window .*", log)
        assert line, log[-4000:]
        assert "per-position recurrent states: none (intermediate_ssm 0 bytes" in line.group(0)
        assert f"checkpoint folded when a request's records pass {RING - 2 * BLOCK}" in line.group(0)
        assert "hybrid replay: first commit replayed" in log
    finally:
        server.stop()
