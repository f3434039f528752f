"""The CPU kernels' library: the C++ sources of this folder (`cpu_paged_attention.cpp`,
`cpu_linear.cpp`) compiled into one library of ops, `torch.ops.sglang_domino_cpu.*`,
on the serving machine.

It is built once per machine with torch's C++ extension builder (the compiler the
compiled CPU step already needs for inductor) into a directory of the compile cache,
under a name that carries the CPU capability torch runs at, so that a cache carried to
another CPU builds its own: AVX2 and AVX-512 machines get `-mavx2 -mfma`.
"""

from __future__ import annotations

import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, name) for name in ("cpu_paged_attention.cpp", "cpu_linear.cpp")]
LIBRARY = "sglang_domino_cpu"
OPS = ("paged_attention", "linear")


def _flags(capability: str) -> list[str]:
    return ["-mavx2", "-mfma"] if capability in ("AVX2", "AVX512") else []


def loaded() -> bool:
    """Whether the library's ops are registered in this process."""
    try:
        return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"{LIBRARY}::{op}", "CPU") for op in OPS)
    except RuntimeError:   # no such operator yet
        return False


def build(directory: str, verbose: bool = False) -> None:
    """Compile the library into (or load it from) `directory`, once per process; raises
    where it cannot be built (the compiler's message)."""
    if loaded():
        return
    from torch.utils.cpp_extension import load

    capability = torch.backends.cpu.get_cpu_capability()
    name = f"{LIBRARY}_{capability.lower()}"
    where = os.path.join(directory, name)
    os.makedirs(where, exist_ok=True)
    load(name=name, sources=SOURCES, build_directory=where, is_python_module=False, verbose=verbose,
         extra_cflags=["-O3", "-fopenmp", *_flags(capability)], extra_ldflags=["-fopenmp"])
    from . import cpu_linear

    cpu_linear.register_fake()


__all__ = ["LIBRARY", "SOURCES", "build", "loaded"]
