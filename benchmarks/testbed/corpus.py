"""The training text: the Python standard library's own source files.

Every installation of the same CPython version has the same files, so the corpus needs
no download. The held-out split is a hash of the file's path relative to the stdlib
root: it does not depend on listing order or on which other files exist.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# Test suites and IDLE are large, repetitive and unlike ordinary library code.
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit: int = 0) -> list[str]:
    """Relative paths of the stdlib's .py files, sorted (the first `limit` when > 0)."""
    root = stdlib_root()
    files = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py")
        if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
        # Build-machine specific (paths, compiler flags): not the same on every install.
        and not p.name.startswith("_sysconfigdata")
    )
    return files[:limit] if limit else files


def is_held_out(rel_path: str, eval_every: int) -> bool:
    h = int(hashlib.sha1(rel_path.encode()).hexdigest()[:8], 16)
    return h % eval_every == 0


def split(limit: int, eval_every: int) -> tuple[list[str], list[str]]:
    files = stdlib_files(limit)
    held = [f for f in files if is_held_out(f, eval_every)]
    train = [f for f in files if not is_held_out(f, eval_every)]
    return train, held


def read(rel_path: str) -> str:
    return (stdlib_root() / rel_path).read_text(encoding="utf-8", errors="replace")
