"""`--device cpu`: the upstream symbols the hybrid (gated delta-net) CPU path replaces or
calls, and the replacements answering through upstream's own names, on CPU tensors."""

import inspect
from types import SimpleNamespace


def probe(params) -> dict:
    import sglang.srt.arg_groups.mamba_hook as mamba_hook
    import sglang.srt.distributed.bootstrap as bootstrap
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hybrid
    import sglang.srt.layers.attention.linear.gdn_backend as gdn
    import sglang.srt.layers.attention.linear.kernels.gdn_triton as gdn_triton
    import torch
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
    from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm, rms_norm_ref

    from sglang_domino.sglang.seam import hooks
    from sglang_domino.sglang.cpu.hybrid import gdn_ops

    src = inspect.getsource(gdn) + inspect.getsource(gdn_triton)
    installed = hooks.install_group(hooks.CPU_STANDIN)
    pool = torch.zeros(1, 3, 2)
    buf = torch.arange(12.0).reshape(1, 2, 3, 2)
    hybrid.scatter_mamba_states_after_mtp_verify(
        SimpleNamespace(temporal=pool, intermediate_ssm=buf, conv=[], intermediate_conv_window=[]),
        torch.tensor([2, 0]), torch.tensor([1, 2]), None, None)
    norm = RMSNorm(8, eps=1e-6, group_size=4, norm_before_gate=True)
    x, z = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        ref = rms_norm_ref(x, norm.weight, None, z=z, eps=1e-6, group_size=4, norm_before_gate=True)
        fused = FusedRMSNormGated(8, eps=1e-6, activation="silu")
        fused.weight.uniform_(0.5, 1.5)
        fused_ref = rms_norm_ref(x, fused.weight, None, z=z, eps=1e-6, norm_before_gate=True)
    return dict(
        # the stand-ins are what 0.5.23 bound by name on CPU
        conv=gdn.causal_conv1d_fn is gdn_ops.causal_conv1d_fn_cpu
        and gdn.causal_conv1d_update is gdn_ops.causal_conv1d_update_cpu,
        chunk=gdn_triton.chunk_gated_delta_rule is gdn_ops.chunk_gated_delta_rule_cpu,
        verify_kwargs=all(k in src for k in ("disable_state_update=True", "intermediate_states_buffer=",
                                               "intermediate_conv_window=", "cache_steps=")),
        scatter_params=list(inspect.signature(hybrid.scatter_mamba_states_after_mtp_verify).parameters),
        installed=installed,
        scatter=pool[0].tolist() == [buf[0, 1, 2].tolist(), [0.0, 0.0], buf[0, 0, 1].tolist()],
        norm=bool(torch.allclose(norm(x, z), ref, atol=1e-6)),
        fused_norm=bool(torch.allclose(fused(x.clone(), z), fused_ref, atol=1e-6)),
        runtime="init_parallel_runtime" in dir(bootstrap),
        extra_buffer_gate=hasattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer"),
    )
