"""Hybrid (gated delta-net) targets with `--device cpu`: the pieces of 0.5.23's GDN path
that are Triton-only on CPU and are not `sgl_kernel` ops, replaced in every model-running
process while the `sgl_kernel` stand-in is serving (with a real CPU `sgl_kernel`, 0.5.23
takes its own AMX paths and nothing here is installed).

Installed from a BEFORE hook on `bootstrap.init_parallel_runtime` (called by every
scheduler, `managers/scheduler.py:536`, before it builds the model): the modules replaced
import Triton, so they are not touched in the processes that never run a model (the
server, the detokenizer).

  * `RMSNorm.forward` of `kernels/ops/attention/fla/layernorm_gated.py` (`:515`, the
    Qwen3.5 GDN output norm) and `FusedRMSNormGated.forward` (`fused_norm_gate.py:435`,
    Qwen3-Next's): Triton unless Intel AMX; the PyTorch forwards of `cpu_qwen3_5_ops`.
  * `scatter_mamba_states_after_mtp_verify` (`kernels/ops/mamba/mamba_state_scatter_triton.py:781`,
    bound by name in `srt/layers/attention/hybrid_linear_attn_backend.py:15`): the commit
    of the accepted position's states after a DFLASH verify; its parts raise for CPU
    tensors (`:340`, `:508`). Replaced by `cpu_gdn_ops.scatter_mamba_states_after_mtp_verify`
    (HookRegistry propagates the replacement to the backend's by-name import).
"""

from __future__ import annotations

import sys

RUNTIME_TARGET = "sglang.srt.distributed.bootstrap.init_parallel_runtime"
RMS_NORM_GATED = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"
FUSED_RMS_NORM_GATED = "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward"
SCATTER = "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify"


def standin_serving() -> bool:
    import importlib

    try:
        mod = sys.modules.get("sgl_kernel") or importlib.import_module("sgl_kernel")
    except ImportError:
        return False
    return bool(getattr(mod, "__sglang_domino_standin__", False))


def replacements():
    from . import cpu_gdn_ops, cpu_qwen3_5_ops

    return [
        (RMS_NORM_GATED, cpu_qwen3_5_ops.rms_norm_gated_forward, "REPLACE"),
        (FUSED_RMS_NORM_GATED, cpu_qwen3_5_ops.fused_rms_norm_gated_forward, "REPLACE"),
        (SCATTER, cpu_gdn_ops.scatter_mamba_states_after_mtp_verify, "REPLACE"),
    ]


def install() -> bool:
    """Apply the replacements once per process; returns whether they are in place."""
    if not standin_serving():
        return False
    from . import apply_hooks_once

    apply_hooks_once("cpu hybrid", replacements())
    return True


def _before_init_parallel_runtime(*args, **kwargs):
    install()


_before_init_parallel_runtime._sglang_domino = True

HOOKS = [(RUNTIME_TARGET, _before_init_parallel_runtime, "BEFORE")]
