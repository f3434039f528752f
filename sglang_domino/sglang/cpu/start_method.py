"""CPU servers fork their scheduler and detokenizer processes instead of spawning them.

0.5.23 starts every child of the launching process with multiprocessing's `spawn`
(`engine.py` `_set_envs_and_config`): each scheduler and the detokenizer is a fresh Python
that imports SGLang again. On a 2-core machine that import is about 11 s of a start-up
(docs/cpu.md), paid again by every restart. The launching process has already imported
all of it, and on CPU there is no CUDA context to lose across a fork, so forked children
start where the launcher stands.

What a fork cannot survive is an OpenMP thread team: GNU libgomp (torch's CPU threads)
does not rebuild its pool in a forked child, whose first parallel op then waits forever on
threads that are not there. A server's launcher runs no parallel op before launching, but
an `sgl.Engine` in a user's process may have. So each launch first forks a probe that runs
one parallel op; only if it finishes (within `PROBE_TIMEOUT_S`) are the children forked,
else they are spawned as upstream does and the log says why. Launches with Python threads
besides the main one (a user's process) spawn too: a thread holding a lock at the fork
would leave the child that lock held forever.

`SGLANG_DOMINO_DEBUG=spawn-cpu-processes` keeps upstream's spawn (side-by-side timings).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import threading
from typing import Optional

from ..environment import debug

logger = logging.getLogger(__name__)

DEBUG_CHECK = "spawn-cpu-processes"
PROBE_TIMEOUT_S = 20.0   # a healthy probe takes well under a second, even on a busy machine


def _probe() -> None:
    """In a forked child: one op large enough for torch's parallel loop (its grain is 32768
    elements) on two threads, which enters an OpenMP region."""
    import torch

    torch.set_num_threads(max(2, torch.get_num_threads()))
    torch.ones(1 << 20).add_(1.0)
    os._exit(0)


def fork_refusal(timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why this process must not fork its children now (None: it may)."""
    if debug(DEBUG_CHECK):
        return f"SGLANG_DOMINO_DEBUG={DEBUG_CHECK}"
    if not sys.platform.startswith("linux"):
        return f"platform {sys.platform}"
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"the launching process runs other Python threads ({', '.join(sorted(others))})"
    probe = mp.get_context("fork").Process(target=_probe, daemon=True)
    probe.start()
    probe.join(timeout_s)
    if probe.exitcode is None:
        probe.kill()
        probe.join()
        return (f"a forked probe's first parallel op did not finish in {timeout_s:.0f} s (the launching "
                "process has used torch's OpenMP threads, which a forked child cannot)")
    if probe.exitcode != 0:
        return f"a forked probe exited with code {probe.exitcode}"
    return None


def _launch_forked(original, what: str, cls, *args, **kwargs):
    reason = fork_refusal()
    if reason is not None:
        logger.info("sglang-domino: the CPU %s spawned as 0.5.23 does: %s", what, reason)
        return original(cls, *args, **kwargs)
    previous = mp.get_start_method(allow_none=True)
    mp.set_start_method("fork", force=True)
    try:
        result = original(cls, *args, **kwargs)
    finally:
        mp.set_start_method(previous, force=True)
    logger.info("sglang-domino: the CPU %s forked from the launching process (no second import of SGLang)", what)
    return result


def around_launch_schedulers(original, cls, *args, **kwargs):
    """AROUND `Engine._launch_scheduler_processes` (CPU engine): fork when it is safe."""
    return _launch_forked(original, "scheduler processes", cls, *args, **kwargs)


def around_launch_detokenizers(original, cls, *args, **kwargs):
    """AROUND `Engine._launch_detokenizer_subprocesses` (CPU engine): fork when it is safe."""
    return _launch_forked(original, "detokenizer processes", cls, *args, **kwargs)


__all__ = ["DEBUG_CHECK", "PROBE_TIMEOUT_S", "around_launch_detokenizers", "around_launch_schedulers",
           "fork_refusal"]
