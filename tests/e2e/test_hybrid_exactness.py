"""DFLASH on a hybrid target is token-for-token Transformers' greedy output in the default
environment: `sglang serve --device cpu --dtype float32`, SGLANG_MAMBA_CONV_DTYPE unset, so
0.5.23 keeps the gated delta-net conv state in bfloat16.

Token-by-token decoding rounds that state after every token. A target verify that rounded
it only when committing (not between its positions) computed the accepted positions from
a different state than decoding them one at a time, and its tokens drifted from
Transformers' (issue 21: token 49 instead of 242, at a top-2 margin of 0.48). The verify
now rounds after every position (`gdn_ops.causal_conv1d_update_cpu`); this test fails
without that.

The target (`tiny_sensitive.build_sensitive_target`) is the stock tiny hybrid target with
conv kernels that make its output depend on the rounding schedule, and a head with 8 live
tokens; the constant draft proposes CONSTANT_TOKEN everywhere, so every verify accepts
the run of that token the target produces next: the verify count is known from the
oracle, and the first prompt's verifies accept 0, 15, 15 and 1 drafts.

Why the prompts are safe: along Transformers' float32 continuation the top-2 margin is
never below MIN_MARGIN (>= 0.14; 0.97 for the first prompt), nor along the emulated
token-by-token decode with the conv state rounded after every token (>= 0.10): fp32
summation-order noise (~1e-5) cannot flip a token. A verify without per-position rounding
(emulated the same way) changes token 36 of the first prompt (its margin there 1.2) and
token 22 of the second (0.36); `test_the_prompts_tell_the_rounding_schedules_apart`
checks these facts in process, so a change to the model's construction cannot silently
make the server test vacuous.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.e2e.test_hybrid_cpu import HYBRID_ARGS, _generate, _used_tokens, constant_draft_steps
from tests.helpers import tiny_sensitive
from tests.helpers.servers import BASE_ARGS, BLOCK, server_env

pytestmark = pytest.mark.sglang_e2e

MAX_TOKENS = 40
PROMPTS = [[311, 91, 372, 42], [499, 393, 272, 47, 6, 336]]
MIN_MARGIN = 0.05
assert tiny_sensitive.CONSTANT_TOKEN == 300  # `constant_draft_steps` counts runs of tiny.LIVE_TOKENS[0]


@pytest.fixture(scope="module")
def sensitive(sglang_tmp):
    root = os.path.join(sglang_tmp, "hybrid-exactness")
    paths = {"target": os.path.join(root, "target"), "constant": os.path.join(root, "constant")}
    target = tiny_sensitive.build_sensitive_target(paths["target"])
    tiny_sensitive.build_constant_draft(paths["constant"], target, block_size=BLOCK)
    paths["hf"] = target
    paths["oracle"], paths["margins"] = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS + BLOCK, do_sample=False)
            logits = target(out).logits[0, len(prompt) - 1:-1]
            paths["oracle"].append(out[0, len(prompt):].tolist())
            paths["margins"].append(tiny_sensitive.top2_margins(logits[:MAX_TOKENS]))
    return paths


def test_the_prompts_tell_the_rounding_schedules_apart(sensitive):
    """In process: the oracle and the per-token-rounded decode agree with margins; the
    verify that rounds only at commits does not (a flip at a wide margin)."""
    target = sensitive["hf"]
    for prompt, want, margins in zip(PROMPTS, sensitive["oracle"], sensitive["margins"]):
        assert float(margins.min()) >= MIN_MARGIN, prompt
        tokens, logits = tiny_sensitive.decode_rounded(target, prompt, MAX_TOKENS)
        assert tokens == want[:MAX_TOKENS], prompt
        assert float(tiny_sensitive.top2_margins(logits).min()) >= MIN_MARGIN, prompt
        tokens, logits, commits = tiny_sensitive.dflash_unrounded(target, prompt, MAX_TOKENS, window=BLOCK)
        first = next(i for i in range(MAX_TOKENS) if tokens[i] != want[i])
        # the verifies before the differing one committed what the server's will
        done = [step for step, end in zip(commits, torch.tensor([1] + commits).cumsum(0)[1:]) if end <= first]
        assert done == constant_draft_steps(want, MAX_TOKENS)[:len(done)], prompt
        assert float(tiny_sensitive.top2_margins(logits[first:first + 1])) >= MIN_MARGIN, prompt
    assert constant_draft_steps(sensitive["oracle"][0], MAX_TOKENS)[:4] == [1, 16, 16, 2]


def test_dflash_verify_rounds_the_conv_state_like_token_by_token_decoding(start, sensitive):
    args = ["--model-path", sensitive["target"], *BASE_ARGS, *HYBRID_ARGS, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", sensitive["constant"], "--speculative-dflash-block-size", str(BLOCK)]
    env = server_env(start.tmp)
    assert "SGLANG_MAMBA_CONV_DTYPE" not in env  # the default: a bfloat16 conv state
    server = start(args, "hybrid-exactness", env=env)
    try:
        for prompt, want in zip(PROMPTS, sensitive["oracle"]):
            body = _generate(server, prompt, MAX_TOKENS)
            assert body["output_ids"] == want[:MAX_TOKENS], prompt
            assert body["meta_info"]["spec_verify_ct"] == len(constant_draft_steps(want, MAX_TOKENS)), prompt
        assert _used_tokens(server) == 0
    finally:
        server.stop()
