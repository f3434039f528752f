"""Sampled speculative output must follow the target's own distribution exactly."""

import itertools

import pytest
import torch

import sglang_domino.hf.generate as gen
from sglang_domino.accept import accept_probs, accept_sampled
from sglang_domino.sampling import SamplingParams, sample, to_probs
from sglang_domino.testing import tiny_draft, tiny_target


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def null_threshold(probs: torch.Tensor, n: int, trials: int = 200, seed: int = 0) -> float:
    """The largest TV that `trials` honest samples of size n from `probs` reach, with margin:
    an exact sampler stays below it, a biased one (by more than sampling noise) does not."""
    g = torch.Generator().manual_seed(seed)
    tvs = [total_variation(torch.bincount(torch.multinomial(probs, n, replacement=True, generator=g),
                                          minlength=probs.numel()).float(), probs) for _ in range(trials)]
    return 1.2 * max(tvs)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8), SamplingParams(temperature=1.0, top_k=20, top_p=0.9),
])
def test_to_probs_matches_transformers_sampling(params):
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    procs = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k:
        procs.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        procs.append(TopPLogitsWarper(params.top_p))
    expected = procs(None, logits.clone()).softmax(-1)
    torch.testing.assert_close(to_probs(logits, params), expected)


def chain_distributions(seed=3, vocab=6, n=2):
    g = torch.Generator().manual_seed(seed)
    p_logits = torch.randn(n + 1, vocab, generator=g) * 1.5
    q = torch.randn(n, vocab, generator=g).mul(1.5).softmax(-1)
    return p_logits, q


def run_accept(rule, rows=200_000, seed=11):
    """One verification of n independent positions; returns the emitted tokens' counts for
    position 0 and for position 1 among rows that accepted draft 0."""
    p_logits, q = chain_distributions()
    n, vocab = q.shape
    g = torch.Generator().manual_seed(seed)
    drafts = sample(q.expand(rows, n, vocab), g)
    accepted, nxt = rule(drafts, q.expand(rows, n, vocab), p_logits.expand(rows, n + 1, vocab),
                         SamplingParams(temperature=1.0), g)
    first = torch.where(accepted > 0, drafts[:, 0], nxt)
    kept = accepted > 0
    second = torch.where(accepted[kept] > 1, drafts[kept, 1], nxt[kept])
    p = p_logits.softmax(-1)
    return (torch.bincount(first, minlength=vocab).float(), p[0]), (torch.bincount(second, minlength=vocab).float(), p[1])


def residual_from_p(drafts, q, p_logits, params, g):
    """A wrong rule: the right acceptance test, but the correction sampled from p, not p - q."""
    accepted, _ = accept_sampled(drafts, q, p_logits, params, g)
    p = to_probs(p_logits, params)
    return accepted, sample(p[torch.arange(len(drafts)), accepted], g)


def test_accept_rule_emits_the_target_distribution():
    for counts, probs in run_accept(accept_sampled):
        assert total_variation(counts, probs) < null_threshold(probs, int(counts.sum()))


def test_the_distribution_check_catches_a_wrong_rule():
    (counts, probs), _ = run_accept(residual_from_p)
    assert total_variation(counts, probs) > 5 * null_threshold(probs, int(counts.sum()))


def test_full_acceptance_draws_the_bonus_from_p():
    p_logits, _ = chain_distributions()
    q = p_logits[:2].softmax(-1)   # q == p: every draft is accepted
    g = torch.Generator().manual_seed(2)
    rows = 100_000
    drafts = sample(q.expand(rows, 2, 6), g)
    accepted, nxt = accept_sampled(drafts, q.expand(rows, 2, 6), p_logits.expand(rows, 3, 6), SamplingParams(temperature=1.0), g)
    assert bool((accepted == 2).all())
    probs = p_logits[2].softmax(-1)
    assert total_variation(torch.bincount(nxt, minlength=6).float(), probs) < null_threshold(probs, rows)


def test_greedy_draft_as_a_point_mass():
    """`draft_probs=None` (a greedy draft, as SGLang's DFLASH drafts propose) is the rule
    with q one-hot on each draft token: same draws, and the target's distribution."""
    p_logits, q = chain_distributions()
    p = p_logits.softmax(-1)
    rows, (n, vocab) = 200_000, q.shape
    drafts = q.argmax(-1).expand(rows, n)
    one_hot = torch.nn.functional.one_hot(drafts, vocab).float()
    a1, t1 = accept_probs(drafts, one_hot, p.expand(rows, n + 1, vocab), torch.Generator().manual_seed(5))
    a2, t2 = accept_probs(drafts, None, p.expand(rows, n + 1, vocab), torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2) and torch.equal(t1, t2)
    first = torch.where(a2 > 0, drafts[:, 0], t2)
    assert total_variation(torch.bincount(first, minlength=vocab).float(), p[0]) < null_threshold(p[0], rows)
    kept = a2 > 0
    second = torch.where(a2[kept] > 1, drafts[kept, 1], t2[kept])
    assert total_variation(torch.bincount(second, minlength=vocab).float(), p[1]) < null_threshold(p[1], int(kept.sum()))


def test_no_drafts_commits_a_draw_from_p_with_the_final_coin():
    """An adaptive width-1 step proposes nothing: none accepted, the next token drawn from
    p by inverse CDF with the final coin (the token the general rule's residual gives)."""
    from sglang_domino.accept import Uniforms

    p = chain_distributions()[0][:1].softmax(-1)            # [1, 6]
    rows, vocab = 100_000, p.shape[-1]
    u = Uniforms(torch.empty(rows, 0), torch.rand(rows, generator=torch.Generator().manual_seed(3)))
    accepted, nxt = accept_probs(torch.empty(rows, 0, dtype=torch.int64), None, p.expand(rows, 1, vocab), uniforms=u)
    assert accepted.dtype == torch.int64 and not bool(accepted.any())
    cdf = p[0].cumsum(-1)
    assert torch.equal(nxt, (u.final[:, None] * cdf[-1] >= cdf[None, :]).sum(-1).clamp_max(vocab - 1))
    assert total_variation(torch.bincount(nxt, minlength=vocab).float(), p[0]) < null_threshold(p[0], rows)


# -- end to end: spec_generate against exact target probabilities ------------------------
VOCAB, STEPS = 8, 3
PROMPT = torch.tensor([[3, 1, 4, 1, 5]])


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(seed=4, vocab_size=VOCAB, logit_scale=2.0)


def exact_joint(target, params):
    """P(first STEPS new tokens) under the target's own sampling, by enumeration."""
    joint = torch.zeros((VOCAB,) * STEPS)
    with torch.no_grad():
        for prefix in itertools.product(range(VOCAB), repeat=STEPS - 1):
            seq = torch.cat([PROMPT, torch.tensor([prefix])], dim=1)
            probs = to_probs(target(seq).logits[0, PROMPT.shape[1] - 1:], params)   # [STEPS, V]
            mass = probs[0, prefix[0]] * torch.stack([probs[i, prefix[i]] for i in range(1, STEPS - 1)]).prod() \
                if STEPS > 2 else probs[0, prefix[0]]
            joint[prefix] = mass * probs[STEPS - 1]
    return joint.flatten()


def sampled_joint(draft, target, params, rows=6000, seed=0, **kwargs):
    ids = PROMPT.expand(rows, -1)
    out, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=STEPS,
                                     temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                     generator=torch.Generator().manual_seed(seed), return_stats=True, **kwargs)
    new = out[:, PROMPT.shape[1]:]
    codes = sum(new[:, i] * VOCAB ** (STEPS - 1 - i) for i in range(STEPS))
    return torch.bincount(codes, minlength=VOCAB ** STEPS).float(), stats


@pytest.mark.parametrize("kind,shift", [("dflash", True), ("domino", True), ("domino", False)])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4, top_p=0.9)])
def test_spec_sampling_follows_target_distribution(small_target, kind, shift, params):
    draft = tiny_draft(small_target, kind, shift_label=shift, block_size=4, mask_token_id=VOCAB - 1)
    counts, stats = sampled_joint(draft, small_target, params)
    exact = exact_joint(small_target, params)
    assert total_variation(counts, exact) < null_threshold(exact, int(counts.sum()))
    # Drafts were accepted often enough for the acceptance path to matter.
    assert sum(a > 1 for a in stats.accept_lengths) > 0.2 * len(stats.accept_lengths)


@pytest.mark.parametrize("kind", ["dflash", "domino"])
def test_greedy_drafts_verified_as_point_masses_follow_target_distribution(small_target, kind):
    params = SamplingParams(temperature=1.0)
    draft = tiny_draft(small_target, kind, block_size=4, mask_token_id=VOCAB - 1)
    counts, stats = sampled_joint(draft, small_target, params, greedy_draft=True)
    exact = exact_joint(small_target, params)
    assert total_variation(counts, exact) < null_threshold(exact, int(counts.sum()))
    # A random draft's argmax is accepted less often than its samples, but often enough
    # for the accept path (point-mass residual) to be exercised.
    assert sum(a > 1 for a in stats.accept_lengths) > 0.05 * len(stats.accept_lengths)


def test_end_to_end_check_catches_a_wrong_rule(small_target, monkeypatch):
    params = SamplingParams(temperature=1.0)
    draft = tiny_draft(small_target, "domino", block_size=4, mask_token_id=VOCAB - 1)
    monkeypatch.setattr(gen, "accept", lambda d, q, logits, prm, g: residual_from_p(d, q, logits, prm, g))
    counts, _ = sampled_joint(draft, small_target, params)
    exact = exact_joint(small_target, params)
    assert total_variation(counts, exact) > null_threshold(exact, int(counts.sum()))


def _rows(*params: SamplingParams, greedy=None):
    n = len(params)
    return (torch.tensor([p.temperature for p in params]), torch.tensor([p.top_k for p in params]),
            torch.tensor([p.top_p for p in params]),
            torch.zeros(n, dtype=torch.bool) if greedy is None else torch.tensor(greedy))


def test_the_drafts_q_is_to_probs_within_its_cap():
    """`DraftQ` (the q rule's per-row transform, capturable in a CUDA graph) gives
    each row what `to_probs` gives it under that row's own parameters, while its top-k and
    nucleus lie within the cap."""
    from sglang_domino.sampling import DraftQ

    params = [SamplingParams(temperature=0.6, top_k=20, top_p=0.95), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.8, top_p=0.5), SamplingParams(temperature=1.3, top_k=7),
              SamplingParams(temperature=0.7, top_k=40, top_p=0.9), SamplingParams(temperature=2.0, top_k=1)]
    logits = torch.randn(len(params), 500, generator=torch.Generator().manual_seed(0)) * 3
    got = DraftQ(*_rows(*params), 500, cap=64)(logits)
    for row, p in enumerate(params):
        assert torch.allclose(got[row], to_probs(logits[row:row + 1], p)[0], atol=1e-6), p


def test_the_drafts_q_past_its_cap_and_greedy_rows():
    """`DraftQ`: a top-k above the cap does not truncate; a nucleus the cap's tokens do not fill keeps
    every token (both exact for the q rule, which is exact for any q); a greedy row is a
    point mass on its argmax."""
    from sglang_domino.sampling import DraftQ

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(1)) * 0.1   # flat: wide nuclei
    rows = [SamplingParams(temperature=1.0, top_k=100), SamplingParams(temperature=1.0, top_p=0.9),
            SamplingParams(temperature=1.0, top_k=5, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.9)]
    got = DraftQ(*_rows(*rows, greedy=[False, False, False, True]), 300, cap=16)(logits)
    plain = logits.softmax(-1)
    assert torch.allclose(got[0], plain[0], atol=1e-6) and torch.allclose(got[1], plain[1], atol=1e-6)
    assert torch.allclose(got[2], to_probs(logits[2:3], rows[2])[0], atol=1e-6)   # top-k 5 within the cap
    assert torch.equal(got[3], torch.nn.functional.one_hot(logits[3].argmax(), 300).float())


def test_the_drafts_q_skips_what_the_host_knows_is_unused():
    """A batch with no top-k (and so no greedy row) and no top-p: the short path is the
    full transform's q; a host-known top-k bound as the cap gives the same q as 256."""
    from sglang_domino.sampling import DraftQ

    logits = torch.randn(3, 400, generator=torch.Generator().manual_seed(2)) * 2
    plain = [SamplingParams(temperature=t) for t in (0.6, 1.0, 1.7)]
    rows = _rows(*plain)
    rows = (rows[0], torch.full((3,), 1 << 30), rows[2], rows[3])
    assert torch.allclose(DraftQ(*rows, 400, top_k_used=False, top_p_used=False)(logits), DraftQ(*rows, 400)(logits),
                          atol=1e-6)
    qwen = _rows(*[SamplingParams(temperature=0.6, top_k=20, top_p=0.95)] * 3)
    assert torch.allclose(DraftQ(*qwen, 400, cap=20)(logits), DraftQ(*qwen, 400)(logits), atol=1e-6)
