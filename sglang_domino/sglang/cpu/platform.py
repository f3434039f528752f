"""`sglang.srt.platforms` entry point: switch SGLang's CPU engine on for `--device cpu`.

Why a *platform* entry point: in 0.5.23 it is the only plugin hook that runs early
enough in every process. It is called from the first `import sglang`
(`srt.platforms._resolve_platform`), also in spawned schedulers and the detokenizer while
multiprocessing re-imports the main module. That is before `kernels/ops/kvcache/cache_move`
imports `sgl_kernel` and before `srt.utils.common.is_cpu()` (lru-cached) is first read.
The `sglang.srt.plugins` entry point runs too late there (`run_scheduler_process`
loads it).

`activate()` returns None, so SGLang still picks its own `CpuSRTPlatform`. It only:
  1. sets `SGLANG_USE_CPU_ENGINE=1` when the command line asks for `--device cpu`
     (spawned children inherit the variable);
  2. installs a `sys.meta_path` finder for `sgl_kernel`: the real package is tried
     first (an Intel-AMX CPU build must win); if importing it fails (the PyPI wheel
     is CUDA-only), the half-imported `sgl_kernel.*` modules are dropped and
     `sglang_domino.sglang.cpu.kernel_standin` is served under that name instead.

This module runs while `sglang.srt.utils.common` is half-initialised: stdlib only, no
sglang imports, no logging. No distribution or top-level package named `sgl_kernel`
is ever installed; the stand-in exists only in `sys.modules` of the process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
STANDIN_NAME = "sgl_kernel"


def cpu_engine_on(_context=None) -> bool:
    """Whether this process runs SGLang's CPU engine (inherited by spawned processes); the
    `cpu engine` group's predicate (`hooks.install_moment`)."""
    return os.environ.get(CPU_ENGINE_ENV) == "1"


def _cpu_requested(argv: list[str]) -> bool:
    if cpu_engine_on():
        return True
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv) and argv[i + 1] == "cpu":
            return True
        if arg == "--device=cpu":
            return True
    return False


def activate():
    """Platform-plugin callable. Always returns None (no platform of our own)."""
    # Not switched off by SGLANG_DOMINO_DISABLE: that variable turns off the DFLASH
    # worker and hooks (upstream behaviour); CPU serving itself stays possible.
    if not _cpu_requested(sys.argv):
        return None
    os.environ[CPU_ENGINE_ENV] = "1"
    install_sgl_kernel_finder()
    return None


class _StandInLoader(importlib.abc.Loader):
    """Executes the real `sgl_kernel` if it can; otherwise serves the CPU stand-in."""

    def __init__(self, real_spec):
        self.real_spec = real_spec

    def create_module(self, spec):
        return None  # default module object; replaced in exec_module when needed

    def exec_module(self, module):
        if self.real_spec is not None and self.real_spec.loader is not None:
            real = importlib.util.module_from_spec(self.real_spec)
            sys.modules[STANDIN_NAME] = real
            try:
                self.real_spec.loader.exec_module(real)
                return  # the real package imported: it stays in sys.modules
            except Exception as err:  # CUDA-only wheel: ImportError / OSError
                _purge_real()
                reason = f"{type(err).__name__}: {err}"
        else:
            reason = "no sgl_kernel package installed"
        from . import kernel_standin

        sys.modules[STANDIN_NAME] = kernel_standin.build_module(reason)


def _purge_real() -> None:
    for name in list(sys.modules):
        if name == STANDIN_NAME or name.startswith(STANDIN_NAME + "."):
            del sys.modules[name]


class SglKernelFinder(importlib.abc.MetaPathFinder):
    """Answers only for the top-level name `sgl_kernel`; submodules of the stand-in
    fail with ModuleNotFoundError (its `__path__` is empty), which is what sglang's
    own try/except around optional `sgl_kernel.<sub>` imports expects, except
    `sgl_kernel.mamba`, which the stand-in puts in `sys.modules` itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != STANDIN_NAME:
            return None
        real_spec = importlib.machinery.PathFinder.find_spec(fullname, None)
        return importlib.machinery.ModuleSpec(
            fullname, _StandInLoader(real_spec), is_package=True
        )


def install_sgl_kernel_finder() -> bool:
    """Install the finder once per process (front of `sys.meta_path`). Returns True
    when it was installed by this call."""
    if STANDIN_NAME in sys.modules:
        return False
    if any(isinstance(f, SglKernelFinder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, SglKernelFinder())
    return True
