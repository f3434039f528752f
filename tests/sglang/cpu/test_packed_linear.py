"""`sglang_domino.sglang.cpu.compiled.packed_linear`: the compiled CPU graphs' projections,
through the kernel library's linear op (`test_cpu_linear.py`) over the weights and their
copies packed once for oneDNN. The graphs that use them: `test_compiled_forward.py`,
`test_compiled_context.py`; served: the compiled servers of `tests/e2e/`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_domino.sglang.cpu.compiled import packed_linear
from tests.sglang.cpu.layers import Holder

needs_onednn = pytest.mark.skipif(not packed_linear.supported(torch.float32), reason="torch built without oneDNN")


def _module(out_features, in_features, bias, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Holder(weight=(torch.randn(out_features, in_features, generator=g) / in_features ** 0.5).to(dtype),
                  bias=torch.randn(out_features, generator=g).to(dtype) if bias else None)


@needs_onednn
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_a_packed_projection_is_the_weights_product_through_onednn_above_the_few_rows(bias):
    from sglang_domino.kernels import cpu_linear

    module = _module(48, 32, bias)
    assert packed_linear.pack(module, module.weight)
    index = getattr(module, packed_linear.ATTR)
    assert packed_linear.packed_bytes(module) == 48 * 32 * 4
    cut = cpu_linear.small_rows()
    calls = []
    for rows in (1, 2, 7, cut + 1, 64):
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = packed_linear.project(x, module)
        calls += [rows] * sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")
        torch.testing.assert_close(got, F.linear(x, module.weight, module.bias), rtol=1e-5, atol=1e-5)
    assert calls == [cut + 1, 64]   # up to the cut: the weights' own product
    # without its bias (a row-parallel projection adds it after the reduce)
    x = torch.randn(5, 32)
    torch.testing.assert_close(packed_linear.project(x, module, bias=False), x @ module.weight.T, rtol=1e-5,
                               atol=1e-5)
    # a non-contiguous input (a split's view) is multiplied as its values
    wide = torch.randn(40, 64)
    torch.testing.assert_close(packed_linear.linear(wide[:, ::2], module.weight, None, index),
                               F.linear(wide[:, ::2], module.weight), rtol=1e-5, atol=1e-5)


def test_an_unpacked_projection_and_unsupported_dtypes_use_the_weights(monkeypatch):
    from sglang_domino.kernels import cpu_linear

    module = _module(8, 4, bias=True, dtype=torch.float16)
    assert not packed_linear.supported(torch.float16) and not packed_linear.pack(module, module.weight)
    float32 = _module(8, 4, bias=True)
    monkeypatch.setattr(cpu_linear, "_faked", False)   # without the kernel library nothing is packed
    assert not packed_linear.pack(float32, float32.weight) and packed_linear.packed_bytes(float32) == 0
    monkeypatch.undo()
    assert getattr(module, packed_linear.ATTR, None) is None and packed_linear.packed_bytes(module) == 0
    x = torch.randn(3, 4, dtype=torch.float16)
    torch.testing.assert_close(packed_linear.project(x, module), F.linear(x, module.weight, module.bias))
    assert packed_linear.supported(torch.bfloat16) == (
        torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@needs_onednn
def test_a_dynamic_graph_multiplies_through_the_op_and_without_the_library_through_f_linear(monkeypatch):
    from sglang_domino.kernels import cpu_linear

    module = _module(24, 16, bias=True, seed=1)
    packed_linear.pack(module, module.weight)
    for available in (True, False):
        monkeypatch.setattr(cpu_linear, "_faked", available)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: torch.relu(packed_linear.project(x, module)), dynamic=True)
        for rows in (1, 3, 9, 40):
            x = torch.randn(rows, 16)
            compiled(x)   # compiled first: tracing calls the op's fake, which the profiler counts too
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = compiled(x)
            ops = sum(e.count for e in prof.key_averages() if e.key == "sglang_domino_cpu::linear")
            assert ops == (1 if available else 0)
            torch.testing.assert_close(got, torch.relu(F.linear(x, module.weight, module.bias)), rtol=1e-5,
                                       atol=1e-5)


def test_a_packed_model_refuses_online_weight_updates_through_upstreams_check():
    """0.5.23 reads `_derived_weight_cache_error` off every module before it writes a weight
    (`weight_updater._unsupported_derived_weight_cache_error`): the packed copies would go stale."""
    pytest.importorskip("sglang")
    from sglang.srt.model_executor.model_runner_components.weight_updater import (
        _unsupported_derived_weight_cache_error,
    )

    model = Holder(inner=_module(4, 4, bias=False))
    packed_linear.declare(model, 0, 0)   # nothing packed (a dtype oneDNN does not take): updates stay allowed
    assert _unsupported_derived_weight_cache_error(model) is None
    packed_linear.declare(model, 12, 3 * 2**20)
    reason = _unsupported_derived_weight_cache_error(model)
    assert "--enable-torch-compile" in reason and "12 projections" in reason and "3.0 MB" in reason
