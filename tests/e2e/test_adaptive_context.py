"""Adaptive width-1 steps write the draft's context late (`draft_context.DeferredContext`),
end to end: two Domino servers whose decode steps are pinned to widths 1, 1, 1, 16 in turn
(`--speculative-adaptive-config` `pin`), one writing each width-1 step's context when the
draft next needs it (the default), one after every step as 0.5.23 does. Greedy requests
one at a time give both servers the same steps; the draft's proposals at every width-16
step depend on the context the width-1 steps committed, so equal verify counts per request
mean the deferred context is the one upstream writes. Both give the plain server's tokens."""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.client import HF_PROMPTS, generate_ids
from tests.helpers.servers import spec_args

pytestmark = pytest.mark.sglang_e2e

PIN = [1, 1, 1, 16]


def _serve(models, start, defer: bool) -> tuple[list, list, str]:
    path = os.path.join(start.tmp, f"adaptive-pinned-{int(defer)}.json")
    with open(path, "w") as fh:
        json.dump({"widths": [16, 1], "pin": PIN, "defer_context": defer}, fh)
    args = spec_args(models, "domino", None) + ["--speculative-adaptive", "--speculative-adaptive-config", path]
    server = start(args, f"domino-pinned-defer{int(defer)}")
    try:
        bodies = [generate_ids(server, ids) for ids in HF_PROMPTS]   # one at a time: the same steps
        return ([b["output_ids"] for b in bodies], [b["meta_info"]["spec_verify_ct"] for b in bodies], server.log())
    finally:
        server.stop()


def test_width_1_steps_deferring_the_draft_context_verify_what_writing_it_every_step_verifies(models, start,
                                                                                                expected):
    deferred, deferred_steps, log = _serve(models, start, defer=True)
    eager, eager_steps, _ = _serve(models, start, defer=False)
    assert deferred == eager == expected["generate"]
    assert deferred_steps == eager_steps
    # width-16 steps accepted drafts (fewer steps than tokens), which read the deferred context
    assert sum(deferred_steps) < len(HF_PROMPTS) * (len(expected["generate"][0]) - 1), deferred_steps
    assert "write the draft's context every step" not in log
