"""A fresh draft for a target: its config (sizes copied from the target, so the target's
embedding and LM head fit it) and its initial weights."""

from __future__ import annotations

import json
from typing import Optional

import torch
from torch import nn

from ..config import DraftConfig
from .config import TrainConfig


def default_mask_token_id(vocab_size: int, tokenizer_size: Optional[int]) -> int:
    """An embedding row the tokenizer never produces (Qwen3 drafts use len(tokenizer))."""
    if tokenizer_size is None or tokenizer_size >= vocab_size:
        raise ValueError(f"mask_token_id: not given, and the target's {vocab_size} embedding rows leave none "
                         f"unused by a tokenizer of {tokenizer_size} tokens; pass --mask-token-id")
    return vocab_size - 1


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> Optional[list[int]]:
    """None (the config's standard rule) where that rule applies, else evenly spaced layers
    below the last one (the rule needs >= 4 target layers)."""
    if num_draft_layers == 1 or num_target_layers >= 4:
        return None
    usable = max(num_target_layers - 1, 1)
    return sorted({round((i + 1) * usable / num_draft_layers) - 1 for i in range(num_draft_layers)})


def draft_config_for(target_config, cfg: TrainConfig, tokenizer_size: Optional[int]) -> DraftConfig:
    t = getattr(target_config, "get_text_config", lambda: target_config)()
    if cfg.draft_config:
        with open(cfg.draft_config, encoding="utf-8") as fh:
            return DraftConfig.from_dict(json.load(fh))
    rope = dict(getattr(t, "rope_parameters", None) or {})
    rope.setdefault("rope_theta", getattr(t, "rope_theta", 1_000_000.0) or 1_000_000.0)
    rope.setdefault("rope_type", "default")
    section = {
        "mask_token_id": cfg.mask_token_id if cfg.mask_token_id is not None
        else default_mask_token_id(t.vocab_size, tokenizer_size),
    }
    layer_ids = cfg.target_layer_ids or default_layer_ids(t.num_hidden_layers, cfg.num_draft_layers)
    if layer_ids is not None:
        section["target_layer_ids"] = list(layer_ids)
    data = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t.hidden_size,
        "intermediate_size": cfg.draft_intermediate_size or t.intermediate_size,
        "num_hidden_layers": cfg.num_draft_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
        "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        "vocab_size": t.vocab_size,
        "rms_norm_eps": getattr(t, "rms_norm_eps", 1e-6),
        "max_position_embeddings": getattr(t, "max_position_embeddings", 40960),
        "rope_parameters": {"rope_theta": float(rope["rope_theta"]), "rope_type": rope["rope_type"]},
        "layer_types": ["full_attention"] * cfg.num_draft_layers,
        "use_sliding_window": False,
        "block_size": cfg.block_size,
        "num_target_layers": t.num_hidden_layers,
        "dflash_config": section,
    }
    if cfg.kind == "domino":
        section.update(projector_type="domino", shift_label=cfg.shift_label, pure_draft_prefix_len=1,
                       gru_hidden_dim=cfg.gru_hidden_dim, emb_dim=cfg.emb_dim)
        data["emb_dim"] = cfg.emb_dim
    return DraftConfig.from_dict(data)


@torch.no_grad()
def init_weights(draft: nn.Module, std: float = 0.02) -> None:
    """Qwen-style init (normal linear weights, unit norms); the GRU keeps PyTorch's init.
    The correction's output layer starts at zero, so an untrained head leaves the base
    logits untouched while lambda is still near 1."""
    for module in draft.modules():
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
    if getattr(draft, "is_domino", False):
        draft.embed_proj[2].weight.zero_()
