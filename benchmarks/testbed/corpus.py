"""The test bed's text: documents for the target, prompts for the drafts and for evaluation.

Two corpora, both on every machine with no download:
- `codechat` (the default): generated chat conversations about small Python functions
  (`codechat.py`), held out by task;
- `stdlib`: the Python standard library's own source files, held out by a hash of the
  file's path relative to the stdlib root (kept to reproduce the comparison in the README:
  at the same training budget the stdlib target repeats lines and is far less certain).
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from . import codechat
from .codechat import is_held_out  # one hash split for files and tasks

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


def split(limit: int, eval_every: int) -> tuple[list[str], list[str]]:
    files = stdlib_files(limit)
    held = [f for f in files if is_held_out(f, eval_every)]
    train = [f for f in files if not is_held_out(f, eval_every)]
    return train, held


def read(rel_path: str) -> str:
    return (stdlib_root() / rel_path).read_text(encoding="utf-8", errors="replace")


def documents(spec, held_out: bool) -> list[str]:
    """The target's training documents (or held-out ones, for perplexity)."""
    d = spec.data
    if spec.corpus == "codechat":
        count = d.eval_conversations if held_out else d.train_conversations
        convs = codechat.conversations(count, spec.seed + (5 if held_out else 4), d.eval_every, held_out)
        return [codechat.render(c) for _, c in convs]
    train, held = split(spec.max_stdlib_files, d.eval_every)
    return [read(f) for f in (held if held_out else train)]


def prompts(spec, tok, held_out: bool, count: int, seed: int) -> list[dict]:
    """`count` prompts as {"source", "prompt_ids"} (codechat adds the user's "prompt" text and
    the "messages" so far, for chat APIs)."""
    rng = random.Random(seed)
    if spec.corpus == "codechat":
        return _chat_prompts(tok, count, rng, spec.data.eval_every, held_out)
    train, held = split(spec.max_stdlib_files, spec.data.eval_every)
    return _chunks(tok, held if held_out else train, spec.data.prompt_tokens, count, rng)


def _chat_prompts(tok, count: int, rng: random.Random, eval_every: int, held_out: bool) -> list[dict]:
    # Training prompts stop before any assistant turn (second turns included); evaluation
    # prompts are first requests only, the shape a chat benchmark sends.
    out = []
    for sig, conv in codechat.conversations(count, rng.randrange(2**31), eval_every, held_out):
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
        cut = turns[0] if held_out else rng.choice(turns)
        messages = conv[:cut]
        text = codechat.render(messages, add_generation_prompt=True)
        out.append({"source": sig, "prompt": messages[-1]["content"], "messages": messages,
                    "prompt_ids": tok(text, add_special_tokens=False)["input_ids"]})
    return out


def _chunks(tok, files: list[str], n_tokens: int, count: int, rng: random.Random) -> list[dict]:
    """`count` prompts of `n_tokens` tokens starting at line starts of randomly chosen files."""
    out = []
    texts = {f: read(f) for f in files}
    encoded = {f: tok(texts[f], add_special_tokens=False)["input_ids"] for f in files}
    usable = [f for f in files if len(encoded[f]) > 2 * n_tokens]
    while len(out) < count and usable:
        f = rng.choice(usable)
        ids = encoded[f]
        start = rng.randrange(0, len(ids) - 2 * n_tokens)
        # Start on a new line, as a person's prompt would.
        while start < len(ids) - 2 * n_tokens and "\n" not in tok.decode(ids[start:start + 1]):
            start += 1
        out.append({"source": f, "prompt_ids": ids[start + 1:start + 1 + n_tokens]})
    return out
