"""The DFlash draft backbone and the Domino correction head, as plain PyTorch modules.

No generation logic lives here: backends (Transformers loop, trainer, SGLang worker)
build the attention masks and caches and call these modules. Parameter names match
the released checkpoints (no `model.` prefix), see `checkpoint.py`.

Attention follows DFlash: block queries attend to the context K/V (projected target
hidden states) and to the block's own K/V; the same k/v projections serve both. The
caller passes one boolean mask per layer type, so inference (bidirectional block over a
cache) and training (many blocks over a whole sequence) run the same code.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from .config import DraftConfig

KV = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Qwen3's default (non-interleaved, rotate-half) rotary embedding."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [b, L] -> cos, sin [b, 1, L, head_dim] (broadcast over heads)."""
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.kv_heads
        self.head_dim = cfg.head_size
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, n, self.head_dim).transpose(1, 2)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """K/V of tokens `x` [b, L, H] (context or block): k_norm then RoPE on K; V raw."""
        k = self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads))
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        return apply_rotary(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: KV,
                mask: torch.Tensor) -> torch.Tensor:
        q = apply_rotary(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)
        k_blk, v_blk = self.key_value(x, cos, sin)
        k = torch.cat([context[0], k_blk], dim=2)
        v = torch.cat([context[1], v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        b, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, context: KV, mask) -> torch.Tensor:
        # The context K/V were made from hidden_norm(fc(target)) directly: DFlash never
        # passes the context through input_layernorm.
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftModel(nn.Module):
    """DFlash backbone (optionally with the Domino head). Owns no embedding and no LM head:
    both are the target's."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        k = len(config.target_layer_ids)
        self.layers = nn.ModuleList(DraftLayer(config, t) for t in config.resolved_layer_types)
        self.fc = nn.Linear(k * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary_emb = Rotary(config.head_size, config.rope_base)
        self.is_domino = config.is_domino
        if self.is_domino:
            g, e = config.dflash_config.gru_hidden_dim, config.dflash_config.emb_dim
            self.prefix_gru = nn.GRU(input_size=h, hidden_size=g, num_layers=1, batch_first=True, bias=False)
            self.embed_proj = nn.Sequential(nn.Linear(h + g, e, bias=False), nn.SiLU(),
                                            nn.Linear(e, config.vocab_size, bias=False))

    @property
    def layer_types(self) -> set[str]:
        return {layer.layer_type for layer in self.layers}

    def context_kv(self, target_hidden: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Per-layer context K/V from target hidden states [b, S, K*H] at `positions` [b, S]."""
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        cos, sin = self.rotary_emb(positions, ctx.dtype)
        return [layer.self_attn.key_value(ctx, cos, sin) for layer in self.layers]

    def forward(self, noise_embedding: torch.Tensor, positions: torch.Tensor, context: list[KV],
                masks: dict[str, torch.Tensor]) -> torch.Tensor:
        """noise_embedding [b, Q, H] at `positions` [b, Q]; masks[layer_type] is a boolean
        [b, 1, Q, S+Q] (True = may attend) over context then block keys. Returns the
        final-normed hidden states of the Q block tokens."""
        x = noise_embedding.to(self.fc.weight.dtype)
        cos, sin = self.rotary_emb(positions, x.dtype)
        for layer, kv in zip(self.layers, context):
            x = layer(x, cos, sin, kv, masks[layer.layer_type])
        return self.norm(x)

    # -- Domino correction head ----------------------------------------------------------
    # logits_k = lm_head(z_k) + embed_proj([z_k ; s_k]), s_k the GRU state after the
    # embeddings of every token before the one being predicted.
    def correction(self, z: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.embed_proj(torch.cat([z, state.to(z.dtype)], dim=-1))

    def run_gru(self, token_embeds: torch.Tensor) -> torch.Tensor:
        """Every GRU state over `token_embeds` [b, T, H] from a zero state -> [b, T, G]."""
        out, _ = self.prefix_gru(token_embeds.to(self.prefix_gru.weight_ih_l0.dtype))
        return out

    def gru_step(self, token_embed: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        # gru_cell skips nn.GRU's per-call weight flattening on a one-token step.
        w_ih = self.prefix_gru.weight_ih_l0
        return torch.gru_cell(token_embed.to(w_ih.dtype), state, w_ih, self.prefix_gru.weight_hh_l0)
