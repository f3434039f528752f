"""Fake CUDA tensors on a CPU-only machine (torch's `FakeTensorMode`): a data-dependent
read (`.item()`, a tensor's truth value, `torch.equal`) raises, as the same read would
stall a GPU. cuDNN is off: its GRU reaches the real CUDA runtime even on fake tensors. The
native CUDA GRU cell (`aten::_thnn_fused_gru_cell`) has no fake kernel, so it gets a
shape-only one (the cell's outputs are hy and a [b, 5 * hidden] workspace); it reads
nothing back to the host."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def fake_cuda(allow_non_fake_inputs: bool = False):
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
        return torch.empty_like(hx), hx.new_empty(hx.shape[0], 5 * hx.shape[1])

    with torch.library._scoped_library("aten", "IMPL") as lib:
        lib.impl("_thnn_fused_gru_cell", fused_gru_cell, "Meta")
        with (FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs) as mode,
              torch.backends.cudnn.flags(enabled=False)):
            yield mode
