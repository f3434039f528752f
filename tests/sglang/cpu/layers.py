"""Pieces of small layers built from upstream's modules, for the compiled-CPU tests."""

from __future__ import annotations

import torch


def rms_norm(size: int, generator: torch.Generator):
    """Upstream's `RMSNorm` over `size`, its weight near 1 drawn from `generator`."""
    from sglang.srt.layers.layernorm import RMSNorm

    module = RMSNorm(size, eps=1e-6)
    module.weight.data = 1 + 0.1 * torch.randn(size, generator=generator)
    return module
