"""Adaptive width-1 steps, end to end, against the way 0.5.23 would run them: two Domino
servers whose decode steps are pinned to widths 1, 1, 1, 16 in turn
(`--speculative-adaptive-config` `pin`). One runs width 1 as this project does by default:
the target's decode path (`decode_step`) with the draft's context written when the draft
next needs it (`draft_context.DeferredContext`). The other runs it through 0.5.23's
speculative step at one token (`decode_step: false`), writing the context after every step
(`defer_context: false`). Greedy requests one at a time give both servers the same steps;
the draft's proposals at every width-16 step depend on the context the width-1 steps
committed, so equal verify counts per request mean the decode step and the late write
leave the draft the context upstream writes. Both give the plain server's tokens."""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.client import HF_PROMPTS, generate_ids
from tests.helpers.servers import spec_args

pytestmark = pytest.mark.sglang_e2e

PIN = [1, 1, 1, 16]


def _serve(models, start, ours: bool) -> tuple[list, list, str]:
    path = os.path.join(start.tmp, f"adaptive-pinned-{int(ours)}.json")
    with open(path, "w") as fh:
        json.dump({"widths": [16, 1], "pin": PIN, "defer_context": ours, "decode_step": ours}, fh)
    args = spec_args(models, "domino", None) + ["--speculative-adaptive", "--speculative-adaptive-config", path]
    server = start(args, f"domino-pinned-{'decode-step' if ours else 'verify-path'}")
    try:
        bodies = [generate_ids(server, ids) for ids in HF_PROMPTS]   # one at a time: the same steps
        return ([b["output_ids"] for b in bodies], [b["meta_info"]["spec_verify_ct"] for b in bodies], server.log())
    finally:
        server.stop()


def test_width_1_decode_steps_with_the_context_written_late_verify_what_upstreams_width_1_verifies(
        models, start, expected):
    ours, our_steps, our_log = _serve(models, start, ours=True)
    upstream, upstream_steps, upstream_log = _serve(models, start, ours=False)
    assert ours == upstream == expected["generate"]
    assert our_steps == upstream_steps
    # width-16 steps accepted drafts (fewer steps than tokens), which read the context
    assert sum(our_steps) < len(HF_PROMPTS) * (len(expected["generate"][0]) - 1), our_steps
    assert "width-1 steps run the target's decode path" in our_log
    assert "write the draft's context every step" not in our_log
    assert "width-1 steps run the target's decode path" not in upstream_log
