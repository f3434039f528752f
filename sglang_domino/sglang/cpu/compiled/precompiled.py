"""The compiled CPU step's graphs kept across restarts, whole.

Torch's compile cache (`switches.cache_dir`) keeps inductor's code, but a restart still
traces every graph again with dynamo, which is most of a warm start: on a 2-core AMD
EPYC Zen 3 the test bed's Domino server spent about 11 s of its 35 s start-up there (the
target's layers 5.4 s, the draft's 2.7 s, the rollout 3.3 s). Here each graph is compiled
ahead of its first call (`torch.compile(...).aot_compile`, one graph per call kind: the
rows of a step dynamic, one row apart, as dynamo specializes it) and saved with its guards
beside the compile cache; a restart loads it instead of tracing.

A saved graph is used only where it still holds: torch's own check of the versions it
was built with, the checksum of every source line it traced (ours and upstream's), and
its guards on the call's inputs (shapes, dtypes, modes, the modules' structure and
constants), checked before every call as dynamo checks its own. A graph that no longer
holds is compiled again and saved beside the others of its kind (a few per kind: models
of other sizes keep theirs); one that cannot be saved is served from memory, with one
warning."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import sys
import uuid
from typing import Optional

import torch

logger = logging.getLogger(__name__)

KEPT = 4   # saved graphs per call kind (other models' graphs of the same code and kind)
DIR = "sglang_domino_graphs"


class Stats:
    """This process's graphs: loaded from disk, compiled (and saved)."""
    loaded = 0
    compiled = 0


def tally() -> tuple[int, int]:
    return Stats.loaded, Stats.compiled


def since(before: tuple[int, int]) -> str:
    """What the start-up log says of the graphs made since `tally()` gave `before`."""
    loaded, compiled = Stats.loaded - before[0], Stats.compiled - before[1]
    return f"{loaded} graph{'s' * (loaded != 1)} loaded, {compiled} compiled ahead"


def package_sources() -> list[str]:
    """This package's sources, `sglang_domino` and its kernels (which install from the
    repository's `kernels/`). Only the package's own folders: a checkout's root also holds
    virtual environments, whose tens of thousands of sources took 10-15 s to read in every
    server process."""
    import sglang_domino
    from .... import kernels

    roots = {os.path.dirname(os.path.abspath(sglang_domino.__file__)), *map(os.path.abspath, kernels.__path__)}
    paths = []
    for root in sorted(roots):
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.join(folder, f) for f in files if f.endswith((".py", ".cpp"))]
    return sorted(set(paths))


@functools.cache
def _package_digest() -> str:
    """A digest of this package's sources: a graph saved by other code is not used (dynamo
    checksums the lines it traced, not the module constants they read)."""
    digest = hashlib.sha256()
    for path in package_sources():
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + fh.read())
    return digest.hexdigest()


def _call(fn, args) -> list[str]:
    """What a graph of `fn` for a call with `args` is built for and specialized on that
    its saved guards would not tell apart: versions, CPU, the function, the modes, one
    row or many, the arguments' dtypes and the numbers among them, whether the kernel
    library's linear op is there."""
    from ....kernels import cpu_linear

    parts = [torch.__version__, sys.version.split()[0], torch.backends.cpu.get_cpu_capability(),
             f"{fn.__module__}.{fn.__qualname__}", f"linear op {cpu_linear.available()}",
             f"grad {torch.is_grad_enabled()} inference {torch.is_inference_mode_enabled()}"]
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{a.dtype} {a.dim()} {'one' if a.dim() and a.shape[0] == 1 else 'many'}")
        else:
            parts.append(repr(a))
    return parts


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def kind(fn, args) -> str:
    """The directory name of `fn`'s graphs for a call with `args`: the call's kind
    (`_call`) and this package's code."""
    return _digest([*_call(fn, args), _package_digest()])


# guards dynamo drops to save a graph that check only which object a name is (no object of
# another process is the same one): the traced code's sources are checked instead
# (`_sources_hold`), and the package's (`kind`)
IDENTITY = ("ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "CLOSURE_MATCH", "NN_MODULE",
            "WEAKREF_ALIVE", "DICT_VERSION", "DUPLICATE_INPUT")


def _reading(guard) -> Optional[str]:
    """What a dropped guard on a global's value reads, as saved beside the graph: the
    value's repr (its length for SEQUENCE_LENGTH); None where it checks identity only."""
    if guard.guard_type in IDENTITY or set(guard.derived_guard_types) & set(IDENTITY) or not guard.has_value:
        return None
    return str(len(guard.value)) if guard.guard_type == "SEQUENCE_LENGTH" else repr(guard.value)


class _GuardFilter:
    """Which guards a graph compiled ahead keeps: those dynamo can save. Dynamo also drops
    those on globals (module constants, flags such as whether the kernel library is
    loaded); each one on a value is kept here (`globals`: name -> reading) and read again
    before a saved graph is used (`_globals_hold`)."""

    def __init__(self):
        self.globals: dict[str, list] = {}

    def __call__(self, guards) -> list[bool]:
        from torch._dynamo.guards import CheckFunctionManager

        keep = []
        for g in guards:
            dropped = g.is_global or g.guard_type in CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
            if dropped and g.is_global and (reading := _reading(g)) is not None:
                self.globals[f"{g.name} {g.guard_type}"] = [g.name, g.guard_type, reading]
            keep.append(not dropped)
        return keep


class _Globals(dict):
    """The globals a guard's name reads (`G[...]`): the traced function's module's, and the
    modules dynamo imports under `__import_<dotted path>`."""

    def __init__(self, module_globals: dict):
        super().__init__(module_globals)

    def __missing__(self, name: str):
        if name.startswith("__import_"):
            return importlib.import_module(name[len("__import_"):].replace("_dot_", "."))
        raise KeyError(name)


def _globals_hold(fn, saved: dict) -> bool:
    """Whether every global a saved graph was guarded on still reads as it did."""
    scope = {"G": _Globals(getattr(fn, "__func__", fn).__globals__)}
    for name, guard_type, reading in saved.values():
        try:
            value = eval(name, scope)   # a guard's own name: G['module'].attribute[index]
        except Exception:
            return False
        if (str(len(value)) if guard_type == "SEQUENCE_LENGTH" else repr(value)) != reading:
            return False
    return True


def _sources_hold(graph) -> bool:
    """Whether every source line `graph` traced reads as it did when it was compiled."""
    from torch._dynamo.package import _hash_sourcelines

    for source in graph.source_info().inlined_sources:
        module = importlib.import_module(source.module)
        if _hash_sourcelines(module, source.firstlineno, source.lastlineno) != source.checksum:
            return False
    return True


def _load(path: str, fn, bound: tuple, args):
    """The graph saved at `path` if it holds for a call with `args` (after `bound`), else None."""
    try:
        with open(path + ".globals.json", encoding="utf-8") as fh:
            saved = json.load(fh)
        if not _globals_hold(fn, saved):
            return None
        with open(path, "rb") as fh:
            graph = torch.compiler.load_compiled_function(fh)
        if _sources_hold(graph) and graph.guard_check(*bound, *args):
            return graph
    except Exception as exc:   # a file of another torch, a truncated write: compiled again
        logger.info("sglang-domino: compiled graph %s not used (%s: %s)", path, type(exc).__name__, exc)
    return None


_named: dict[str, int] = {}   # graphs compiled ahead in this process, by kind


@contextlib.contextmanager
def _stable_name(kind_name: str):
    """Name the graph compiled ahead the same in every process (the n-th of its call kind
    here, `_call`): dynamo names each one with a random uuid, which its graph's key in
    inductor's cache takes in, so a graph compiled ahead never met one cached before
    (every graph compiled from scratch, 30 s and more for the test bed's target on a
    2-core EPYC). The name leaves this package's code out: servers of other options, and
    a new version of the package, meet inductor's cache for every graph they trace the
    same (the key holds the graph itself). Names stay unique within a process, the form
    dynamo checks (`__compiled_fn_<n>_<uuid>`) kept."""
    from torch._dynamo import output_graph

    n = _named.get(kind_name, 0)
    _named[kind_name] = n + 1
    stable = uuid.uuid5(uuid.NAMESPACE_OID, f"sglang-domino {kind_name} {n}")
    name = f"__compiled_fn_{n}_{str(stable).replace('-', '_')}"
    original = output_graph.make_compiled_fn_name
    output_graph.make_compiled_fn_name = lambda: name
    try:
        yield
    finally:
        output_graph.make_compiled_fn_name = original


def _saved(directory: str) -> list[str]:
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".graph")]
    except FileNotFoundError:
        return []
    dated = []
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            dated.append((os.path.getmtime(path), path))
    return [path for _, path in sorted(dated, reverse=True)]   # the newest first


class _Warned:
    save = False


def adopt(fn, bound: tuple, args, cache: str):
    """A graph for the call `fn(*args)` (`bound`: the object `fn` is bound to, if any, the
    graph's leading argument): loaded from `cache` where one saved there holds, else
    compiled ahead of the call and saved there."""
    from torch._dynamo.convert_frame import compile_lock

    # one graph at a time, as dynamo compiles its own (ranks run as threads in tests)
    with compile_lock:
        return _adopt(fn, bound, args, cache)


def _adopt(fn, bound: tuple, args, cache: str):
    directory = os.path.join(cache, DIR, kind(fn, args))
    for path in _saved(directory):
        graph = _load(path, fn, bound, args)
        if graph is not None:
            Stats.loaded += 1
            with contextlib.suppress(OSError):   # another start-up may be pruning it
                os.utime(path)   # kept as the newest of its kind
            return graph
    guards = _GuardFilter()
    with _stable_name(_digest(_call(fn, args))):
        graph = torch.compile(fn, dynamic=True, fullgraph=True,
                              options={"guard_filter_fn": guards}).aot_compile((args, {}))
    Stats.compiled += 1
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{os.getpid()}-{Stats.compiled}.graph")
        with open(path + ".globals.json", "w", encoding="utf-8") as fh:   # read only once the graph is there
            json.dump(guards.globals, fh)
        graph.save_compiled_function(path)   # written whole or not at all
        for old in _saved(directory)[KEPT:]:
            for stale in (old, old + ".globals.json"):
                with contextlib.suppress(OSError):
                    os.remove(stale)
    except Exception as exc:
        if not _Warned.save:
            _Warned.save = True
            logger.warning("sglang-domino: a compiled graph could not be saved for the next start-up, it is "
                           "compiled again then (%s: %s)", type(exc).__name__, exc)
    return graph


__all__ = ["DIR", "KEPT", "Stats", "adopt", "kind", "package_sources", "since", "tally"]
