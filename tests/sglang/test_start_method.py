"""`cpu/start_method.py`: a CPU server forks its scheduler and detokenizer only where a
forked child can run torch's thread pool; each case runs in a fresh interpreter, since
the test process itself has used OpenMP long ago."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refusal(setup: str, **env) -> object:
    code = textwrap.dedent(f"""
        import json, threading, time
        import torch
        {setup}
        from sglang_domino.sglang.cpu.start_method import fork_refusal
        print(json.dumps(fork_refusal(timeout_s=5.0)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "2", **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_fresh_launcher_forks():
    # torch imported and single-threaded ops run: no OpenMP team yet
    assert _refusal("torch.ones(8).add_(1.0)") is None


def test_a_launcher_that_used_torchs_threads_spawns():
    """The hazard itself: after a parallel op in the launcher, a forked child's first
    parallel op never returns; the probe finds it and the launcher spawns."""
    reason = _refusal("torch.set_num_threads(2); torch.ones(1 << 20).add_(1.0)")
    assert reason is not None and "OpenMP" in reason, reason


def test_a_launcher_with_other_python_threads_spawns():
    reason = _refusal("threading.Thread(target=time.sleep, args=(30,), name='user-thread', daemon=True).start()")
    assert reason is not None and "user-thread" in reason, reason


def test_the_debug_switch_keeps_upstreams_spawn():
    assert _refusal("", SGLANG_DOMINO_DEBUG="spawn-cpu-processes") == "SGLANG_DOMINO_DEBUG=spawn-cpu-processes"


def test_the_launch_is_forked_then_the_start_method_restored(monkeypatch):
    from sglang_domino.sglang.cpu import start_method

    seen = []
    monkeypatch.setattr(start_method, "fork_refusal", lambda: None)
    previous = mp.get_start_method(allow_none=True)
    result = start_method.around_launch_schedulers(lambda cls, x: seen.append((cls, x, mp.get_start_method())) or 7,
                                                   "Engine", 3)
    assert result == 7 and seen == [("Engine", 3, "fork")]
    assert mp.get_start_method(allow_none=True) == previous

    monkeypatch.setattr(start_method, "fork_refusal", lambda: "a reason")
    seen.clear()
    start_method.around_launch_detokenizers(lambda cls: seen.append(mp.get_start_method(allow_none=True)), "Engine")
    assert seen == [previous]
