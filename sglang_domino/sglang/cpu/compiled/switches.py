"""The CPU port's switches and what its compiled pieces share.

The compiled CPU step (the layers of the target and the draft, the draft's context write,
the Domino rollout) is switched on by SGLang's own `--enable-torch-compile` with `--device
cpu`; its graphs are cached across restarts where SGLang keeps its compile caches
(`$SGLANG_CACHE_DIR/inductor`; `TORCHINDUCTOR_CACHE_DIR` overrides it). The two environment
switches that once selected it are refused with a message naming the flag
(`environment.REMOVED`)."""

from __future__ import annotations

import os

# graphs one compiled function may hold: the compiled rollout keeps two per block length
# (up to 5 block lengths with the adaptive widths and the window), the compiled layers four
# per model (the target's and the draft's on one code); past torch's default of 8, dynamo
# would run a new shape eagerly without a word
RECOMPILE_LIMIT = 16


FLAG = "--enable-torch-compile"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def compiled_step(server_args) -> bool:
    """Whether a server's arguments ask for the compiled CPU step: `--device cpu` with
    `--enable-torch-compile`."""
    return (str(getattr(server_args, "device", "") or "").startswith("cpu")
            and bool(getattr(server_args, "enable_torch_compile", False)))


class _Process:
    compiled = False   # set when this process's first CPU model is compiled


def set_compiled_step() -> None:
    _Process.compiled = True


def compiled_step_serving() -> bool:
    """Whether this process serves the compiled CPU step (its models were compiled)."""
    return _Process.compiled


def cache_dir() -> str:
    """Where the compiled graphs are cached: $TORCHINDUCTOR_CACHE_DIR, else SGLang's own
    choice for it (`inductor` under $SGLANG_CACHE_DIR, ~/.cache/sglang by default), so that
    a restart finds them (torch's own default, which the variable may already hold, is
    under /tmp)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    explicit = os.environ.get(CACHE_ENV)
    # torch sets the variable to its own default the first time it asks (`python -m
    # sglang.launch_server` gets there before SGLang's redirect): that is not the user's choice
    if explicit and os.path.abspath(explicit) != os.path.abspath(default_cache_dir()):
        return os.path.abspath(explicit)
    from sglang.srt.environ import third_party_cache_defaults

    return os.path.abspath(third_party_cache_defaults()[CACHE_ENV])


def persistent_cache(_server_args=None) -> str:
    """Point torch's compile cache at `cache_dir()` for this process (before its first
    compile; SGLang's server entry does the same where it runs first); the directory."""
    path = cache_dir()
    os.environ[CACHE_ENV] = path
    os.makedirs(path, exist_ok=True)
    return path


# oneDNN keeps the kernels it builds per matrix shape in one process-wide cache of 1024
# entries by default, two per packed product and number of rows (the product and the matmul
# it nests). The start-up warms every row count a server's decode steps use
# (`forward.warm_shapes`): an adaptive-width Domino server's target alone fills the default
# (4 products x 128 row counts x 2), and its draft's then evict the target's first ones,
# which the first steps of those sizes build again. Sized for the largest warm-up
# (`forward.WARM_BATCH_CAP` requests x 5 widths x 8 products x 2, target and draft) with
# room for prefills; an entry costs only when a shape is built.
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 8192


def prepare(_server_args=None) -> str:
    """The `cpu compiled forward` group's preparation (`hooks.install_moment`, before the
    process builds its model): the compile cache (`persistent_cache`) and oneDNN's kernel
    cache capacity, read once, when oneDNN first builds a kernel (a value the user set is
    kept); the compile cache's directory."""
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))
    return persistent_cache()


def allow_graphs() -> None:
    """Let every compiled function hold RECOMPILE_LIMIT graphs (never lowering the limit)."""
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


class Graph:
    """`torch.compile(fn, dynamic=True)` (its graphs held up to RECOMPILE_LIMIT), traced
    with the floats it reads off modules specialized as constants. Dynamo otherwise lifts
    each such float (every RMSNorm's `variance_epsilon`: 25 in the test bed's target) into
    a graph input, a 0-d tensor built from the float on every call: on a 2-core AMD EPYC
    Zen 3 that bytecode took about 0.17 ms a call, 0.014 ms specialized. Only tracing reads
    the setting, so it is set around each call rather than for the process, where
    upstream's own compiled functions would specialize their float arguments too (a
    graph per value)."""

    def __init__(self, fn):
        import torch

        allow_graphs()
        self._compiled = torch.compile(fn, dynamic=True)

    def __call__(self, *args):
        import torch._dynamo

        config = torch._dynamo.config
        previous, config.specialize_float = config.specialize_float, True
        try:
            return self._compiled(*args)
        finally:
            config.specialize_float = previous


def guarded_inputs(tensors, fresh_strides: bool = False) -> tuple:
    """`tensors` as a compiled function's warm-up saw them, for a call in the current mode:
    dynamo's guards tell inference tensors from others (and check strides), so an input of
    the other kind than the mode, or any input with `fresh_strides` (a strided view such as
    a column of the step's ids), is copied in this mode; a matching input passes as it is.
    Without this, serving compiles every graph again (tests/sglang/test_cpu_rollout.py)."""
    import torch

    inference = torch.is_inference_mode_enabled()
    return tuple(t.clone(memory_format=torch.contiguous_format) if fresh_strides or t.is_inference() != inference
                 else t for t in tensors)


__all__ = ["CACHE_ENV", "FLAG", "Graph", "ONEDNN_CACHE_CAPACITY", "ONEDNN_CACHE_ENV", "RECOMPILE_LIMIT",
           "allow_graphs", "cache_dir", "compiled_step", "compiled_step_serving", "guarded_inputs",
           "persistent_cache", "prepare", "set_compiled_step"]
