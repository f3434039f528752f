"""The trainer's one-forward-for-all-blocks equals running each block alone the way
inference does (context = target features strictly before the anchor)."""

import pytest
import torch

from sglang_domino.hf.generate import target_features
from sglang_domino.hf.state import DraftContext
from sglang_domino.testing import tiny_draft
from sglang_domino.train.anchors import Anchors
from sglang_domino.train.data import Batch
from sglang_domino.train.loop import draft_forward


@pytest.mark.parametrize("layer_types", [["full_attention", "full_attention"], ["sliding_attention", "full_attention"]])
def test_all_blocks_in_one_forward_equal_one_block_at_a_time(target, layer_types):
    extra = {"layer_types": layer_types}
    if "sliding_attention" in layer_types:
        extra["sliding_window"] = 5
    draft = tiny_draft(target, "dflash", block_size=4, num_layers=2, **extra)
    ids = torch.randint(0, 250, (2, 14), generator=torch.Generator().manual_seed(3))
    attn = torch.ones_like(ids)
    attn[1, 12:] = 0  # right padding
    anchors = Anchors(torch.tensor([[0, 3, 9], [5, 8, 0]]), torch.tensor([[True, True, True], [True, True, False]]))
    with torch.no_grad():
        hidden = draft_forward(draft, target, Batch(ids, attn, attn), anchors)
        feats = target_features(target(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states,
                                draft.config.target_layer_ids)
        embed = target.get_input_embeddings()
        mask_id = draft.config.mask_token_id
        for r in range(2):
            for n in range(3):
                if not anchors.keep[r, n]:
                    continue
                a = int(anchors.positions[r, n])
                block = torch.full((1, 4), mask_id)
                block[0, 0] = ids[r, a]
                pos = torch.arange(a, a + 4)[None]
                ctx = DraftContext()
                if a > 0:
                    ctx_pos = torch.arange(a)[None]
                    ctx.append(draft.context_kv(feats[r:r + 1, :a], ctx_pos), torch.ones(1, a, dtype=torch.bool), ctx_pos)
                else:  # no context yet: an empty (all-masked) context slot
                    ctx_pos = torch.zeros(1, 1, dtype=torch.long)
                    ctx.append(draft.context_kv(feats[r:r + 1, :1], ctx_pos), torch.zeros(1, 1, dtype=torch.bool), ctx_pos)
                masks = ctx.masks(pos, draft.layer_types, draft.config.sliding_window)
                ref = draft(embed(block), pos, ctx.kv, masks)
                got = hidden[r, n * 4:(n + 1) * 4]
                torch.testing.assert_close(got, ref[0], atol=1e-5, rtol=1e-4)
