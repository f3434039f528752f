"""A test body run in a fresh interpreter: for in-process ranks (threads) entering compiled
code, which beside the graphs an earlier test compiled in the same process hung or crashed
it (a test artifact: a server's ranks are processes)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_fresh(function, last_line: str, timeout: float = 300) -> None:
    """`function()` (a module-level function of a test module) in a new interpreter at the
    repository root; it must exit 0 and print `last_line` last."""
    code = f"from {function.__module__} import {function.__name__}; {function.__name__}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(last_line), done.stdout[-2000:]
