"""The compiled CPU graphs' projections: one C++ call each (`kernels/cpu_linear`), over the
model's weight up to a few rows and over a copy packed once for oneDNN above.

Inside a compiled graph `F.linear` becomes an external `mm`/`addmm`: on x86 that is MKL's
sgemm in float32, which on AMD processors does not take its fastest code paths, and at
one to sixteen rows (a decode step of a few requests, one request's verify) it takes two
to three times a pass over the weight. The compiled step's kernel library
(`kernels/cpu_build`, built at load) has a linear op that reads the weight once, split
over the threads, up to `cpu_linear.small_rows()` rows of float32, and multiplies
through oneDNN's product over a packed copy above that (vLLM's CPU build prepacks its
weights for oneDNN too): every projection of the compiled layers (and the draft's
context write) is reordered once at load into oneDNN's layout, kept by the library,
named by index. Measured on the test bed's 24 target projections, 2 threads, Zen 3
EPYC (docs/cpu-profile.md): 2.1x MKL at one row, 1.3-2x oneDNN at 2-16 rows; oneDNN
1.0-1.2x ours at 32-128 rows.

The packed copies are derived from the weights at load: the model declares it with
upstream's `_derived_weight_cache_error`, so an online weight update is refused with the
reason instead of serving stale copies. They double the compiled layers' weights in
memory (the eager paths and the graphs' few-row products read the originals).

Without the library (a process that did not build it: tests of the graphs alone) the
graphs call `F.linear` and nothing is packed.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ....kernels import cpu_linear

# the attribute a packed projection's index is kept under on its module; an `nn.Module`'s
# int attribute is a constant to dynamo (a plain object's would become a symbol under
# `dynamic=True`, and inductor's code generation slows to minutes over it)
ATTR = "_sglang_domino_packed"
# the draft context write's packed K and V rows of a fused QKV projection (`context.py`)
KV_ROWS_ATTR = "_sglang_domino_packed_kv_rows"

_bytes: dict[int, int] = {}   # each packed copy's bytes, by the library's index


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
    (nothing packed) without the kernel library or where oneDNN cannot multiply its dtype
    here."""
    if not cpu_linear.available() or not supported(weight.dtype) or weight.dim() != 2:
        return False
    with torch.no_grad():
        index = cpu_linear.pack(weight)
    _bytes[index] = weight.numel() * weight.element_size()
    setattr(module, attr, index)
    return True


def packed_bytes(module, attr: str = ATTR) -> int:
    """The bytes of `module`'s packed copy under `attr` (0: none)."""
    index = getattr(module, attr, None)
    return 0 if index is None else _bytes[index]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
           index: Optional[int] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` (traced into a graph; `x` 2-D): the kernel library's op,
    through the packed copy `index` (`pack`) where there is one and the rows call for it."""
    if not cpu_linear.available() or x.dim() != 2:   # constants while tracing
        return F.linear(x, weight, bias)
    return torch.ops.sglang_domino_cpu.linear(x, weight, bias, -1 if index is None else index)


def project(x: torch.Tensor, module, bias: bool = True) -> torch.Tensor:
    """`module`'s projection of `x` (its weight, and its bias unless `bias` is False)."""
    return linear(x, module.weight, module.bias if bias else None, getattr(module, ATTR, None))


def declare(model, modules: int, nbytes: int) -> None:
    """Refuse online weight updates of `model` (upstream reads `_derived_weight_cache_error`
    off every module before it writes a weight): its packed copies would go stale."""
    if modules:
        model._derived_weight_cache_error = (
            "Online weight updates are not supported with --enable-torch-compile on --device cpu: "
            f"sglang-domino packed {modules} projections for oneDNN at load ({nbytes / 2**20:.1f} MB), and "
            "an update would leave them stale. Restart the server with the new weights.")


__all__ = ["ATTR", "KV_ROWS_ATTR", "declare", "linear", "pack", "packed_bytes", "project", "supported"]
