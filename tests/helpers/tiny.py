"""Tiny target (+ byte-level BPE tokenizer) and drafts saved to disk for the SGLang tests.

Target: `sglang_domino.testing.tiny_target` with a 512-row embedding; the tokenizer has
fewer entries (TOKENIZER_VOCAB), so the drafts' mask id 511 is an unused embedding row.
"""

from __future__ import annotations

import os

from sglang_domino.testing import TINY_MASK_ID as MASK_ID
from sglang_domino.testing import TINY_TOKENIZER_VOCAB as TOKENIZER_VOCAB
from sglang_domino.testing import TINY_VOCAB as TARGET_VOCAB

# The target's lm_head keeps two opposite rows (+w, -w) and zeroes the others: greedy
# output is a context-dependent sequence over these two tokens, and a random draft
# guesses right about half the time, so verify steps commit several tokens (random
# drafts on a random target would accept nothing and leave the commit path idle).
LIVE_TOKENS = (300, 301)


def build_tokenizer():
    from sglang_domino.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    assert len(tokenizer) <= TOKENIZER_VOCAB < MASK_ID
    return tokenizer


def build_target(path: str, seed: int = 0):
    """Save the target model and its tokenizer to `path`; returns the HF model."""
    import torch

    from sglang_domino.testing import tiny_target

    model = tiny_target(seed=seed, vocab_size=TARGET_VOCAB, dtype=torch.float32)
    with torch.no_grad():
        w = model.lm_head.weight[LIVE_TOKENS[0]].clone()
        model.lm_head.weight.zero_()
        model.lm_head.weight[LIVE_TOKENS[0]] = w
        model.lm_head.weight[LIVE_TOKENS[1]] = -w
    model.config.dtype = "float32"
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return model


def build_draft(path: str, target, kind: str, block_size: int, seed: int = 1, **kwargs):
    from sglang_domino.testing import save_tiny_draft

    return save_tiny_draft(path, target, kind, block_size=block_size, seed=seed, **kwargs)


def build_legacy_domino(path: str, domino_path: str) -> None:
    """The same Domino draft as `domino_path`, exported the way older SpecForge versions
    did: architecture `DominoDraftModel`, `projector_type: causal_v5`, head weights under
    `logit_head.`, backbone weights under `model.`."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(domino_path, path)
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["architectures"] = ["DominoDraftModel"]
    cfg["dflash_config"]["projector_type"] = "causal_v5"
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    renamed = {}
    for key, value in tensors.items():
        if key.startswith(("prefix_gru.", "embed_proj.")):
            key = "logit_head." + key
        elif key.startswith("layers."):
            key = "model." + key
        renamed[key] = value
    save_file(renamed, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":  # python -m tests.helpers.tiny OUT_DIR
    import sys

    out = sys.argv[1]
    target = build_target(os.path.join(out, "target"))
    build_draft(os.path.join(out, "dflash"), target, "dflash", 16)
    build_draft(os.path.join(out, "domino"), target, "domino", 16)


# -- a target and a Domino draft whose first proposal's distributions are known exactly --
KNOWN_LOGIT_SCALE = 20.0
KNOWN_DRAFT_NORM = 1.5


def _silence_blocks(layers) -> None:
    """Zero every block's output projections: each layer adds nothing to the residual
    stream, so the final hidden state is the current token's embedding."""
    for layer in layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def build_known_pair(target_path: str, draft_path: str, seed: int = 0):
    """A bigram target, p(. | t) = softmax(lm_head(norm(E[t]))), and a Domino draft
    (block 16) whose blocks are silenced the same way, with its final norm scaled by
    KNOWN_DRAFT_NORM: its first proposal after bonus token t has q(. | t) =
    softmax(lm_head(norm_d(E[t]))), logits KNOWN_DRAFT_NORM times the target's, whatever
    the context. Returns (hf target, hf draft); `known_logits` gives both in closed form."""
    import torch

    from sglang_domino.testing import tiny_draft, tiny_target

    target = tiny_target(seed=seed, vocab_size=TARGET_VOCAB, logit_scale=KNOWN_LOGIT_SCALE, dtype=torch.float32)
    draft = tiny_draft(target, "domino", seed=seed + 1, block_size=16, mask_token_id=MASK_ID)
    with torch.no_grad():
        _silence_blocks(target.model.layers)
        _silence_blocks(draft.layers)
        draft.norm.weight.copy_(target.model.norm.weight * KNOWN_DRAFT_NORM)
    target.config.dtype = "float32"
    target.save_pretrained(target_path)
    build_tokenizer().save_pretrained(target_path)
    draft.save_pretrained(draft_path)
    return target, draft


def known_logits(target, draft):
    """[V, V] next-token logits after each token: the target's and the draft's first proposal's."""
    import torch

    emb = target.model.embed_tokens.weight.float()
    eps = target.config.rms_norm_eps
    normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + eps)
    head = target.lm_head.weight.float().T
    return (normed * target.model.norm.weight.float()) @ head, (normed * draft.norm.weight.float()) @ head


# -- a hybrid target: the architecture of the Qwen3.6-27B model card -------------------
# `Qwen3_5ForCausalLM` (the card's `Qwen3_5ForConditionalGeneration` without its vision
# tower): gated delta-net layers alternating with gated full attention, value heads twice
# the key heads (the card's ratio class, served by 0.5.23's fused split op on CPU).
HYBRID_LAYERS = ("linear_attention", "full_attention", "linear_attention", "full_attention")


def build_hybrid_target(path: str, seed: int = 0):
    """Save a tiny Qwen3.5 text target (the HYBRID_LAYERS pattern, float32, the LIVE_TOKENS
    head) and the tokenizer; returns the model."""
    from sglang_domino.testing import HYBRID_LIVE_TOKENS, save_tiny_hybrid_target

    assert HYBRID_LIVE_TOKENS == LIVE_TOKENS
    return save_tiny_hybrid_target(path, seed, num_layers=len(HYBRID_LAYERS), full_attention_interval=2)


def build_constant_dflash(path: str, target, token: int, block_size: int, seed: int = 2):
    """A DFlash draft that proposes `token` at every position of every block: its layers'
    output projections are zero, so each proposal is the target head applied to the draft's
    final norm of the mask embedding; the norm's sign picks which live token that is. With
    the LIVE_TOKENS target a verify then accepts exactly the run of `token`s the target
    produces next (at most the window), a known length at every step."""
    import torch

    from sglang_domino.testing import TINY_MASK_ID, tiny_draft

    draft = tiny_draft(target, "dflash", seed=seed, block_size=block_size, mask_token_id=TINY_MASK_ID)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        h = target.get_input_embeddings().weight[TINY_MASK_ID].float()
        h = h * torch.rsqrt(h.pow(2).mean() + draft.config.rms_norm_eps) * draft.norm.weight.float()
        if int((target.lm_head.weight.float() @ h).argmax()) != token:  # the head's rows are +w and -w
            draft.norm.weight.neg_()
            h = -h
        logits = target.lm_head.weight.float() @ h
    assert int(logits.argmax()) == token, logits[list(LIVE_TOKENS)]
    draft.save_pretrained(path)
    return draft
