"""`--speculative-use-rejection-sampling` with a Domino draft, end to end through `sglang serve`
on CPU, on a constructed pair whose distributions are known in closed form
(`tiny.build_known_pair`): a bigram target p(. | t) and a draft whose first proposal after
bonus token t follows q(. | t), its logits 1.5 times the target's.

With prompt ending in token c, the prefill samples t1 ~ p(. | c); the first verify step
then tests the draft's first proposal d ~ q(. | t1) against p(. | t1). Per row:
  * the q rule accepts it with probability sum_v min(p, q)(v | t1);
  * the point-mass rule (the draft proposes argmax q, accepted with p(argmax q)).
With max_new_tokens 3 a row needs exactly one verify step iff that proposal was accepted.
The token emitted at position 2 must follow p(. | t1) whatever the rule; a rule that
resamples rejections from p instead of norm(max(0, p - q)) over-weights the tokens where
q > p, which the test also checks it detects (a server with that rule patched in).

Statistical tolerance: ROWS independent rows, |z| < 4.5 for the true value (a false
failure about once in 150,000 runs); the two rules' acceptance rates are more than 15
standard deviations apart, the wrong residual's excess about 8.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from sglang_domino.sampling import SamplingParams, to_probs
from tests.helpers import tiny
from tests.helpers.servers import BASE_ARGS, BLOCK, server_env

pytestmark = pytest.mark.sglang_e2e

PROMPT = [5, 77, 300, 41, 9]
ROWS = 1000
TEMPERATURE = 1.0
Z_MAX = 4.5
TRUNCATED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}

WRONG_RULE = textwrap.dedent('''
    # test-only: resample a rejection (and the bonus) from p, not from norm(max(0, p - q))
    import torch
    import sglang_domino.accept as accept

    _right = accept.accept_probs

    def _wrong(draft_tokens, draft_probs, target_probs, generator=None, uniforms=None):
        accepted, _ = _right(draft_tokens, draft_probs, target_probs, generator, uniforms)
        p_next = target_probs.float()[torch.arange(len(accepted)), accepted]
        return accepted, accept.sample_inverse_cdf(p_next, torch.rand(len(accepted)))

    accept.accept_probs = _wrong
''')


@pytest.fixture(scope="module")
def known(sglang_tmp):
    root = os.path.join(sglang_tmp, "known")
    paths = {"target": os.path.join(root, "target"), "draft": os.path.join(root, "domino")}
    with torch.no_grad():
        target, draft = tiny.build_known_pair(paths["target"], paths["draft"])
        p_logits, q_logits = tiny.known_logits(target, draft)
        direct = target(torch.tensor([PROMPT + [7]])).logits[0].float()
    # the closed form is the target's own forward (every prefix: a bigram)
    torch.testing.assert_close(direct[-2:], p_logits[[PROMPT[-1], 7]], rtol=1e-4, atol=1e-3)
    paths["p"] = (p_logits / TEMPERATURE).double().softmax(-1)
    paths["q"] = (q_logits / TEMPERATURE).double().softmax(-1)
    # the same pair under a request's top-k and top-p (the project's `to_probs`, whose
    # order and boundaries are 0.5.23's verify transform's)
    params = SamplingParams(temperature=TRUNCATED["temperature"], top_k=TRUNCATED["top_k"], top_p=TRUNCATED["top_p"])
    paths["truncated"] = {"p": to_probs(p_logits, params).double(), "q": to_probs(q_logits, params).double()}
    return paths


def _serve(start, known, name, rule_flag=True, env=None, extra=()):
    args = ["--model-path", known["target"], *BASE_ARGS, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", known["draft"], "--speculative-dflash-block-size", str(BLOCK), *extra]
    if rule_flag:
        args.append("--speculative-use-rejection-sampling")
    return start(args, name, env=env)


def _rows(server, sampling=None):
    params = {"max_new_tokens": 3, "ignore_eos": True, **(sampling or {"temperature": TEMPERATURE})}
    status, body = server.post("/generate", {"input_ids": [PROMPT] * ROWS, "sampling_params": params})
    assert status == 200, body
    assert all(len(r["output_ids"]) == 3 for r in body)
    return body


def _z(observed: float, means: torch.Tensor) -> float:
    """Pooled independent Bernoulli rows: (observed - sum of means) / sd."""
    return float((observed - means.sum()) / (means * (1 - means)).sum().sqrt())


def _first_acceptance(body, known):
    """(observed count of rows whose first proposal was accepted, expected per row under
    the q rule, under the point-mass rule), given each row's own t1."""
    p, q = known["p"], known["q"]
    t1 = torch.tensor([r["output_ids"][0] for r in body])
    q_rule = torch.minimum(p[t1], q[t1]).sum(-1)
    point_mass = p[t1].gather(1, q[t1].argmax(-1, keepdim=True))[:, 0]
    accepted = sum(r["meta_info"]["spec_verify_ct"] == 1 for r in body)
    assert all(r["meta_info"]["spec_verify_ct"] in (1, 2) for r in body)
    return accepted, q_rule, point_mass


def _second_token_z(body, known) -> tuple[float, float]:
    """z of two pooled bins of the position-2 token against p(. | t1): the target's argmax,
    and the tokens where q > p (those a residual taken from p over-weights)."""
    p, q = known["p"], known["q"]
    t1 = torch.tensor([r["output_ids"][0] for r in body])
    t2 = torch.tensor([r["output_ids"][1] for r in body])
    rows = torch.arange(len(body))
    top = p[t1].argmax(-1)
    where_q_over_p = q[t1] > p[t1]
    z_top = _z(float((t2 == top).sum()), p[t1][rows, top])
    z_tail = _z(float(where_q_over_p[rows, t2].sum()), (p[t1] * where_q_over_p).sum(-1))
    return z_top, z_tail


@pytest.fixture(scope="module")
def q_rule_rows(start, known):
    server = _serve(start, known, "known-q")
    try:
        assert "sampled verify=q rule" in server.log()
        return {"plain": _rows(server), "truncated": _rows(server, TRUNCATED)}
    finally:
        server.stop()


def test_q_rule_accepts_with_sum_of_min_p_q(q_rule_rows, known):
    accepted, q_rule, point_mass = _first_acceptance(q_rule_rows["plain"], known)
    assert abs(_z(accepted, q_rule)) < Z_MAX, (accepted, float(q_rule.sum()))
    # and not with the point-mass rule's p(argmax q): the two are far apart here
    assert _z(accepted, point_mass) > 3 * Z_MAX, (accepted, float(point_mass.sum()))


def test_q_rule_emits_the_target_distribution(q_rule_rows, known):
    z_top, z_tail = _second_token_z(q_rule_rows["plain"], known)
    assert abs(z_top) < Z_MAX and abs(z_tail) < Z_MAX, (z_top, z_tail)


def test_q_rule_under_top_k_and_top_p(q_rule_rows, known):
    """Requests with temperature, top-k and top-p: q is drawn under the same truncation as
    p, the acceptance is Σ min(p, q) of the truncated pair, the output follows truncated p."""
    body, truncated = q_rule_rows["truncated"], known["truncated"]
    accepted, q_rule, point_mass = _first_acceptance(body, truncated)
    assert abs(_z(accepted, q_rule)) < Z_MAX, (accepted, float(q_rule.sum()))
    assert abs(_z(accepted, point_mass)) > Z_MAX, (accepted, float(point_mass.sum()))
    z_top, z_tail = _second_token_z(body, truncated)
    assert abs(z_top) < Z_MAX and abs(z_tail) < Z_MAX, (z_top, z_tail)
    p = truncated["p"]
    assert all(float(p[r["output_ids"][0], r["output_ids"][1]]) > 0 for r in body)   # never outside top-k/top-p


def test_point_mass_rule_without_the_flag(start, known):
    """Without the flag the same pair is verified as 0.5.23 does, a point mass on the
    draft's argmax: acceptance p(argmax q), output still p."""
    server = _serve(start, known, "known-pm", rule_flag=False)
    try:
        assert "sampled verify=point mass" in server.log()
        body = _rows(server)
    finally:
        server.stop()
    accepted, q_rule, point_mass = _first_acceptance(body, known)
    assert abs(_z(accepted, point_mass)) < Z_MAX, (accepted, float(point_mass.sum()))
    assert _z(accepted, q_rule) < -3 * Z_MAX
    z_top, z_tail = _second_token_z(body, known)
    assert abs(z_top) < Z_MAX and abs(z_tail) < Z_MAX, (z_top, z_tail)


def test_a_wrong_residual_fails_the_distribution_check(start, known, sglang_tmp):
    site = os.path.join(sglang_tmp, "wrong-rule-site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(WRONG_RULE)
    server = _serve(start, known, "known-wrong", env=server_env(sglang_tmp, PYTHONPATH=site))
    try:
        body = _rows(server)
    finally:
        server.stop()
    accepted, q_rule, _ = _first_acceptance(body, known)
    assert abs(_z(accepted, q_rule)) < Z_MAX   # the acceptance test itself is unchanged
    _, z_tail = _second_token_z(body, known)
    assert z_tail > Z_MAX, z_tail



def test_q_rule_at_tp2(start, known):
    """`--tp-size 2`: the sampled rollout gathers the vocabulary-parallel base logits over
    real gloo groups and every rank commits rank 0's tokens; acceptance and output as at TP 1."""
    server = _serve(start, known, "known-q-tp2", extra=("--tp-size", "2"))
    try:
        body = _rows(server)
    finally:
        server.stop()
    accepted, q_rule, point_mass = _first_acceptance(body, known)
    assert abs(_z(accepted, q_rule)) < Z_MAX, (accepted, float(q_rule.sum()))
    assert _z(accepted, point_mass) > 3 * Z_MAX
    z_top, z_tail = _second_token_z(body, known)
    assert abs(z_top) < Z_MAX and abs(z_tail) < Z_MAX, (z_top, z_tail)
