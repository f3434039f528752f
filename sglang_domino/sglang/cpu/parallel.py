"""`--tp-size N` with `--device cpu`, no extra flag or environment variable.

0.5.23's CPU engine runs tensor parallelism over gloo, but three things stop it on a
machine like this one (one NUMA node, a CUDA build of torch):
  * `numa_utils.init_threads_binding` asserts at most one rank per NUMA node unless
    `SGLANG_CPU_OMP_THREADS_BIND` names each rank's cores;
  * every in-tree platform's TP group builds a PyNccl communicator
    (`parallel_state.init_model_parallel_group`, `use_pynccl=None`); libnccl loads from
    the CUDA wheel and the communicator then fails on the CPU device
    (`PyNcclCommunicator.__init__`, `ValueError: Expected a cuda device, but got: cpu`);
  * the thread binding is applied only with Intel AMX or on arm64
    (`bootstrap._init_cpu_threads_env`, via `sgl_kernel.init_cpu_threads_env`), so
    elsewhere every rank runs on every core.
Installed in CPU-engine processes by `plugin.register` (the `cpu engine` group of
`hooks.py`), before a scheduler builds its groups:
  * AROUND `bootstrap._bind_threads_if_cpu`: with more ranks than NUMA nodes and no
    binding given, each rank of this node (`--nnodes`) gets a contiguous share of the
    cores this process may use
    (`os.sched_getaffinity`), refused when there are fewer cores than ranks; without
    AMX/arm64 the rank is then pinned to its share, with at most as many torch threads
    as it has cores (never more than the process already had: `OMP_NUM_THREADS` holds);
  * AROUND `parallel_state.init_model_parallel_group`: groups built without an explicit
    choice get no PyNccl and no custom all-reduce (gloo does every collective).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def split_cores(cores: list[int], ranks: int) -> list[list[int]]:
    """Contiguous, near-equal shares of `cores` for `ranks` ranks (the first ones one
    larger when it does not divide)."""
    cores = sorted(cores)
    if ranks > len(cores):
        raise ValueError(
            f"--tp-size x --dp-size x --pp-size = {ranks} ranks on CPU needs a core per rank; this process "
            f"may use {len(cores)} ({cores}, os.sched_getaffinity). Lower the ranks or set {BIND_ENV} "
            "(e.g. '0|1') to share cores")
    base, extra = divmod(len(cores), ranks)
    out, start = [], 0
    for r in range(ranks):
        size = base + (1 if r < extra else 0)
        out.append(cores[start:start + size])
        start += size
    return out


def bind_string(groups: list[list[int]]) -> str:
    """`SGLANG_CPU_OMP_THREADS_BIND` syntax: comma-separated cores per rank, ranks by '|'."""
    return "|".join(",".join(str(c) for c in group) for group in groups)


def parse_cores(spec) -> list[int]:
    """'0-3,8' or [0, 1] -> [0, 1, 2, 3, 8]."""
    if isinstance(spec, (list, tuple)):
        return [int(c) for c in spec]
    cores = []
    for part in str(spec).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-")
            cores.extend(range(int(lo), int(hi) + 1))
        elif part:
            cores.append(int(part))
    return cores


def node_binding(ranks: int, nnodes: int, cores: list[int], numa_nodes: int):
    """`SGLANG_CPU_OMP_THREADS_BIND` for this node, or None where upstream's own binding
    serves (one rank, or no more ranks than NUMA nodes). Upstream indexes the binding by the
    node-local device id, so the ranks of this node (ranks / nnodes) share this node's
    cores; upstream asserts on the global count, so a node with one rank still gets one."""
    if ranks <= 1 or ranks <= numa_nodes:
        return None
    if nnodes < 1 or ranks % nnodes:
        raise ValueError(f"--nnodes {nnodes} does not divide the {ranks} ranks (dp x tp x pp)")
    return bind_string(split_cores(cores, ranks // nnodes))


def around_bind_threads(original, *args, device=None, **kwargs):
    if device != "cpu":
        return original(*args, device=device, **kwargs)
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils import numa_utils

    parallel = get_parallel()
    ranks = int(parallel.dp_size) * int(parallel.tp_size) * int(parallel.pp_size)
    if BIND_ENV not in os.environ:
        binding = node_binding(ranks, int(getattr(parallel, "nnodes", 1) or 1), sorted(os.sched_getaffinity(0)),
                               len(numa_utils.get_cpu_ids_by_node()))
        if binding is not None:
            os.environ[BIND_ENV] = binding
    local = original(*args, device=device, **kwargs)
    if ranks > 1 and local is not None and not _upstream_binds_threads():
        _pin(parse_cores(local))
    return local


def _upstream_binds_threads() -> bool:
    from sglang.srt.distributed import bootstrap

    return bool(getattr(bootstrap, "_is_cpu_amx_available", False) or getattr(bootstrap, "_is_cpu_arm64", False))


def _pin(cores: list[int]) -> None:
    import torch

    os.sched_setaffinity(0, cores)
    threads = min(torch.get_num_threads(), len(cores))
    torch.set_num_threads(threads)
    logger.info("sglang-domino: this CPU rank runs on cores %s with %d torch thread(s)", cores, threads)


def around_init_model_parallel_group(original, *args, **kwargs):
    if kwargs.get("use_pynccl") is None:
        kwargs["use_pynccl"] = False
    if kwargs.get("use_custom_allreduce") is None:
        kwargs["use_custom_allreduce"] = False
    return original(*args, **kwargs)

