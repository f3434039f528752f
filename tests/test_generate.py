"""Greedy speculative output must be the target's own greedy output, token for token."""

import pytest
import torch

import sglang_domino.hf.generate as gen
from sglang_domino.rollout import Proposal
from sglang_domino.testing import tiny_draft

DRAFTS = [("dflash", True), ("domino", True), ("domino", False)]
PAD = 0


def batch_prompts(lengths, seed=7):
    """Left-padded prompts of different lengths and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, width - n:] = torch.randint(1, 250, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def greedy_reference(target, ids, mask, max_new_tokens, stops=()):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           eos_token_id=list(stops) or None, pad_token_id=PAD)


@pytest.mark.parametrize("kind,shift", DRAFTS)
@pytest.mark.parametrize("lengths", [[11], [5, 13, 9, 1]])
@pytest.mark.parametrize("max_new", [1, 21])
def test_greedy_matches_target(target, kind, shift, lengths, max_new):
    draft = tiny_draft(target, kind, shift_label=shift)
    ids, mask = batch_prompts(lengths)
    out, stats = draft.spec_generate(input_ids=ids, target=target, attention_mask=mask, max_new_tokens=max_new,
                                     pad_token_id=PAD, return_stats=True)
    assert torch.equal(out, greedy_reference(target, ids, mask, max_new))
    assert out.shape[1] == ids.shape[1] + max_new
    # Every verification step commits at least one token; the prefill commits the first.
    for row in stats.per_row_accept_lengths:
        assert 1 + sum(row) >= max_new and all(a >= 1 for a in row)
    if max_new == 1:
        assert stats.accept_lengths == []


@pytest.mark.parametrize("kind,shift", DRAFTS)
def test_stop_tokens_end_each_row(target, kind, shift):
    draft = tiny_draft(target, kind, shift_label=shift)
    ids, mask = batch_prompts([6, 12, 9])
    free = greedy_reference(target, ids, mask, 30)
    stop = int(free[0, ids.shape[1] + 4])        # row 0 meets it at its 5th new token
    ref = greedy_reference(target, ids, mask, 30, stops=[stop])
    out = draft.spec_generate(input_ids=ids, target=target, attention_mask=mask, max_new_tokens=30,
                              stop_token_ids=[stop], pad_token_id=PAD)
    assert torch.equal(out, ref)
    row0 = out[0, ids.shape[1]:].tolist()
    assert row0.index(stop) == 4 and all(t == PAD for t in row0[5:])


def test_sliding_window_draft_layers_stay_lossless(target):
    draft = tiny_draft(target, "domino", layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    ids, mask = batch_prompts([9, 3])
    out = draft.spec_generate(input_ids=ids, target=target, attention_mask=mask, max_new_tokens=17, pad_token_id=PAD)
    assert torch.equal(out, greedy_reference(target, ids, mask, 17))


def oracle_draft_block(reference, prompt_lengths, vocab, seed=0):
    """Proposals taken from the target's own continuation, corrupted at a random place in
    half of the calls: acceptance then varies by row and by step, and every commit,
    crop and context update path of the loop is exercised."""
    g = torch.Generator().manual_seed(seed)
    width = reference.shape[1] - max(prompt_lengths)
    logical = [reference[r, reference.shape[1] - width - n:].tolist() for r, n in enumerate(prompt_lengths)]

    def draft_block(draft, target, pending, next_pos, context, n, mask_id, params, generator):
        rows = []
        for tok, pos in zip(pending.tolist(), next_pos.tolist()):
            cands = [r for r, seq in enumerate(logical) if pos < len(seq) and seq[pos] == tok]
            seq = logical[cands[0]] if cands else []
            guess = [seq[pos + 1 + i] if pos + 1 + i < len(seq) else 1 for i in range(n)]
            if torch.rand(1, generator=g).item() < 0.5:
                j = int(torch.randint(0, n, (1,), generator=g))
                guess[j] = (guess[j] + 1) % vocab
            rows.append(guess)
        return Proposal(torch.tensor(rows, dtype=torch.long))

    return draft_block


@pytest.mark.parametrize("num_verify", [None, 4])
def test_ragged_acceptance_is_lossless(target, monkeypatch, num_verify):
    draft = tiny_draft(target, "dflash", block_size=8)
    lengths = [5, 13, 9, 2]
    ids, mask = batch_prompts(lengths)
    max_new = 40
    long_ref = greedy_reference(target, ids, mask, max_new + 20)
    monkeypatch.setattr(gen, "draft_block", oracle_draft_block(long_ref, lengths, target.config.vocab_size))
    out, stats = draft.spec_generate(input_ids=ids, target=target, attention_mask=mask, max_new_tokens=max_new,
                                     pad_token_id=PAD, num_verify_tokens=num_verify, return_stats=True)
    assert torch.equal(out, greedy_reference(target, ids, mask, max_new))
    width = 8 if num_verify is None else num_verify
    assert max(stats.accept_lengths) == width and min(stats.accept_lengths) < width
    assert all(1 <= a <= width for a in stats.accept_lengths)
    assert len({len(r) for r in stats.per_row_accept_lengths}) > 1   # rows finished after different step counts
    assert stats["accept_lengths"] is stats.accept_lengths and stats.mean_accept_length > 2


@pytest.mark.parametrize("kind,shift,width", [("dflash", True, 8), ("domino", True, 9), ("domino", False, 8)])
def test_default_verify_window(target, monkeypatch, kind, shift, width):
    """Block 8: DFlash and unshifted Domino verify 8 tokens (7 drafts); shifted Domino uses
    all 8 hidden slots, so 8 drafts and a 9-token window as in the Domino reference."""
    draft = tiny_draft(target, kind, shift_label=shift, block_size=8)
    seen = []
    real = gen.draft_block

    def spy(*args):
        proposal = real(*args)
        seen.append(proposal.tokens.shape[1])
        return proposal

    monkeypatch.setattr(gen, "draft_block", spy)
    ids, _ = batch_prompts([7])
    draft.spec_generate(input_ids=ids, target=target, max_new_tokens=4)
    assert set(seen) == {width - 1}
    with pytest.raises(ValueError, match=f"num_verify_tokens: got {width + 1}, expected 2..{width}"):
        draft.spec_generate(input_ids=ids, target=target, max_new_tokens=4, num_verify_tokens=width + 1)


def test_verify_width_below_block_is_lossless(target):
    draft = tiny_draft(target, "domino", block_size=16)
    ids, mask = batch_prompts([8, 4])
    out, stats = draft.spec_generate(input_ids=ids, target=target, attention_mask=mask, max_new_tokens=19,
                                     num_verify_tokens=8, pad_token_id=PAD, return_stats=True)
    assert torch.equal(out, greedy_reference(target, ids, mask, 19))
    assert max(stats.accept_lengths) <= 8


def test_bad_arguments_are_named(target):
    ids, _ = batch_prompts([4])
    draft = tiny_draft(target, "dflash")
    with pytest.raises(ValueError, match="max_new_tokens: got 0"):
        draft.spec_generate(input_ids=ids, target=target, max_new_tokens=0)
    with pytest.raises(ValueError, match="mask_token_id: got 256"):
        draft.spec_generate(input_ids=ids, target=target, max_new_tokens=3, mask_token_id=256)
    other = tiny_draft(target, "dflash", mask_token_id=None, dflash_config={"mask_token_id": None})
    with pytest.raises(ValueError, match="mask_token_id: missing"):
        other.spec_generate(input_ids=ids, target=target, max_new_tokens=3)


def test_draft_for_another_target_is_refused(target):
    from sglang_domino.testing import tiny_target

    small = tiny_target(seed=3, vocab_size=128)
    ids, _ = batch_prompts([4])
    with pytest.raises(ValueError, match="vocab_size: draft has 256, expected the target's vocab_size 128"):
        tiny_draft(target, "domino").spec_generate(input_ids=ids % 128, target=small, max_new_tokens=3)


def test_stats_time_split(target):
    draft = tiny_draft(target, "domino")
    ids, _ = batch_prompts([6])
    _, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=9, return_stats=True)
    assert stats.num_verify_steps == len(stats.accept_lengths) > 0
    assert 0 < stats.draft_time and 0 < stats.verify_time
    assert stats.prefill_time + stats.draft_time + stats.verify_time + stats.accept_time <= stats.total_time
    assert stats.new_tokens == 9
