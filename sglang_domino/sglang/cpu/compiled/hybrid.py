"""A hybrid Qwen3.5 / Qwen3.6 text target's layers compiled on CPU (gated delta-net and gated
attention, the Qwen3.6-27B model card's architecture).

The same graph as `layers.CompiledLayers` (pre-norm layers, the residual stream entering
each layer returned for DFLASH's context features), with Qwen3.5's parts: Gemma RMSNorms
(`GemmaRMSNorm.forward_native`), and two token mixers:

  * gated attention (`Qwen3_5AttentionDecoderLayer`): the qkv projection with the output
    gate interleaved per head, q and k normed per head and the gate split off
    (`qwen3_5_ops.fused_qk_gemma_rmsnorm_with_gate_cpu`, the CPU stand-in's own math, as
    upstream's CPU path calls it), the rotary embedding, upstream's attention behind the
    opaque `sglang_domino::cpu_attention`, the gate (`fused_sigmoid_mul_cpu`), o_proj;
  * gated delta-net (`Qwen3_5GatedDeltaNet`): the two input projections, the split
    (`fused_qkvzba_split_reshape_cat_contiguous_cpu`), upstream's linear-attention core
    behind the opaque `sglang_domino::cpu_linear_attention` (the conv and the recurrence
    over the mamba pool's states, the verify's per-position states that the replay
    rollback commits from: all of it runs as it runs eagerly), the gated output norm
    (`qwen3_5_ops.rms_norm_gated_forward`, the forward the CPU port installs on the
    layer's `RMSNormGated`), out_proj.

Everything else (the multimodal and MoE variants, other rotary embeddings, quantized
linears, pipeline parallelism, a norm the CPU stand-in did not replace) is refused at
start-up with the reason (`refusal`, `forward.refusal`).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import graph_ops, packed_linear
from .layers import CompiledLayers


def is_hybrid_target(model) -> bool:
    """The dense text-only Qwen3.5 target (`srt/models/qwen3_5_text.py`; not its MoE subclass)."""
    from sglang.srt.models.qwen3_5_text import Qwen3_5ForCausalLM

    return type(model) is Qwen3_5ForCausalLM


def _is_delta_net(layer) -> bool:
    return hasattr(layer, "linear_attn")


def _layer_refusal(layer) -> Optional[str]:
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import GemmaRMSNorm
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.mrope import MRotaryEmbedding
    from sglang.srt.models.qwen2_moe import Qwen2MoeMLP

    from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm as RMSNormGated

    from ..hybrid.runtime import standin_serving

    if type(layer.mlp) is not Qwen2MoeMLP or type(layer.mlp.act_fn) is not SiluAndMul:
        return "a mixture-of-experts or non-SiluAndMul MLP"
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if _is_delta_net(layer):
        mixer = layer.linear_attn
        if type(mixer.norm) is not RMSNormGated or not standin_serving():
            return "a gated delta-net output norm other than RMSNormGated served by the CPU port's stand-in"
    else:
        norms += [layer.q_norm, layer.k_norm]
        if type(layer.rotary_emb) not in (RotaryEmbedding, MRotaryEmbedding):
            return f"rotary embedding {type(layer.rotary_emb).__name__} (only RotaryEmbedding and MRotaryEmbedding)"
    linears = HybridLayers.projections(layer)
    if any(type(getattr(m, "quant_method", None)) is not UnquantizedLinearMethod for m in linears):
        return "quantized linear layers"
    if any(type(n) is not GemmaRMSNorm for n in norms):
        return "norms other than GemmaRMSNorm"
    if linears[0].weight.device.type != "cpu":
        return "weights not on the CPU"
    return None


def refusal(model) -> Optional[str]:
    """Why the hybrid target `model` cannot run compiled here (None: it can)."""
    if model.pp_group.world_size != 1:
        return "pipeline parallelism (--pp-size > 1)"
    if getattr(model, "pooler", None) is not None:
        return "a pointer-head (embedding) checkpoint"
    inner = model.model
    for layer in inner.layers[inner.start_layer:inner.end_layer]:
        reason = _layer_refusal(layer)
        if reason is not None:
            return reason
    return None


def warm_delta_rule(model, lengths, dtype: torch.dtype) -> float:
    """The CPU stand-in's delta rule (`gdn_ops.compile_rule`) compiled for the per-request
    lengths the target's decode and verify run, at this rank's heads; seconds taken."""
    from ..hybrid import gdn_ops

    inner = model.model
    mixers = [layer.linear_attn for layer in inner.layers[inner.start_layer:inner.end_layer] if _is_delta_net(layer)]
    if not mixers:
        return 0.0
    mixer = mixers[0]
    return gdn_ops.compile_rule(lengths, mixer.num_v_heads // mixer.attn_tp_size, mixer.head_v_dim, mixer.head_k_dim,
                                dtype)


class HybridLayers(CompiledLayers):
    """Qwen3.5's layers under one graph: `CompiledLayers` with its two token mixers."""

    @staticmethod
    def mixer(layer):
        if _is_delta_net(layer):
            return layer.linear_attn.attn, layer.linear_attn.out_proj
        return layer.attn, layer.o_proj

    @staticmethod
    def projections(layer) -> list:
        if _is_delta_net(layer):
            mixer = layer.linear_attn
            linears = [mixer.in_proj_qkvz, mixer.in_proj_ba, mixer.out_proj]
        else:
            linears = [layer.qkv_proj, layer.o_proj]
        return linears + [layer.mlp.gate_up_proj, layer.mlp.down_proj]

    def mix(self, i, layer, hidden, positions):
        return self._delta_net(i, layer.linear_attn, hidden) if _is_delta_net(layer) else \
            self._gated_attention(i, layer, hidden, positions)

    def _gated_attention(self, i, layer, hidden, positions):
        from ..hybrid.qwen3_5_ops import fused_qk_gemma_rmsnorm_cpu, fused_qk_gemma_rmsnorm_with_gate_cpu, \
            fused_sigmoid_mul_cpu

        rows = hidden.shape[0]
        qkv = packed_linear.project(hidden, layer.qkv_proj)
        eps, gate = layer.q_norm.variance_epsilon, None
        if layer.attn_output_gate:
            q_gate, k, v = qkv.split([layer.q_size * 2, layer.kv_size, layer.kv_size], dim=-1)
            q, k, gate = fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, layer.q_norm.weight, layer.k_norm.weight,
                                                              eps, layer.head_dim, layer.num_heads)
            q, k, gate = q.view(rows, -1), k.view(rows, -1), gate.view(rows, -1)
        else:
            q, k, v = qkv.split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
            q, k = fused_qk_gemma_rmsnorm_cpu(q, k, layer.q_norm.weight, layer.k_norm.weight, eps, layer.head_dim)
        q, k = layer.rotary_emb.forward_native(positions, q, k)
        out = torch.ops.sglang_domino.cpu_attention(q, k, v.contiguous(), i)
        if gate is not None:
            fused_sigmoid_mul_cpu(out, gate)
        return graph_ops.row_parallel(layer.o_proj, self.reduce[i][0], out)

    def _delta_net(self, i, mixer, hidden):
        from ..hybrid.qwen3_5_ops import fused_qkvzba_split_reshape_cat_contiguous_cpu, rms_norm_gated_forward

        rows, tp = hidden.shape[0], mixer.attn_tp_size
        heads_k, heads_v = mixer.num_k_heads // tp, mixer.num_v_heads // tp
        qkvz = packed_linear.project(hidden, mixer.in_proj_qkvz)
        ba = packed_linear.project(hidden, mixer.in_proj_ba)
        mixed_qkv, z, b, a = fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, heads_k, heads_v,
                                                                           mixer.head_k_dim, mixer.head_v_dim)
        core = torch.ops.sglang_domino.cpu_linear_attention(mixed_qkv, a, b, i, heads_v * mixer.head_v_dim)
        # the norm's forward as the CPU port installs it (`seam/patches.py`, row rms_norm_gated)
        out = rms_norm_gated_forward(mixer.norm, core.reshape(-1, mixer.head_v_dim), z.reshape(-1, mixer.head_v_dim))
        return graph_ops.row_parallel(mixer.out_proj, self.reduce[i][0], out.reshape(rows, -1))


__all__ = ["HybridLayers", "is_hybrid_target", "refusal", "warm_delta_rule"]
