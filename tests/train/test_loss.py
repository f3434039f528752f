"""Labels, weights and losses against per-block loop references, and Domino's
teacher-forced training logits against the inference rollout."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from sglang_domino.hf.generate import draft_block, target_features
from sglang_domino.hf.state import DraftContext
from sglang_domino.sampling import SamplingParams
from sglang_domino.testing import tiny_draft
from sglang_domino.train.anchors import Anchors
from sglang_domino.train.data import Batch
from sglang_domino.train.loop import compute_loss, draft_forward
from sglang_domino.train.loss import block_targets, dflash_loss, domino_logits, domino_loss


def _setup():
    ids = torch.randint(0, 250, (2, 16), generator=torch.Generator().manual_seed(5))
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 3:] = 1
    loss_mask[1, 6:13] = 1
    anchors = Anchors(torch.tensor([[3, 10, 14], [6, 9, 0]]), torch.tensor([[True, True, True], [True, True, False]]))
    return ids, loss_mask, anchors


@pytest.mark.parametrize("shift", [False, True])
def test_labels_and_weights_match_a_loop_reference(shift):
    ids, lm, anchors = _setup()
    bs, gamma = 4, 7.0
    t = block_targets(ids, lm, anchors, bs, shift, gamma)
    first = 0 if shift else 1
    for r in range(2):
        for n in range(3):
            a = int(anchors.positions[r, n])
            for k in range(bs):
                pos = a + k + int(shift)
                ok = bool(anchors.keep[r, n]) and k >= first and pos < 16 and bool(lm[r, pos])
                assert bool(t.valid[r, n, k]) == ok
                if ok:
                    assert int(t.labels[r, n, k]) == int(ids[r, pos])
                    assert t.weights[r, n, k].item() == pytest.approx(math.exp(-(k - first) / gamma))
                else:
                    assert t.weights[r, n, k].item() == 0


def test_dflash_loss_equals_per_block_reference(target):
    draft = tiny_draft(target, "dflash", block_size=4)
    ids, lm, anchors = _setup()
    batch = Batch(ids, torch.ones_like(ids), lm)
    hidden = draft_forward(draft, target, batch, anchors)
    t = block_targets(ids, lm, anchors, 4, False, 7.0)
    got = dflash_loss(hidden, target.get_output_embeddings(), t, anchors.keep)
    num = den = 0.0
    for r in range(2):
        for n in range(3):
            a = int(anchors.positions[r, n])
            for k in range(1, 4):
                if anchors.keep[r, n] and a + k < 16 and lm[r, a + k]:
                    logits = target.lm_head(hidden[r, n * 4 + k])
                    w = math.exp(-(k - 1) / 7.0)
                    num += w * F.cross_entropy(logits[None], ids[r, a + k][None]).item()
                    den += w
    assert got.loss.item() == pytest.approx(num / den, rel=1e-5)


@pytest.mark.parametrize("shift", [True, False])
def test_domino_loss_mixes_final_and_base_ce_by_lambda(target, shift):
    draft = tiny_draft(target, "domino", block_size=4, shift_label=shift)
    torch.nn.init.normal_(draft.embed_proj[2].weight, std=0.5)  # a non-trivial correction
    ids, lm, anchors = _setup()
    hidden = draft_forward(draft, target, Batch(ids, torch.ones_like(ids), lm), anchors)
    t = block_targets(ids, lm, anchors, 4, shift, 7.0)
    head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    only_final = domino_loss(draft, hidden, head, embed, ids, anchors, t, 0.0)
    only_base = domino_loss(draft, hidden, head, embed, ids, anchors, t, 1.0)
    mixed = domino_loss(draft, hidden, head, embed, ids, anchors, t, 0.25)
    assert only_final.loss.item() != pytest.approx(only_base.loss.item())
    assert mixed.loss.item() == pytest.approx(0.75 * only_final.loss.item() + 0.25 * only_base.loss.item(), rel=1e-5)


@pytest.mark.parametrize("shift", [True, False])
def test_domino_teacher_forced_logits_equal_the_rollout_fed_the_true_tokens(target, shift):
    """Run the inference draft step (greedy rollout) after a prompt, take its proposals as
    the 'true' continuation, and check that training on that sequence, anchored at the
    bonus token, produces the same logits at every slot."""
    torch.manual_seed(0)
    bs = 6
    draft = tiny_draft(target, "domino", block_size=bs, shift_label=shift)
    torch.nn.init.normal_(draft.embed_proj[2].weight, std=0.5)
    prompt = torch.randint(0, 250, (1, 9), generator=torch.Generator().manual_seed(8))
    bonus = torch.tensor([17])
    a = prompt.shape[1]
    n = draft.config.num_predictions
    recorded = []
    original = draft.correction

    def recording(z, state):
        out = original(z, state)
        recorded.append(out)
        return out

    with torch.no_grad():
        feats = target_features(target(input_ids=prompt, output_hidden_states=True).hidden_states,
                                draft.config.target_layer_ids)
        ctx = DraftContext()
        pos = torch.arange(a)[None]
        ctx.append(draft.context_kv(feats, pos), torch.ones(1, a, dtype=torch.bool), pos)
        draft.correction = recording
        proposal = draft_block(draft, target, bonus, torch.tensor([a]), ctx, n, draft.config.mask_token_id,
                               SamplingParams(temperature=0.0), None)
        del draft.correction
        seq = torch.cat([prompt, bonus[None], proposal.tokens], dim=1)
        lm = torch.zeros_like(seq)
        lm[0, a:] = 1
        anchors = Anchors(torch.tensor([[a]]), torch.tensor([[True]]))
        hidden = draft_forward(draft, target, Batch(seq, torch.ones_like(seq), lm), anchors)
        t = block_targets(seq, lm, anchors, bs, shift, 7.0)
        base, final = domino_logits(draft, hidden, target.get_output_embeddings(), target.get_input_embeddings(),
                                    seq, anchors, t)
    assert int(t.valid.sum()) == n
    # Slot order in `final` is the predicting slots in order: proposal j is final[j].
    assert torch.equal(final.argmax(-1), proposal.tokens[0])
    first = 0 if shift else 1
    base_ref = target.lm_head(hidden[0, first:first + n])
    torch.testing.assert_close(base, base_ref)
    torch.testing.assert_close(final[0], base_ref[0])          # first proposal: base logits only
    for j in range(1, n):
        torch.testing.assert_close(final[j], base_ref[j] + recorded[j - 1][0], atol=1e-4, rtol=1e-4)


def test_domino_loss_gives_gradients_to_backbone_and_head(target):
    target = copy.deepcopy(target).requires_grad_(False)  # frozen, as the trainer loads it
    draft = tiny_draft(target, "domino", block_size=4).train()
    ids, lm, _ = _setup()
    out = compute_loss(draft, target, Batch(ids, torch.ones_like(ids), lm), 4, torch.Generator().manual_seed(0),
                       7.0, lam=0.5)
    out.loss.backward()
    for name in ("fc.weight", "layers.0.mlp.up_proj.weight", "prefix_gru.weight_ih_l0", "embed_proj.2.weight"):
        grad = dict(draft.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert target.lm_head.weight.grad is None
