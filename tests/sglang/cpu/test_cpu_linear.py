"""`sglang_domino.kernels.cpu_linear`: the compiled CPU step's linear op (C++), against its
reference `F.linear`: the few-row product over the weight itself, oneDNN's over the packed
copy above that, other dtypes, strided inputs, and its shape-only version in a dynamic
graph. The graphs that call it: `test_compiled_forward.py`, `test_compiled_context.py`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_domino.kernels import cpu_linear

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _weights(out_features, in_features, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(out_features, in_features, generator=g) / in_features ** 0.5).to(dtype),
            torch.randn(out_features, generator=g).to(dtype))


def _pointwise_calls(fn):
    """How many times `fn` calls oneDNN's packed product (the profiler sees the op's
    dispatcher calls from C++ too)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")


@pytest.mark.parametrize("shape", [(48, 32), (37, 20), (1536, 256), (256, 768), (5, 3)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_few_row_product_is_f_linear(shape, threads):
    """Every row count up to the cut and past it, with and without a bias, an inner size
    that is not a multiple of 8 and output features not a multiple of the tiles, on one
    thread and split over two."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        weight, bias = _weights(*shape)
        for rows in (0, 1, 2, 3, 4, 5, 7, 8, 9, cpu_linear.small_rows(), cpu_linear.small_rows() + 1, 40):
            x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
            for b in (None, bias):
                got = cpu_linear.linear(x, weight, b)
                assert got.shape == (rows, shape[0]) and got.dtype == torch.float32
                torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(previous)


@needs_onednn
def test_above_the_cut_a_packed_weight_goes_through_onednn_and_below_it_the_weight_itself():
    weight, bias = _weights(64, 48, seed=1)
    packed = cpu_linear.pack(weight)
    cut = cpu_linear.small_rows()
    for rows, onednn in ((1, 0), (cut, 0), (cut + 1, 1), (96, 1)):
        x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(rows))
        got = []
        assert _pointwise_calls(lambda: got.append(cpu_linear.linear(x, weight, bias, packed))) == onednn
        torch.testing.assert_close(got[0], F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    # an unknown packed index is refused, not read
    with pytest.raises(RuntimeError, match="no packed weight"):
        cpu_linear.linear(torch.randn(2, 48), weight, None, packed + 1000)


def test_strided_inputs_and_weights_are_multiplied_as_their_values():
    weight, _ = _weights(40, 64, seed=2)
    wide = torch.randn(6, 128)
    torch.testing.assert_close(cpu_linear.linear(wide[:, ::2], weight), F.linear(wide[:, ::2], weight), rtol=1e-5,
                               atol=1e-5)
    rows = torch.randn(80, 64)[10:50]   # a slice of rows (the context write's K/V rows of a fused QKV)
    torch.testing.assert_close(cpu_linear.linear(wide[:3, :64], rows), F.linear(wide[:3, :64], rows), rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(cpu_linear.linear(wide[:3, :64], weight.T.contiguous().T),
                               F.linear(wide[:3, :64], weight), rtol=1e-5, atol=1e-5)


def test_other_dtypes_are_f_linear_and_bad_shapes_are_refused():
    weight, bias = _weights(8, 4, dtype=torch.bfloat16, seed=3)
    x = torch.randn(3, 4).to(torch.bfloat16)
    torch.testing.assert_close(cpu_linear.linear(x, weight, bias), F.linear(x, weight, bias))
    with pytest.raises(RuntimeError, match=r"input \[rows, in\] and weight \[out, in\] expected"):
        cpu_linear.linear(torch.randn(3, 5), torch.randn(8, 4))


def test_the_op_traces_as_its_shape_and_runs_in_a_dynamic_graph():
    """Dynamo and inductor see the op's shape only (its fake) in a graph dynamic in its rows;
    the compiled graph calls the C++ op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    weight, bias = _weights(24, 16, seed=4)
    with FakeTensorMode():
        out = torch.ops.sglang_domino_cpu.linear(torch.empty(5, 16), torch.empty(24, 16), None, -1)
    assert out.shape == (5, 24)
    compiled = torch.compile(lambda x: torch.relu(cpu_linear.linear(x, weight, bias)), dynamic=True)
    for rows in (1, 3, 9, 33):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(x), torch.relu(F.linear(x, weight, bias)), rtol=1e-5, atol=1e-5)
