"""A hybrid target (gated delta-net + attention, the Qwen3.6-27B model card's architecture)
served by real `sglang serve --device cpu` processes, with and without a DFLASH draft.

Oracle: Transformers' own greedy `generate` of the same tiny model, float32. The target
has the two-live-token head of `tiny.py`, so a random draft is right about half the time
and verifies commit varying prefixes. A second, built draft proposes one token everywhere:
every verify then accepts exactly the run of that token the target produces next, so the
number of verify steps is known in advance from the oracle's text, at acceptance lengths
from 0 to the whole window. Both only come out right if the recurrent and conv states
after each partial acceptance are those of the accepted prefix (a state from one position
too far or too short changes the following tokens).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tests.e2e.client import check_compiled_before_serving
from tests.helpers import tiny
from tests.helpers.servers import BASE_ARGS, BLOCK, server_env

pytestmark = pytest.mark.sglang_e2e

MAX_TOKENS = 40
CANDIDATE_PROMPTS = [[5, 77, 300, 41, 9], [100, 200], [7] * 6, [300, 301, 300], [12, 13, 14, 15, 16, 17, 18, 19, 20],
                     [400, 3], [42] * 3, [250, 251, 252, 253], [9, 8, 7, 6, 5, 4], [301], [60, 300, 61, 301, 62],
                     [33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155]]
N_PROMPTS = 6
# fp32 kernels that differ in summation order agree to ~1e-5 in the logits; a prompt whose
# greedy path passes a near-tie between the two live tokens would compare rounding, not
# the serving path
MIN_MARGIN = 0.05
CONSTANT_TOKEN = tiny.LIVE_TOKENS[0]
# The model card's `--mamba-scheduler-strategy extra_buffer` snapshots states for the radix
# cache, which 0.5.23's CPU platform cannot do: the nearest setting that serves on CPU.
HYBRID_ARGS = ["--mamba-scheduler-strategy", "no_buffer", "--disable-overlap-schedule"]


@pytest.fixture(scope="module")
def hybrid(sglang_tmp):
    root = os.path.join(sglang_tmp, "hybrid")
    paths = {"target": os.path.join(root, "target")}
    target = tiny.build_hybrid_target(paths["target"])
    for kind in ("dflash", "domino"):
        paths[kind] = os.path.join(root, kind)
        tiny.build_draft(paths[kind], target, kind, BLOCK)
    paths["constant"] = os.path.join(root, "constant")
    tiny.build_constant_dflash(paths["constant"], target, CONSTANT_TOKEN, BLOCK)
    paths["prompts"], paths["oracle"] = tie_free_prompts(target)
    return paths


def tie_free_prompts(target) -> tuple[list, list]:
    """The first `N_PROMPTS` candidate prompts whose greedy continuation never has a top-2
    margin below `MIN_MARGIN` (CPU servers and Transformers agree token for token there),
    and those continuations from Transformers `generate`."""
    prompts, oracle = [], []
    with torch.no_grad():
        for prompt in CANDIDATE_PROMPTS:
            # BLOCK more tokens than served: the constant draft's last verify looks ahead
            out = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS + BLOCK, do_sample=False)
            logits = target(out).logits[0, len(prompt) - 1:-1]
            margin = (logits[:, tiny.LIVE_TOKENS[0]] - logits[:, tiny.LIVE_TOKENS[1]]).abs()
            if float(margin[:MAX_TOKENS].min()) >= MIN_MARGIN:
                prompts.append(prompt)
                oracle.append(out[0, len(prompt):].tolist())
    assert len(prompts) >= N_PROMPTS, f"only {len(prompts)} tie-free prompts"
    return prompts[:N_PROMPTS], oracle[:N_PROMPTS]


def constant_draft_steps(oracle: list[int], n: int, window: int = BLOCK) -> list[int]:
    """Tokens each verify commits with the constant draft: the prefill gives the first
    token; a verify of the window accepts the leading proposals equal to the target's next
    tokens and adds the target's own token after them."""
    commits, pos = [], 1
    while pos < n:
        run = 0
        while run < window - 1 and oracle[pos + run] == CONSTANT_TOKEN:
            run += 1
        commits.append(run + 1)
        pos += run + 1
    return commits


def _server(start, hybrid, name, *extra):
    args = ["--model-path", hybrid["target"], *BASE_ARGS, *HYBRID_ARGS, *extra]
    return start(args, f"hybrid-{name}", env=server_env(start.tmp))


def _spec(start, hybrid, kind, *extra):
    return _server(start, hybrid, "-".join([kind, *extra]).replace("--", ""), "--speculative-algorithm", "DFLASH",
                   "--speculative-draft-model-path", hybrid[kind], "--speculative-dflash-block-size", str(BLOCK),
                   *extra)


def _generate(server, ids, n=MAX_TOKENS):
    status, body = server.post("/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert status == 200, body
    return body


def _generate_all_at_once(server, prompts):
    """All prompts in flight together: one batch whose rows accept different lengths."""
    bodies = [None] * len(prompts)

    def run(i):
        bodies[i] = _generate(server, prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(b is not None for b in bodies)
    return bodies


def _used_tokens(server, timeout: float = 120):
    """KV slots in use after a cache flush. The server refuses to flush while a request
    still runs: an aborted one leaves the batch at the scheduler's next step, so the flush
    is retried until then."""
    deadline = time.time() + timeout
    while server.post("/flush_cache", {})[0] != 200:
        assert time.time() < deadline, "the server kept refusing to flush its cache: a request never left"
        time.sleep(0.5)
    return server.get("/v1/loads")["loads"][0]["num_used_tokens"]


def test_constant_draft_exercises_several_acceptance_lengths(hybrid):
    lengths = {c - 1 for p in hybrid["oracle"] for c in constant_draft_steps(p, MAX_TOKENS)}
    assert 0 in lengths and max(lengths) >= 3 and len(lengths) >= 3, lengths


# the compiled CPU step (`--enable-torch-compile`, `cpu/compiled/hybrid.py`): the target's gated
# delta-net and gated attention layers under one graph, the states read and written by upstream's
# linear-attention core behind an opaque op
COMPILED = ("--enable-torch-compile",)


def _check_compiled(server, extra, draft: bool, rollout: bool = False) -> None:
    if COMPILED[0] in extra:
        check_compiled_before_serving(server.log(), rollout_blocks="16" if rollout else None, draft=draft)


@pytest.mark.parametrize("extra", [(), COMPILED], ids=["eager", "compiled"])
def test_plain_server_matches_transformers(start, hybrid, extra):
    server = _server(start, hybrid, "-".join(["plain", *extra]).replace("--", ""), *extra)
    try:
        for ids, want in zip(hybrid["prompts"], hybrid["oracle"]):
            assert _generate(server, ids)["output_ids"] == want[:MAX_TOKENS], ids
        for body, want in zip(_generate_all_at_once(server, hybrid["prompts"]), hybrid["oracle"]):
            assert body["output_ids"] == want[:MAX_TOKENS]
        assert _used_tokens(server) == 0
        _check_compiled(server, extra, draft=False)
    finally:
        server.stop()


@pytest.mark.parametrize("kind,extra", [("dflash", ()), ("domino", ()), ("domino", COMPILED)],
                         ids=["dflash", "domino", "domino-compiled"])
def test_speculative_server_matches_transformers(start, hybrid, kind, extra):
    server = _spec(start, hybrid, kind, *extra)
    try:
        steps = 0
        for ids, want in zip(hybrid["prompts"], hybrid["oracle"]):
            body = _generate(server, ids)
            assert body["output_ids"] == want[:MAX_TOKENS], (kind, ids)
            steps += body["meta_info"]["spec_verify_ct"]
        # drafts right about half the time: verifies commit more than one token on average
        assert 0 < steps < len(hybrid["prompts"]) * (MAX_TOKENS - 1)
        for body, want in zip(_generate_all_at_once(server, hybrid["prompts"]), hybrid["oracle"]):
            assert body["output_ids"] == want[:MAX_TOKENS], kind
        assert _used_tokens(server) == 0
        _check_compiled(server, extra, draft=True, rollout=kind == "domino")
    finally:
        server.stop()


def _check_known_acceptance(server, hybrid, one_at_a_time: bool, window: int = BLOCK) -> None:
    """The oracle's tokens, in exactly the verify steps the constant draft predicts for a
    verify of `window` positions."""
    singles = [_generate(server, ids) for ids in hybrid["prompts"]] if one_at_a_time else []
    bodies = singles + _generate_all_at_once(server, hybrid["prompts"])
    wants = (hybrid["oracle"] if one_at_a_time else []) + hybrid["oracle"]
    for body, want in zip(bodies, wants):
        assert body["output_ids"] == want[:MAX_TOKENS]
        assert body["meta_info"]["spec_verify_ct"] == len(constant_draft_steps(want, MAX_TOKENS, window))
    assert _used_tokens(server) == 0


@pytest.mark.parametrize("extra", [(), COMPILED], ids=["eager", "compiled"])
def test_known_acceptance_lengths_commit_the_accepted_prefix_state(start, hybrid, extra):
    server = _spec(start, hybrid, "constant", *extra)
    try:
        _check_known_acceptance(server, hybrid, one_at_a_time=True)
        _check_compiled(server, extra, draft=True)
    finally:
        server.stop()


@pytest.mark.parametrize("extra", [(), COMPILED], ids=["eager", "compiled"])
def test_tensor_parallel_hybrid_target_commits_the_accepted_prefix_state(start, hybrid, extra):
    """`--tp-size 2`: the gated delta-net heads, the conv channels and their per-position
    verify buffers split over two ranks, each rank committing its shard of the state
    (compiled: each rank's graph, the row-parallel projections reduced by the opaque op)."""
    server = _spec(start, hybrid, "constant", "--tp-size", "2", *extra)
    try:
        _check_known_acceptance(server, hybrid, one_at_a_time=False)
        _check_compiled(server, extra, draft=True)
    finally:
        server.stop()


def test_b8_verifies_the_window_with_state_buffers_for_the_window(start, hybrid):
    """b8 (the 16-token draft block, 8 verified): the accepted prefix's state at every
    acceptance length up to 7, and the per-position state buffers sized for the 8
    verified positions (0.5.23 would size them for the draft block and budget 8)."""
    server = _spec(start, hybrid, "constant", "--speculative-num-draft-tokens", "8")
    try:
        bodies = _generate_all_at_once(server, hybrid["prompts"])
        for body, want in zip(bodies, hybrid["oracle"]):
            assert body["output_ids"] == want[:MAX_TOKENS]
            assert body["meta_info"]["spec_verify_ct"] == len(constant_draft_steps(want, MAX_TOKENS, window=8))
        assert _used_tokens(server) == 0
        assert "per-position recurrent-state buffers for the 8 verified positions (not the 16-token" in server.log()
    finally:
        server.stop()
