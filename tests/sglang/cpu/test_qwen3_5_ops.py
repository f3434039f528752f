"""The Qwen3.5 CPU op stand-ins (`sglang_domino/sglang/qwen3_5_ops.py`) against the
upstream 0.5.23 semantics they replace: the non-fused Python paths of `qwen3_5.py`
(`GemmaRMSNorm` per head, `forward_prepare_native`, `fix_query_key_value_ordering`), the
torch reference `rms_norm_ref` of `layernorm_gated.py`, and, where the Triton interpreter
can run them (TRITON_INTERPRET=1, set by tests/conftest.py), the upstream Triton kernels
themselves."""

from __future__ import annotations

import os
import pytest
import torch

from sglang_domino.sglang.cpu.hybrid import qwen3_5_ops as ops

DTYPES = (torch.float32, torch.bfloat16)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
EPS = 1e-6
T, HQ, HKV, D = 5, 4, 2, 16            # full attention: tokens, q heads, kv heads, head dim
HK, HV, DK, DV = 2, 4, 8, 16            # GDN: k heads, v heads (ratio 2), k / v head dims

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="upstream Triton kernels need TRITON_INTERPRET=1 on CPU")

TEST_NS = "sglang_domino_qwen3_5_test"
_LIBS = []  # a Library deregisters its ops when collected


@pytest.fixture(scope="module")
def sgl():
    """This module's ops, registered through `register` in a private namespace: the
    `sgl_kernel` ones may already come from another registration in this process."""
    lib = torch.library.Library(TEST_NS, "FRAGMENT")
    ops.register(lib)
    _LIBS.append(lib)
    return getattr(torch.ops, TEST_NS)


@pytest.fixture(scope="module")
def sgl_kernel():
    """`torch.ops.sgl_kernel` with the four ops, registered only where absent: through the
    stand-in's own `register_torch_ops` first, since a later call of it in this process
    would otherwise meet ops defined here and raise."""
    from sglang_domino.sglang.cpu import kernel_standin

    if not all(hasattr(torch.ops.sgl_kernel, name) for name in ops.SCHEMAS):
        kernel_standin.register_torch_ops()
    if not all(hasattr(torch.ops.sgl_kernel, name) for name in ops.SCHEMAS):
        lib = torch.library.Library("sgl_kernel", "FRAGMENT")
        ops.register(lib)
        _LIBS.append(lib)
    return torch.ops.sgl_kernel


def _rand(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _gemma_ref(x, w, eps=EPS):
    """GemmaRMSNorm.forward_native (srt/layers/layernorm.py:1152) per row."""
    xf = x.float()
    return (xf / torch.sqrt(xf.square().mean(-1, keepdim=True) + eps) * (w.float() + 1)).to(x.dtype)


def _qkv(dtype, seed, gate):
    """q(_gate), k as column slices of one qkv projection row, as `qkv.split` gives them."""
    q_size, kv_size = HQ * D * (2 if gate else 1), HKV * D
    qkv = _rand(T, q_size + 2 * kv_size, dtype=dtype, seed=seed)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return q, k


def test_register_defines_the_four_ops_and_tolerates_a_second_call(sgl):
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(sgl, name).default._schema) == f"{TEST_NS}::{schema}"
    assert "Tensor(a!) input" in ops.SCHEMAS["fused_sigmoid_mul_cpu"]
    lib = torch.library.Library(TEST_NS, "FRAGMENT")
    ops.register(lib)  # already defined: must not raise


def test_sgl_kernel_ops_serve_the_qwen3_5_call_sites(sgl_kernel):
    """Whoever registered them, the `sgl_kernel` ops qwen3_5.py binds hold the call sites'
    contract: results of the shapes and views the model applies, values of the unfused path."""
    dtype = torch.bfloat16
    q_gate, k = _qkv(dtype, 70, gate=True)
    qw, kw = _rand(D, dtype=dtype, seed=71), _rand(D, dtype=dtype, seed=72)
    q_flat, k_flat, gate_flat = sgl_kernel.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, EPS, D, HQ)
    q, k_out, gate = (t.view(T, -1) for t in (q_flat, k_flat, gate_flat))  # qwen3_5.py:1536-1538
    for got, ref in zip((q, k_out, gate), _native_prepare(q_gate, k, qw, kw)):
        torch.testing.assert_close(got, ref, **TOL[dtype])
    q_plain, k_plain = _qkv(dtype, 73, gate=False)
    q_by_head, k_by_head = sgl_kernel.fused_qk_gemma_rmsnorm_cpu(q_plain, k_plain, qw, kw, EPS, D)
    torch.testing.assert_close(q_by_head.view(q_plain.shape),  # qwen3_5.py:1459
                               _gemma_ref(q_plain.reshape(-1, D), qw).view(q_plain.shape), **TOL[dtype])
    x = _rand(T, HQ * D, dtype=dtype, seed=74)
    expected = (x.float() * torch.sigmoid(gate.float())).to(dtype)
    sgl_kernel.fused_sigmoid_mul_cpu(x, gate)  # qwen3_5.py:286-290: in place, x returned
    torch.testing.assert_close(x, expected, **TOL[dtype])
    mixed_qkvz, mixed_ba = _projections(dtype, 3, seed=75)
    got = sgl_kernel.fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, HK, HV, DK, DV)
    for g, r in zip(got, _fix_query_key_value_ordering_ref(mixed_qkvz, mixed_ba)):
        assert g.shape == r.shape and torch.equal(g, r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided_gate", [False, True])
def test_fused_sigmoid_mul_multiplies_x_in_place(sgl, dtype, strided_gate):
    x = _rand(T, HQ * D, dtype=dtype, seed=1)
    q_gate, _ = _qkv(dtype, 2, gate=True)
    if strided_gate:  # forward_prepare_native's 3-D view (qwen3_5.py:1493)
        _, gate = torch.chunk(q_gate.view(T, HQ, -1), 2, dim=-1)
        flat_gate = gate.reshape(T, -1)
    else:             # forward_prepare_fused_gate's flat gate
        gate = flat_gate = _rand(T, HQ * D, dtype=dtype, seed=3)
    expected = (x.float() / (1 + torch.exp(-flat_gate.float()))).to(dtype)
    before, ptr = x.clone(), x.data_ptr()
    assert sgl.fused_sigmoid_mul_cpu(x, gate) is None
    assert x.data_ptr() == ptr and not torch.equal(x, before)
    torch.testing.assert_close(x, expected, **TOL[dtype])


def test_fused_sigmoid_mul_rejects_mismatched_shapes(sgl):
    with pytest.raises(Exception, match="gate"):
        sgl.fused_sigmoid_mul_cpu(torch.zeros(T, HQ * D), torch.zeros(T, HQ, D + 1))


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_sigmoid_mul_matches_upstream_triton(sgl, dtype):
    from sglang.kernels.ops.elementwise.elementwise import fused_sigmoid_mul

    q_gate, _ = _qkv(dtype, 4, gate=True)
    _, gate = torch.chunk(q_gate.view(T, HQ, -1), 2, dim=-1)
    x = _rand(T, HQ * D, dtype=dtype, seed=5)
    expected = fused_sigmoid_mul(x, gate, inplace=False)
    sgl.fused_sigmoid_mul_cpu(x, gate)
    torch.testing.assert_close(x, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_qk_gemma_rmsnorm_is_gemma_rmsnorm_per_head(sgl, dtype):
    q, k = _qkv(dtype, 6, gate=False)
    qw, kw = _rand(D, dtype=dtype, seed=7), _rand(D, dtype=dtype, seed=8)
    q_by_head, k_by_head = sgl.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, EPS, D)
    # qwen3_5.py:1459-1460 views the results back to the inputs' shapes
    q_out, k_out = q_by_head.view(q.shape), k_by_head.view(k.shape)
    torch.testing.assert_close(q_out, _gemma_ref(q.reshape(-1, D), qw).view(q.shape), **TOL[dtype])
    torch.testing.assert_close(k_out, _gemma_ref(k.reshape(-1, D), kw).view(k.shape), **TOL[dtype])
    assert q_out.dtype == k_out.dtype == dtype
    # per head, not per row: a norm over the whole row would differ
    assert not torch.allclose(q_out.float(), _gemma_ref(q, qw.repeat(HQ)).float(), atol=1e-2)


@needs_interpreter
def test_fused_qk_gemma_rmsnorm_matches_upstream_triton(sgl):
    from sglang.srt.models.utils import fused_qk_gemma_rmsnorm

    q, k = _qkv(torch.bfloat16, 9, gate=False)
    qw, kw = _rand(D, dtype=torch.bfloat16, seed=10), _rand(D, dtype=torch.bfloat16, seed=11)
    ref_q, ref_k = fused_qk_gemma_rmsnorm(q, k, qw, kw, EPS, D)
    got_q, got_k = sgl.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, EPS, D)
    torch.testing.assert_close(got_q.view(ref_q.shape), ref_q, **TOL[torch.bfloat16])
    torch.testing.assert_close(got_k.view(ref_k.shape), ref_k, **TOL[torch.bfloat16])


def _native_prepare(q_gate, k, qw, kw):
    """forward_prepare_native (qwen3_5.py:1493) up to the norms."""
    q, gate = torch.chunk(q_gate.view(T, HQ, -1), 2, dim=-1)
    q = q.reshape(T, -1)
    q = _gemma_ref(q.reshape(-1, D), qw).view(q.shape)
    k = _gemma_ref(k.reshape(-1, D), kw).view(k.shape)
    return q, k, gate.reshape(T, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("contiguous", [False, True])
def test_fused_qk_gemma_rmsnorm_with_gate_is_forward_prepare_native(sgl, dtype, contiguous):
    q_gate, k = _qkv(dtype, 12, gate=True)
    if contiguous:  # the gate half is then a strided view that must still come back viewable
        q_gate, k = q_gate.contiguous(), k.contiguous()
    qw, kw = _rand(D, dtype=dtype, seed=13), _rand(D, dtype=dtype, seed=14)
    q_flat, k_flat, gate_flat = sgl.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, EPS, D, HQ)
    assert q_flat.shape == gate_flat.shape == (T * HQ, D) and k_flat.shape == (T * HKV, D)
    q, k_out, gate = (t.view(T, -1) for t in (q_flat, k_flat, gate_flat))  # qwen3_5.py:1536-1538
    ref_q, ref_k, ref_gate = _native_prepare(q_gate, k, qw, kw)
    torch.testing.assert_close(q, ref_q, **TOL[dtype])
    torch.testing.assert_close(k_out, ref_k, **TOL[dtype])
    assert torch.equal(gate, ref_gate)
    assert gate_flat.is_contiguous() and gate_flat.data_ptr() != q_gate.data_ptr()


@needs_interpreter
def test_fused_qk_gemma_rmsnorm_with_gate_matches_upstream_triton(sgl):
    from sglang.srt.models.utils import fused_qk_gemma_rmsnorm_with_gate

    q_gate, k = _qkv(torch.bfloat16, 15, gate=True)
    qw, kw = _rand(D, dtype=torch.bfloat16, seed=16), _rand(D, dtype=torch.bfloat16, seed=17)
    ref = fused_qk_gemma_rmsnorm_with_gate(q_gate, k, qw, kw, EPS, D, HQ)
    got = sgl.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, EPS, D, HQ)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r, **TOL[torch.bfloat16])


def _fix_query_key_value_ordering_ref(mixed_qkvz, mixed_ba):
    """Qwen3_5GatedDeltaNet.fix_query_key_value_ordering (qwen3_5.py:675) with attn_tp 1,
    then the reshape / cat of the unfused branch (:1053-1061)."""
    key_dim, value_dim = HK * DK, HV * DV
    query, key, value, z = mixed_qkvz.split([key_dim, key_dim, value_dim, value_dim], dim=-1)
    b, a = mixed_ba.split([HV, HV], dim=-1)
    value = value.reshape(value.size(0), -1, DV)
    z = z.reshape(z.size(0), -1, DV)
    query, key, value = (t.reshape(t.shape[0], -1) for t in (query, key, value))
    return torch.cat((query, key, value), dim=-1), z, b.contiguous(), a.contiguous()


def _projections(dtype, tokens, seed):
    """mixed_qkvz / mixed_ba as row-strided column slices of one fused in_proj output."""
    qkvz_dim, ba_dim = 2 * HK * DK + 2 * HV * DV, 2 * HV
    proj = _rand(tokens, qkvz_dim + ba_dim, dtype=dtype, seed=seed)
    return proj[:, :qkvz_dim], proj[:, qkvz_dim:]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 6])
def test_fused_qkvzba_split_is_fix_query_key_value_ordering(sgl, dtype, tokens):
    mixed_qkvz, mixed_ba = _projections(dtype, tokens, seed=18 + tokens)
    got = sgl.fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, HK, HV, DK, DV)
    ref = _fix_query_key_value_ordering_ref(mixed_qkvz, mixed_ba)
    shapes = [(tokens, 2 * HK * DK + HV * DV), (tokens, HV, DV), (tokens, HV), (tokens, HV)]
    for g, r, shape in zip(got, ref, shapes):
        assert g.shape == shape and g.dtype == dtype and g.is_contiguous()
        assert torch.equal(g, r)
    # fresh buffers, as the kernels allocate: consumers write mixed_qkv in place
    storage = {mixed_qkvz.untyped_storage().data_ptr()}
    assert all(g.untyped_storage().data_ptr() not in storage for g in got)


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_qkvzba_split_matches_upstream_triton(sgl, dtype):
    from sglang.kernels.ops.attention.triton_gdn_fused_proj import fused_qkvzba_split_reshape_cat_contiguous

    mixed_qkvz, mixed_ba = _projections(dtype, 4, seed=30)
    ref = fused_qkvzba_split_reshape_cat_contiguous(mixed_qkvz, mixed_ba, HK, HV, DK, DV)
    got = sgl.fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, HK, HV, DK, DV)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and torch.equal(g, r)


def test_fused_qkvzba_split_rejects_wrong_widths(sgl):
    mixed_qkvz, mixed_ba = _projections(torch.float32, 2, seed=31)
    with pytest.raises(Exception, match="mixed_qkvz"):
        sgl.fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, HK, HV, DK, DV + 1)


def _rmsnorm_gated(hidden, dtype, seed, **kw):
    from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm

    norm = RMSNorm(hidden, eps=EPS, dtype=dtype, **kw)
    with torch.no_grad():
        norm.weight.copy_(_rand(hidden, dtype=dtype, seed=seed))
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size,norm_before_gate", [(None, True), (None, False), (4, True), (8, False)])
def test_rms_norm_gated_forward_is_rms_norm_ref(dtype, group_size, norm_before_gate):
    from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_ref

    norm = _rmsnorm_gated(DV, dtype, 40, group_size=group_size, norm_before_gate=norm_before_gate)
    x, z = _rand(T * HV, DV, dtype=dtype, seed=41), _rand(T * HV, DV, dtype=dtype, seed=42)
    got = ops.rms_norm_gated_forward(norm, x, z)
    ref = rms_norm_ref(x, norm.weight, None, z=z, eps=EPS, group_size=group_size, norm_before_gate=norm_before_gate)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref, **TOL[dtype])
    # z given as [tokens, heads, N] for a 2-D x (the Triton path's 3-D gate)
    torch.testing.assert_close(ops.rms_norm_gated_forward(norm, x, z.view(T, HV, DV)), got, atol=0, rtol=0)
    torch.testing.assert_close(ops.rms_norm_gated_forward(norm, x),
                               rms_norm_ref(x, norm.weight, None, eps=EPS, group_size=group_size), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_gated_forward_sigmoid_gate(dtype):
    norm = _rmsnorm_gated(DV, dtype, 43, activation="sigmoid")
    x, z = _rand(3, 2, DV, dtype=dtype, seed=44), _rand(3, 2, DV, dtype=dtype, seed=45)
    xf = x.float()
    ref = xf / torch.sqrt(xf.square().mean(-1, keepdim=True) + EPS) * norm.weight.float() * torch.sigmoid(z.float())
    got = ops.rms_norm_gated_forward(norm, x, z)
    assert got.shape == x.shape
    torch.testing.assert_close(got, ref.to(dtype), **TOL[dtype])


def test_rms_norm_gated_forward_refuses_unknown_activation():
    norm = _rmsnorm_gated(DV, torch.float32, 46, activation="gelu")
    with pytest.raises(ValueError, match="gelu"):
        ops.rms_norm_gated_forward(norm, torch.randn(2, DV), torch.randn(2, DV))


def _fused_norm(activation, dtype, seed):
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated

    norm = FusedRMSNormGated(DV, eps=EPS, activation=activation, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(_rand(DV, dtype=dtype, seed=seed))
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_rms_norm_gated_forward_is_rms_norm_ref_and_writes_over_x(dtype):
    from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_ref

    norm = _fused_norm("silu", dtype, 50)
    x, g = _rand(T * HV, DV, dtype=dtype, seed=51), _rand(T * HV, DV, dtype=dtype, seed=52)
    ref = rms_norm_ref(x, norm.weight, None, z=g, eps=EPS)
    got = ops.fused_rms_norm_gated_forward(norm, x, g)
    torch.testing.assert_close(got, ref, **TOL[dtype])
    assert got.data_ptr() == x.data_ptr() and torch.equal(x, got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_rms_norm_gated_forward_residual_prenorm(dtype):
    from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_ref

    norm = _fused_norm("swish", dtype, 53)
    x, g, res = (_rand(3, HV, DV, dtype=dtype, seed=s) for s in (54, 55, 56))
    h = x.float() + res.float()
    y, res_out = ops.fused_rms_norm_gated_forward(norm, x.clone(), g, residual=res, prenorm=True)
    torch.testing.assert_close(y, rms_norm_ref(h, norm.weight, None, z=g.float(), eps=EPS).to(dtype), **TOL[dtype])
    assert res_out.dtype == dtype
    torch.testing.assert_close(res_out, h.to(dtype), atol=0, rtol=0)
    y32, res32 = ops.fused_rms_norm_gated_forward(norm, x.clone(), g, prenorm=True, residual_in_fp32=True)
    if dtype == torch.float32:  # no separate residual buffer: upstream hands back y's
        assert res32.data_ptr() == y32.data_ptr()
    else:
        assert res32.dtype == torch.float32 and torch.equal(res32, x.float())


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
def test_fused_rms_norm_gated_forward_matches_upstream_triton(dtype, activation):
    from sglang.kernels.ops.attention.fla.fused_norm_gate import rms_norm_gated

    norm = _fused_norm(activation, dtype, 57)
    x, g, res = (_rand(T * HV, DV, dtype=dtype, seed=s) for s in (58, 59, 60))
    ref_y, ref_res = rms_norm_gated(x.clone(), g, norm.weight, None, activation, residual=res, prenorm=True, eps=EPS)
    got_y, got_res = ops.fused_rms_norm_gated_forward(norm, x.clone(), g, residual=res, prenorm=True)
    torch.testing.assert_close(got_y, ref_y, **TOL[dtype])
    torch.testing.assert_close(got_res, ref_res, **TOL[dtype])


def test_qwen3_5_gdn_uses_the_layernorm_gated_rmsnorm():
    """Which forward Qwen3.5's GDN output norm needs: read from the 0.5.23 source rather
    than imported (importing qwen3_5 freezes its `_is_cpu` flags for the process)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    path = os.path.join(os.path.dirname(spec.origin), "srt", "models", "qwen3_5.py")
    src = open(path, encoding="utf-8").read()
    assert "from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm as RMSNormGated" in src
    assert "FusedRMSNormGated" not in src
    assert "self.norm = RMSNormGated(" in src
    # the four ops bound at import on CPU
    for name in ops.SCHEMAS:
        assert f"torch.ops.sgl_kernel.{name}" in src
