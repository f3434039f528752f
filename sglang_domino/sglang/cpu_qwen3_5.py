"""Pure-PyTorch CPU stand-ins for the ops SGLang 0.5.23's Qwen3.5 / Qwen3.6 model (the
Qwen3.6-27B card's `Qwen3_5ForConditionalGeneration` and its text-only
`Qwen3_5ForCausalLM`) binds on CPU at module import, `srt/models/qwen3_5.py:283-298`:

  * `fused_sigmoid_mul_cpu(x, gate)`: the gated attention output, x *= sigmoid(gate)
    (`:1637`; gate may be the strided per-head half of q_gate, `:1500`);
  * `fused_qk_gemma_rmsnorm_cpu`: per-head Gemma RMSNorm of q and k (`:1446`);
  * `fused_qk_gemma_rmsnorm_with_gate_cpu`: q_gate split per head into q and gate, then
    the same norm (`:1527`), i.e. `forward_prepare_native`'s split (`:1493-1503`);
  * `fused_qkvzba_split_reshape_cat_contiguous_cpu`: the GDN input split of Qwen3.5's
    contiguous [q | k | v | z], [b | a] projections (`:1029-1050`; the layout of the
    Triton `fused_qkvzba_split_reshape_cat_contiguous`,
    `kernels/ops/attention/triton_gdn_fused_proj.py:272`).

Plus `rms_norm_gated_forward`, the forward of the GDN output norm
(`kernels/ops/attention/fla/layernorm_gated.py:RMSNorm`, imported as `RMSNormGated` at
`qwen3_5.py:28`), which runs a Triton kernel on CPU unless Intel AMX; its formula is that
file's own `rms_norm_ref` (`:41`). Installed by `cpu_hybrid`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`GemmaRMSNorm.forward_native` (`srt/layers/layernorm.py:1152`): float32, weight as 1 + w."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    x.mul_(torch.sigmoid(gate.float()).reshape(x.shape).to(x.dtype))


def fused_qk_gemma_rmsnorm_cpu(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                               eps: float, head_dim: int):
    return (gemma_rms_norm(q.reshape(-1, head_dim), q_weight, eps),
            gemma_rms_norm(k.reshape(-1, head_dim), k_weight, eps))


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                                         k_weight: torch.Tensor, eps: float, head_dim: int, num_heads: int):
    per_head = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    q_out, k_out = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate.contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor,
                                                  num_heads_qk: int, num_heads_v: int, head_qk: int, head_v: int):
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    if mixed_qkvz.shape[-1] != qkv_dim + num_heads_v * head_v or mixed_ba.shape[-1] != 2 * num_heads_v:
        raise ValueError(f"qkvzba split: got widths {mixed_qkvz.shape[-1]} and {mixed_ba.shape[-1]}, expected "
                         f"{qkv_dim + num_heads_v * head_v} and {2 * num_heads_v}")
    tokens = mixed_qkvz.shape[0]
    return (mixed_qkvz[:, :qkv_dim].contiguous(),
            mixed_qkvz[:, qkv_dim:].reshape(tokens, num_heads_v, head_v).contiguous(),
            mixed_ba[:, :num_heads_v].contiguous(),
            mixed_ba[:, num_heads_v:].contiguous())


def rms_norm_gated_forward(self, x: torch.Tensor, z=None) -> torch.Tensor:
    """norm(x) * act(z) if `norm_before_gate`, else norm(x * act(z)); RMS over groups of
    `group_size` (the whole row when None); computed in float32, returned in x's dtype."""
    if self.activation in ("swish", "silu"):
        act = F.silu
    elif self.activation == "sigmoid":
        act = torch.sigmoid
    else:
        raise ValueError(f"RMSNormGated.activation: got {self.activation!r}, expected 'swish', 'silu' or 'sigmoid'")
    h = x.float()
    gate = None if z is None else act(z.float())
    if gate is not None and not self.norm_before_gate:
        h = h * gate
    group = self.group_size or h.shape[-1]
    grouped = h.reshape(*h.shape[:-1], h.shape[-1] // group, group)
    h = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(h.shape)
    h = h * self.weight.float()
    if getattr(self, "bias", None) is not None:
        h = h + self.bias.float()
    if gate is not None and self.norm_before_gate:
        h = h * gate
    return h.to(x.dtype)


def register(lib) -> None:
    """Define the four `torch.ops.sgl_kernel` ops on `lib` (a FRAGMENT of `sgl_kernel`)."""
    for schema, fn in (
        ("fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()", fused_sigmoid_mul_cpu),
        ("fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
         "int head_dim) -> (Tensor, Tensor)", fused_qk_gemma_rmsnorm_cpu),
        ("fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, "
         "float eps, int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)", fused_qk_gemma_rmsnorm_with_gate_cpu),
        ("fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
         "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
         fused_qkvzba_split_reshape_cat_contiguous_cpu),
    ):
        lib.define(schema)
        lib.impl(schema.split("(", 1)[0], fn, "CPU")
