"""Pure-PyTorch CPU stand-ins for the Qwen3.5 ops SGLang 0.5.23 takes from `sgl_kernel`
(the real ones are C++ kernels in the CPU build of `sgl_kernel`, which PyPI does not ship).

`srt/models/qwen3_5.py` looks up four `torch.ops.sgl_kernel.*` ops *at module import* when
`_is_cpu`, so they must be registered before that module loads, even for a Qwen3.5
checkpoint that never reaches them. Registered by `register(lib)` (meant for
`kernel_standin.register_torch_ops`):

  * `fused_sigmoid_mul_cpu`            in place `x *= sigmoid(gate)`: the attention output
    gate (the module's `fused_sigmoid_mul` wrapper, called in
    `Qwen3_5AttentionDecoderLayer.self_attention`). Reference: the Triton
    `kernels/ops/elementwise/elementwise.fused_sigmoid_mul`, which takes a 2-D gate or the
    3-D strided `[seq, heads, head_dim]` view `forward_prepare_native` makes;
  * `fused_qk_gemma_rmsnorm_cpu`       per-head Gemma RMSNorm of q and k
    (`Qwen3_5AttentionDecoderLayer._apply_qk_norm`); reference: the `q_norm` / `k_norm`
    `GemmaRMSNorm.forward_native` path below it (`srt/layers/layernorm`);
  * `fused_qk_gemma_rmsnorm_with_gate_cpu` (`forward_prepare_fused_gate`):
    deinterleave q_gate (`[q_h0, gate_h0, q_h1, ...]`) and norm q and k per head;
    reference: `forward_prepare_native`;
  * `fused_qkvzba_split_reshape_cat_contiguous_cpu` (`Qwen3_5GatedDeltaNet.forward`): the
    GDN input split; reference: `fix_query_key_value_ordering` plus the reshape/cat after
    it, and the Triton `triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous`.

Schemas and output shapes follow the real `sgl_kernel` CPU ops, because SGLang's own
torch.compile fakes for them (`srt/model_executor/cpu_graph_runner.register_fake_ops`) assume
those shapes; for that reason no fake kernels are registered here (SGLang registers them
and a second registration would raise).

The gated RMSNorms have no `sgl_kernel` op without AMX: `layernorm_gated.RMSNorm.forward`
(`kernels/ops/attention/fla/`, Qwen3.5's GDN output norm, imported there as
`RMSNormGated`) and `fused_norm_gate.FusedRMSNormGated.forward` (Qwen3-Next's) launch
Triton kernels unless `cpu_has_amx_support()`, which needs the real `sgl_kernel`.
`rms_norm_gated_forward` and `fused_rms_norm_gated_forward` replace those methods
(installed by `hybrid`).

Only torch is imported at module level: this module is loaded while the `sgl_kernel`
stand-in is built, before SGLang is initialised.
"""

from __future__ import annotations

from typing import Optional

import torch

SCHEMAS = {
    "fused_sigmoid_mul_cpu": "fused_sigmoid_mul_cpu(Tensor(a!) input, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": (
        "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
        "float eps, int head_dim) -> (Tensor, Tensor)"
    ),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, "
        "Tensor k_weight, float eps, int head_dim, int num_head) -> (Tensor, Tensor, Tensor)"
    ),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, "
        "int num_heads_qk, int num_heads_v, int head_qk, int head_v) "
        "-> (Tensor, Tensor, Tensor, Tensor)"
    ),
}


def _fresh(t: torch.Tensor) -> torch.Tensor:
    # The kernels write into new buffers; a bare `.contiguous()` could hand back an alias
    # of the input (one-row batches), which later in-place consumers would then corrupt.
    return t.clone(memory_format=torch.contiguous_format)


def fused_sigmoid_mul_cpu(input: torch.Tensor, gate: torch.Tensor) -> None:
    """`input *= sigmoid(gate)`, computed in float32 and stored in `input`'s dtype.
    `gate` is `input`'s shape, or `[tokens, heads, head_dim]` (any strides) for a
    `[tokens, heads * head_dim]` input."""
    if gate.dim() == 3 and input.dim() == 2:
        tokens, heads, head_dim = gate.shape
        if tuple(input.shape) != (tokens, heads * head_dim):
            raise ValueError(f"fused_sigmoid_mul_cpu: input {tuple(input.shape)} does not match gate {tuple(gate.shape)}")
        gate = gate.reshape(tokens, heads * head_dim)
    elif input.shape != gate.shape:
        raise ValueError(f"fused_sigmoid_mul_cpu: input {tuple(input.shape)} and gate {tuple(gate.shape)} differ")
    input.copy_(input.float() * torch.sigmoid(gate.float()))


def gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim with the Gemma `(1 + weight)` scale, in float32, result in
    `x`'s dtype (operation order of `GemmaRMSNorm.forward_native`)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def _heads(x: torch.Tensor, head_dim: int, name: str) -> torch.Tensor:
    if x.dim() != 2 or head_dim <= 0 or x.shape[-1] % head_dim:
        raise ValueError(f"{name}: expected [tokens, heads * {head_dim}], got {tuple(x.shape)}")
    return x.reshape(-1, head_dim)


def fused_qk_gemma_rmsnorm_cpu(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                               k_weight: torch.Tensor, eps: float, head_dim: int):
    """Per-head Gemma RMSNorm of `q` `[T, Hq * D]` and `k` `[T, Hk * D]` (strided views of
    the qkv projection allowed); outputs are new contiguous tensors of `q`'s and `k`'s
    shapes, as the real op's `empty_like` outputs are."""
    name = "fused_qk_gemma_rmsnorm_cpu"
    q_out = gemma_rmsnorm(_heads(q, head_dim, name), q_weight, eps).reshape(q.shape)
    k_out = gemma_rmsnorm(_heads(k, head_dim, name), k_weight, eps).reshape(k.shape)
    return q_out, k_out


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate: torch.Tensor, k: torch.Tensor,
                                         q_weight: torch.Tensor, k_weight: torch.Tensor,
                                         eps: float, head_dim: int, num_head: int):
    """`q_gate` `[T, H * 2D]` holds `[q_h, gate_h]` per head: returns normed q
    `[T * H, D]`, normed k `[T * Hk, D]` and gate `[T * H, D]`, all contiguous (the caller
    `.view(T, -1)`s each)."""
    name = "fused_qk_gemma_rmsnorm_with_gate_cpu"
    if q_gate.dim() != 2 or q_gate.shape[-1] != num_head * head_dim * 2:
        raise ValueError(f"{name}: q_gate {tuple(q_gate.shape)} is not [tokens, {num_head} * 2 * {head_dim}]")
    per_head = q_gate.reshape(q_gate.shape[0], num_head, 2 * head_dim)
    q = per_head[..., :head_dim].reshape(-1, head_dim)
    # A contiguous q_gate makes this reshape a strided view (row stride 2D), which
    # `.view(T, -1)` at the call site rejects, so the copy is forced.
    gate = _fresh(per_head[..., head_dim:].reshape(-1, head_dim))
    q_out = gemma_rmsnorm(q, q_weight, eps)
    k_out = gemma_rmsnorm(_heads(k, head_dim, name), k_weight, eps)
    return q_out, k_out, gate


def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor,
                                                  num_heads_qk: int, num_heads_v: int,
                                                  head_qk: int, head_v: int):
    """Split Qwen3.5's contiguous projections `mixed_qkvz = [all_q | all_k | all_v | all_z]`
    and `mixed_ba = [all_b | all_a]` (no per-key-head grouping, unlike Qwen3-Next's
    interleaved layout) into new contiguous `mixed_qkv [T, 2*Hk*Dk + Hv*Dv]`,
    `z [T, Hv, Dv]`, `b [T, Hv]`, `a [T, Hv]`."""
    name = "fused_qkvzba_split_reshape_cat_contiguous_cpu"
    k_dim, v_dim = num_heads_qk * head_qk, num_heads_v * head_v
    qkv_dim = 2 * k_dim + v_dim
    if mixed_qkvz.dim() != 2 or mixed_qkvz.shape[-1] != qkv_dim + v_dim:
        raise ValueError(f"{name}: mixed_qkvz {tuple(mixed_qkvz.shape)} is not [tokens, {qkv_dim + v_dim}]")
    if mixed_ba.dim() != 2 or mixed_ba.shape != (mixed_qkvz.shape[0], 2 * num_heads_v):
        raise ValueError(f"{name}: mixed_ba {tuple(mixed_ba.shape)} is not [{mixed_qkvz.shape[0]}, {2 * num_heads_v}]")
    mixed_qkv = _fresh(mixed_qkvz[:, :qkv_dim])
    z = _fresh(mixed_qkvz[:, qkv_dim:].unflatten(-1, (num_heads_v, head_v)))
    b = _fresh(mixed_ba[:, :num_heads_v])
    a = _fresh(mixed_ba[:, num_heads_v:])
    return mixed_qkv, z, b, a


IMPLS = {
    "fused_sigmoid_mul_cpu": fused_sigmoid_mul_cpu,
    "fused_qk_gemma_rmsnorm_cpu": fused_qk_gemma_rmsnorm_cpu,
    "fused_qk_gemma_rmsnorm_with_gate_cpu": fused_qk_gemma_rmsnorm_with_gate_cpu,
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": fused_qkvzba_split_reshape_cat_contiguous_cpu,
}


def register(lib) -> None:
    """Define and implement (CPU) the four ops on `lib`, a `Library("sgl_kernel",
    "FRAGMENT")` (or a FRAGMENT of another namespace, as the tests use). An op that already
    exists in that namespace is left alone: two registrations may meet in one process, and
    a second `define` would raise."""
    namespace = getattr(torch.ops, lib.ns)
    for name, schema in SCHEMAS.items():
        if hasattr(namespace, name):
            continue
        lib.define(schema)
        lib.impl(name, IMPLS[name], "CPU")


def _gate(z: torch.Tensor, activation: str, where: str) -> torch.Tensor:
    if activation in ("swish", "silu"):
        return z * torch.sigmoid(z)
    if activation == "sigmoid":
        return torch.sigmoid(z)
    # The Triton kernels silently skip the gate for any other name; an ungated output
    # would be wrong without a trace, so refuse instead.
    raise ValueError(f"{where}: unsupported gate activation {activation!r}")


def rms_norm_gated_forward(self, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`layernorm_gated.RMSNorm.forward` (the Triton `rms_norm_gated(..., is_rms_norm=True)`)
    in torch: RMSNorm over groups of `self.group_size` (the whole last dim when None), times
    `self.weight` (+ `self.bias`), gated by `activation(z)` after the norm when
    `self.norm_before_gate`, else before it. float32 math, output in `x`'s dtype. `z` is
    `x`'s shape, or `[tokens, heads, N]` for a 2-D `x` of `tokens * heads` rows."""
    where = "RMSNormGated.forward"
    shape = x.shape
    n = shape[-1]
    xf = x.reshape(-1, n).float()
    zf = None
    if z is not None:
        if z.shape != shape and not (x.dim() == 2 and z.dim() == 3 and z.shape[0] * z.shape[1] == xf.shape[0]
                                     and z.shape[2] == n):
            raise ValueError(f"{where}: gate {tuple(z.shape)} does not fit input {tuple(shape)}")
        zf = z.reshape(-1, n).float()
    group = n if self.group_size is None else self.group_size
    if n % group:
        raise ValueError(f"{where}: group_size {group} does not divide {n}")
    if zf is not None and not self.norm_before_gate:
        xf = xf * _gate(zf, self.activation, where)
    groups = xf.view(-1, n // group, group)
    rstd = torch.rsqrt(groups.square().mean(dim=-1, keepdim=True) + self.eps)
    y = (groups * rstd).view(-1, n) * self.weight.float()
    bias = getattr(self, "bias", None)
    if bias is not None:
        y = y + bias.float()
    if zf is not None and self.norm_before_gate:
        y = y * _gate(zf, self.activation, where)
    return y.to(x.dtype).reshape(shape)


def fused_rms_norm_gated_forward(self, x: torch.Tensor, g: torch.Tensor, residual: Optional[torch.Tensor] = None,
                                 prenorm: bool = False, residual_in_fp32: bool = False):
    """`fused_norm_gate.FusedRMSNormGated.forward` in torch: `h = x (+ residual)`,
    `y = rmsnorm(h) * weight (+ bias) * activation(g)` in float32. Like the Triton path
    (`layer_norm_gated_fwd`: `y = x` when no `out_dtype`), y is written over `x`'s rows
    and returned in `x`'s shape; with `prenorm`, `(y, residual_out)` where residual_out is
    `h` in the residual's dtype (float32 under `residual_in_fp32`), or y's buffer itself
    when no residual buffer is needed, as upstream returns."""
    where = "FusedRMSNormGated.forward"
    shape = x.shape
    d = shape[-1]
    rows = x.reshape(-1, d)
    h = rows.float()
    residual_dtype = torch.float32 if residual_in_fp32 else None
    if residual is not None:
        if residual.shape != shape:
            raise ValueError(f"{where}: residual {tuple(residual.shape)} is not {tuple(shape)}")
        h = h + residual.reshape(-1, d).float()
        residual_dtype = residual.dtype
    residual_out = None
    if residual is not None or (residual_dtype is not None and residual_dtype != x.dtype):
        residual_out = h.to(residual_dtype)
    gf = g.reshape(-1, d).float()
    y = h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + self.eps)
    if self.weight is not None:
        y = y * self.weight.float()
    if self.bias is not None:
        y = y + self.bias.float()
    if self.activation in ("swish", "silu"):
        y = y * gf * torch.sigmoid(gf)  # the kernel's multiplication order
    else:
        y = y * _gate(gf, self.activation, where)
    rows.copy_(y)
    out = rows.reshape(shape)
    if not prenorm:
        return out
    return out, (rows if residual_out is None else residual_out).reshape(shape)
