import pytest
import torch

from sglang_domino.model import DraftModel
from sglang_domino.rollout import propose_domino
from sglang_domino.sampling import SamplingParams, sample, to_probs
from sglang_domino.testing import tiny_draft, tiny_draft_config


def run(draft, feats, block, ctx_valid, sliding=None):
    b, s, _ = feats.shape
    q = block.shape[1]
    ctx = draft.context_kv(feats, torch.arange(s).expand(b, s))
    full = torch.cat([ctx_valid[:, None, :].expand(b, q, s), torch.ones(b, q, q, dtype=torch.bool)], dim=2)[:, None]
    causal = torch.cat([ctx_valid[:, None, :].expand(b, q, s), torch.ones(q, q, dtype=torch.bool).tril().expand(b, q, q)], dim=2)[:, None]
    return draft(block, torch.arange(s, s + q).expand(b, q), ctx, {"full_attention": full, "sliding_attention": causal})


@pytest.fixture
def inputs(target):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 6, 2 * 64, generator=g)
    block = torch.randn(2, 8, 64, generator=g)
    return feats, block


def test_masked_context_slots_are_invisible(target, inputs):
    draft = tiny_draft(target, "dflash")
    feats, block = inputs
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[:, 2] = False
    changed = feats.clone()
    changed[:, 2] += 5.0
    torch.testing.assert_close(run(draft, feats, block, valid), run(draft, changed, block, valid))
    valid[:, 2] = True
    assert not torch.allclose(run(draft, feats, block, valid), run(draft, changed, block, valid))


def test_block_is_bidirectional_for_full_and_causal_for_sliding_layers(target, inputs):
    feats, block = inputs
    later = block.clone()
    later[:, -1] += 3.0
    valid = torch.ones(2, 6, dtype=torch.bool)
    full = tiny_draft(target, "dflash")
    assert not torch.allclose(run(full, feats, block, valid)[:, 0], run(full, feats, later, valid)[:, 0])
    sliding = tiny_draft(target, "dflash", layer_types=["sliding_attention"] * 2, sliding_window=64)
    out, out_later = run(sliding, feats, block, valid), run(sliding, feats, later, valid)
    torch.testing.assert_close(out[:, :-1], out_later[:, :-1])
    assert not torch.allclose(out[:, -1], out_later[:, -1])


def test_layer_matches_transformers_qwen3_layer_without_context(target):
    """With no context and a bidirectional mask a draft layer is a Qwen3 decoder layer:
    this pins the norm, RoPE and GQA conventions to Transformers' own."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    cfg = tiny_draft_config(target, "dflash", num_layers=1)
    draft = DraftModel(cfg).eval()
    hf_cfg = Qwen3Config(**{k: getattr(target.config, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                   "num_attention_heads", "num_key_value_heads", "head_dim",
                                                                   "rms_norm_eps")}, num_hidden_layers=1,
                         rope_parameters={"rope_theta": cfg.rope_base, "rope_type": "default"})
    hf_cfg._attn_implementation = "eager"
    layer = Qwen3DecoderLayer(hf_cfg, layer_idx=0).eval()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in draft.state_dict().items() if k.startswith("layers.0.")})
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(3, 10).expand(2, 7)
    cos, sin = Qwen3RotaryEmbedding(hf_cfg)(x, pos)
    expected = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
    expected = expected[0] if isinstance(expected, tuple) else expected
    empty = [(torch.zeros(2, 2, 0, 16), torch.zeros(2, 2, 0, 16))]
    mine_cos, mine_sin = draft.rotary_emb(pos, x.dtype)
    got = draft.layers[0](x, mine_cos, mine_sin, empty[0], torch.ones(2, 1, 7, 7, dtype=torch.bool))
    torch.testing.assert_close(got, expected)


def naive_domino(draft, embed, hidden, base, bonus, params, g):
    """Domino's head written the slow way: the GRU re-run over the whole prefix at every step."""
    tokens, probs = [], []
    for k in range(hidden.shape[1]):
        logits = base[:, k].float()
        if k > 0:
            prefix = torch.stack([bonus] + tokens, dim=1)
            state = draft.prefix_gru(embed(prefix))[0][:, -1]
            logits = logits + draft.embed_proj(torch.cat([hidden[:, k], state], -1)).float()
        if params.greedy:
            tokens.append(logits.argmax(-1))
        else:
            p = to_probs(logits, params)
            tokens.append(sample(p, g))
            probs.append(p)
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, top_k=50)])
def test_domino_rollout_matches_naive_head(target, params):
    draft = tiny_draft(target, "domino")
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(3, 7, 64, generator=g)
    base = lm_head(hidden)
    bonus = torch.tensor([5, 17, 200])
    with torch.no_grad():
        got = propose_domino(hidden, base, bonus, embed, draft, params, torch.Generator().manual_seed(4))
        want_tokens, want_probs = naive_domino(draft, embed, hidden, base, bonus, params, torch.Generator().manual_seed(4))
    assert torch.equal(got.tokens, want_tokens)
    if params.greedy:
        assert got.probs is None
        # The correction matters: plain DFlash argmax differs somewhere after the first slot.
        assert not torch.equal(got.tokens[:, 1:], base[:, 1:].argmax(-1))
        assert torch.equal(got.tokens[:, 0], base[:, 0].argmax(-1))
    else:
        torch.testing.assert_close(got.probs, want_probs)
