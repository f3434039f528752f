"""Pieces of small layers built from upstream's modules, for the compiled-CPU tests."""

from __future__ import annotations

import torch


def rms_norm(size: int, generator: torch.Generator):
    """Upstream's `RMSNorm` over `size`, its weight near 1 drawn from `generator`."""
    from sglang.srt.layers.layernorm import RMSNorm

    module = RMSNorm(size, eps=1e-6)
    module.weight.data = 1 + 0.1 * torch.randn(size, generator=generator)
    return module


class Holder(torch.nn.Module):
    """A stand-in for one of upstream's modules, holding what it holds: weights as
    parameters, sub-modules, ints. As a module's, its ints stay constants to dynamo (a
    plain namespace's become symbols under `dynamic=True`, and inductor's CPU code
    generation then takes minutes over them)."""

    def __init__(self, **attrs):
        super().__init__()
        for name, value in attrs.items():
            if isinstance(value, torch.Tensor):
                value = torch.nn.Parameter(value, requires_grad=False)
            setattr(self, name, value)
