"""Tiny models built on the fly, for the tests and `benchmarks/hf_cpu.py` (no download, no GPU)."""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from .config import DraftConfig


def tiny_target(seed: int = 0, vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 4,
                dtype: torch.dtype = torch.float32, logit_scale: float = 8.0):
    """A randomly initialised Qwen3 causal LM (Transformers), in eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden_size // 4, max_position_embeddings=4096, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(dtype).eval()
    # Random init gives near-uniform logits; a larger output scale makes the greedy
    # choice well separated, so fp32 equality tests never sit on near-ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def tiny_draft_config(target, kind: str = "dflash", block_size: int = 8, num_layers: int = 2,
                      shift_label: bool = True, target_layer_ids: Optional[list[int]] = None,
                      mask_token_id: Optional[int] = None, **overrides: Any) -> DraftConfig:
    """A draft config matching `target`: `kind` is 'dflash' or 'domino'."""
    t = target.config
    data = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab_size,
        "rms_norm_eps": t.rms_norm_eps,
        "max_position_embeddings": t.max_position_embeddings,
        "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "block_size": block_size,
        "num_target_layers": t.num_hidden_layers,
        "dflash_config": {
            "mask_token_id": t.vocab_size - 1 if mask_token_id is None else mask_token_id,
            "target_layer_ids": target_layer_ids or list(range(min(num_layers, t.num_hidden_layers - 1))),
        },
    }
    if kind == "domino":
        data["dflash_config"].update(projector_type="domino", shift_label=shift_label, pure_draft_prefix_len=1,
                                     gru_hidden_dim=32, emb_dim=16)
        data["emb_dim"] = 16
    elif kind != "dflash":
        raise ValueError(f"kind: got {kind!r}, expected 'dflash' or 'domino'")
    for key, value in overrides.items():
        if key in ("dflash_config",):
            data[key].update(value)
        else:
            data[key] = value
    return DraftConfig.from_dict(copy.deepcopy(data))


def tiny_draft(target, kind: str = "dflash", seed: int = 1, dtype: torch.dtype = torch.float32, **kwargs):
    """A randomly initialised `DFlashDraftModel` for `target`."""
    from .hf import DFlashDraftModel

    config = tiny_draft_config(target, kind, **kwargs)
    torch.manual_seed(seed)
    return DFlashDraftModel(config).to(dtype).eval()


# -- tiny checkpoints on disk (target + tokenizer, drafts), for servers and scripts ---------
TINY_VOCAB = 512            # target embedding rows
TINY_TOKENIZER_VOCAB = 500  # fewer tokenizer entries, so the mask id 511 is an unused row
TINY_MASK_ID = TINY_VOCAB - 1
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about rivers mountains "
          "cities numbers letters and code in the morning light every day people write programs that "
          "print hello world then count from one to ten").split()


def tiny_tokenizer():
    """A byte-level BPE tokenizer (Transformers fast tokenizer) with a ChatML-style template."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) + rng.choice([".", "!", "?", ""])
              for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_TOKENIZER_VOCAB, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   model_max_length=4096)
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def save_tiny_target(path: str, seed: int = 0):
    """Save a tiny target and its tokenizer to `path`; returns the model."""
    model = tiny_target(seed=seed, vocab_size=TINY_VOCAB)
    model.config.dtype = "float32"
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


def save_tiny_draft(path: str, target, kind: str, block_size: int = 8, seed: int = 1, **kwargs):
    """Save a tiny draft for `target` (mask id: an unused embedding row) to `path`."""
    draft = tiny_draft(target, kind, seed=seed, block_size=block_size, mask_token_id=TINY_MASK_ID, **kwargs)
    draft.save_pretrained(path)
    return draft


# The hybrid targets' lm_head keeps two opposite rows (+w, -w) and zeroes the others: greedy
# output is a context-dependent sequence over these two tokens, and a random draft guesses
# right about half the time, so verifies commit varying prefixes.
HYBRID_LIVE_TOKENS = (300, 301)


def save_tiny_hybrid_target(path: str, seed: int = 0, *, num_layers: int = 4, full_attention_interval: int = 2,
                            hidden_size: int = 64, attn_heads: int = 4, kv_heads: int = 2, attn_head_dim: int = 16,
                            key_heads: int = 2, value_heads: int = 4, head_dim: int = 16, conv_kernel: int = 4,
                            a_log: Optional[float] = None, linear_out_scale: float = 1.0):
    """Save a tiny Qwen3.5 text target (every `full_attention_interval`-th layer gated
    attention, the others gated delta-net with `value_heads` / `key_heads` heads of
    `head_dim`; float32; the HYBRID_LIVE_TOKENS head) and the tiny tokenizer to `path`;
    returns the model. `a_log` (every delta-net layer's A_log) and `linear_out_scale` (on
    their output projections) make the recurrent state matter: near -4 the state barely
    decays, and a louder write makes the output depend on it."""
    import json
    import os

    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    types = ["full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
             for i in range(num_layers)]
    config = Qwen3_5TextConfig(
        vocab_size=TINY_VOCAB, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, layer_types=types, num_attention_heads=attn_heads,
        num_key_value_heads=kv_heads, head_dim=attn_head_dim, linear_conv_kernel_dim=conv_kernel,
        linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        # At the default init the last token's embedding dominates the residual stream and
        # greedy output settles on one token for good; a smaller embedding and larger layer
        # weights make it follow the context (runs of 1-4 of each live token).
        model.model.embed_tokens.weight.mul_(0.2)
        for param in model.model.layers.parameters():
            if param.dim() == 2:
                param.mul_(5.0)
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                if a_log is not None:
                    layer.linear_attn.A_log.fill_(a_log)
                if linear_out_scale != 1.0:
                    layer.linear_attn.out_proj.weight.mul_(linear_out_scale)
        w = model.lm_head.weight[HYBRID_LIVE_TOKENS[0]].clone() * 8.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[HYBRID_LIVE_TOKENS[0]] = w
        model.lm_head.weight[HYBRID_LIVE_TOKENS[1]] = -w
    model.config.dtype = "float32"
    model.save_pretrained(path)
    # 0.5.23 reads the layer pattern from `full_attention_interval` (`configs/qwen3_next.py:264`)
    # and the rotary base from `rope_theta`, as the published Qwen3.5 configs carry them.
    with open(os.path.join(path, "config.json")) as fh:
        saved = json.load(fh)
    saved.update(full_attention_interval=full_attention_interval, rope_theta=saved["rope_parameters"]["rope_theta"])
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(saved, fh, indent=2)
    tiny_tokenizer().save_pretrained(path)
    return model
