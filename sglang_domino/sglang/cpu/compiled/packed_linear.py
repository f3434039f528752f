"""The compiled CPU graphs' projections over weights packed once for oneDNN.

Inside a compiled graph `F.linear` becomes an external `mm`/`addmm`: on x86 that is MKL's
sgemm in float32, which on AMD processors does not take its fastest code paths. vLLM's CPU
build prepacks its linear weights for oneDNN instead. Here every projection of the
compiled layers (and the draft's context write) is reordered once at load into oneDNN's
layout (`torch.ops.mkldnn._reorder_linear_weight`), and graphs of more than one row
multiply through `torch.ops.mkldnn._linear_pointwise` over the packed copy. Measured on
the test bed's 24 target projections, 2 threads: 1.6-2.3x faster than `F.linear` in
float32 on a Zen 4 EPYC, 1.2-1.6x on a Zen 3 EPYC (docs/cpu-profile.md).

The product runs behind one opaque op (`sglang_domino::cpu_packed_linear`), the packed
weight looked up by index: inductor lowers `_linear_pointwise` only over weights frozen
into the graph as constants, which a graph dynamic in its rows and served from the
model's own parameters does not have. One-row graphs keep `F.linear` (a matrix-vector
product, where the op's dispatch costs what the packing saves: plain decode measured
0.93x with it).

The packed copies are derived from the weights at load: the model declares it with
upstream's `_derived_weight_cache_error`, so an online weight update is refused with the
reason instead of serving stale copies. They double the compiled layers' weights in
memory (the eager paths and one-row graphs read the originals).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# the attribute a packed projection's index is kept under on its module; an `nn.Module`'s
# int attribute is a constant to dynamo (a plain object's would become a symbol under
# `dynamic=True`, and inductor's code generation slows to minutes over it)
ATTR = "_sglang_domino_packed"
# the draft context write's packed K and V rows of a fused QKV projection (`context.py`)
KV_ROWS_ATTR = "_sglang_domino_packed_kv_rows"

_packed: list[torch.Tensor] = []   # packed weights, by index


def supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies `dtype` on this CPU (bfloat16 needs AVX-512
    with bf16 or AMX; float16 is not packed)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(module, weight: torch.Tensor, attr: str = ATTR) -> bool:
    """Pack `weight` (`[out, in]`) once and keep its index on `module` under `attr`; False
    (nothing packed) where oneDNN cannot multiply its dtype here."""
    if not supported(weight.dtype) or weight.dim() != 2:
        return False
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    _packed.append(packed)
    setattr(module, attr, len(_packed) - 1)
    return True


def packed_bytes(module, attr: str = ATTR) -> int:
    """The bytes of `module`'s packed copy under `attr` (0: none)."""
    index = getattr(module, attr, None)
    if index is None:
        return 0
    w = _packed[index]
    return w.numel() * w.element_size()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], index: Optional[int]) -> torch.Tensor:
    """`F.linear(x, weight, bias)` (traced into a graph): through the packed copy `index`
    (`pack`) where there is one and `x` has more than one row."""
    if index is None or x.shape[0] == 1:   # under dynamic shapes the many-row graph knows rows >= 2
        return F.linear(x, weight, bias)
    return torch.ops.sglang_domino.cpu_packed_linear(x, bias, index, weight.shape[0])


def project(x: torch.Tensor, module, bias: bool = True) -> torch.Tensor:
    """`module`'s projection of `x` (its weight, and its bias unless `bias` is False)."""
    return linear(x, module.weight, module.bias if bias else None, getattr(module, ATTR, None))


@torch.library.custom_op("sglang_domino::cpu_packed_linear", mutates_args=(),
                         tags=(torch.Tag.flexible_layout,))
def cpu_packed_linear(x: torch.Tensor, bias: Optional[torch.Tensor], index: int, out_features: int) -> torch.Tensor:
    """`x @ W.T + bias` for the packed weight W of index `index` (oneDNN)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), _packed[index], bias, "none", [], "")


@cpu_packed_linear.register_fake
def _(x, bias, index, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


def declare(model, modules: int, nbytes: int) -> None:
    """Refuse online weight updates of `model` (upstream reads `_derived_weight_cache_error`
    off every module before it writes a weight): its packed copies would go stale."""
    if modules:
        model._derived_weight_cache_error = (
            "Online weight updates are not supported with --enable-torch-compile on --device cpu: "
            f"sglang-domino packed {modules} projections for oneDNN at load ({nbytes / 2**20:.1f} MB), and "
            "an update would leave them stale. Restart the server with the new weights.")


__all__ = ["ATTR", "KV_ROWS_ATTR", "cpu_packed_linear", "declare", "linear", "pack", "packed_bytes", "project",
           "supported"]
