"""Hybrid (gated delta-net) targets with `--device cpu`: the pieces of 0.5.23's GDN path
that are Triton-only on CPU and are not `sgl_kernel` ops, replaced in every model-running
process while the `sgl_kernel` stand-in is serving (with a real CPU `sgl_kernel`, 0.5.23
takes its own AMX paths and nothing here is installed).

Installed at scheduler start in the model-running processes (the seam's
`scheduler_start.before_init_parallel_runtime_on_cpu`, where `standin_serving` holds): the
modules replaced import Triton, so they are not touched in the processes that never run a
model (the server, the detokenizer).

  * `layernorm_gated.RMSNorm.forward` (`kernels/ops/attention/fla/`, the Qwen3.5 GDN
    output norm) and `fused_norm_gate.FusedRMSNormGated.forward` (Qwen3-Next's): Triton
    unless Intel AMX; the PyTorch forwards of `qwen3_5_ops`.
  * `mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify`
    (`kernels/ops/mamba/`, bound by name in `srt/layers/attention/hybrid_linear_attn_backend`):
    the commit of the accepted position's states after a DFLASH verify. Its parts
    (`fused_mamba_state_scatter_with_mask`, `fused_conv_window_scatter_with_mask`) raise
    for CPU tensors. Replaced by `gdn_ops.scatter_mamba_states_after_mtp_verify`
    (HookRegistry propagates the replacement to the backend's by-name import).
"""

from __future__ import annotations

import sys


def standin_serving(_context=None) -> bool:
    import importlib

    try:
        mod = sys.modules.get("sgl_kernel") or importlib.import_module("sgl_kernel")
    except ImportError:
        return False
    return bool(getattr(mod, "__sglang_domino_standin__", False))
