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


if __name__ == "__main__":  # python tests/sglang/tiny.py OUT_DIR
    import sys

    out = sys.argv[1]
    target = build_target(os.path.join(out, "target"))
    build_draft(os.path.join(out, "dflash"), target, "dflash", 16)
    build_draft(os.path.join(out, "domino"), target, "domino", 16)
