"""The compiled CPU step's linear layers: a C++ op (`cpu_linear.cpp`, built with the other
CPU kernels by `cpu_build`), `torch.ops.sglang_domino_cpu.linear(x, weight, bias, packed)`.

Up to `small_rows()` rows of float32 it multiplies by the weight as the model stores it,
in one pass over the weight split over the intra-op threads; above that, or in another
dtype, through the copy of the weight packed once for oneDNN (`pack`, index `packed`;
-1: none, then `F.linear`). A compiled graph makes one C++ call per projection, whatever
its rows (docs/cpu.md).

Reference: `torch.nn.functional.linear`, held equal by tests/sglang/cpu/test_cpu_linear.py.
"""

from __future__ import annotations

from typing import Optional

import torch

_faked = False


def register_fake() -> None:
    """The op's shape-only version, for tracing graphs that call it (once per process,
    after the library is loaded)."""
    global _faked
    if _faked:
        return

    @torch.library.register_fake("sglang_domino_cpu::linear")
    def _(input, weight, bias, packed):
        return input.new_empty((input.shape[0], weight.shape[0]))

    _faked = True


def available() -> bool:
    """Whether the op is loaded in this process (`cpu_build.build`)."""
    return _faked


def small_rows() -> int:
    """The most rows the op multiplies by the weight itself (float32)."""
    return int(torch.ops.sglang_domino_cpu.small_rows())


def pack(weight: torch.Tensor) -> int:
    """A copy of `weight` (`[out, in]`) packed for oneDNN, kept by the library: its index."""
    return int(torch.ops.sglang_domino_cpu.pack_linear(weight))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           packed: Optional[int] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a 2-D `x`, through the op (`packed`: `pack`'s index)."""
    return torch.ops.sglang_domino_cpu.linear(x, weight, bias, -1 if packed is None else packed)


__all__ = ["available", "linear", "pack", "register_fake", "small_rows"]
