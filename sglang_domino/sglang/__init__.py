"""The SGLang plugin of sglang-domino: the DFLASH/Domino speculative worker.

Two entry points (see `pyproject.toml`):

* `sglang.srt.platforms` -> `cpu.platform:activate`, run inside the first `import sglang`
  of every process: `--device cpu` switches SGLang's CPU engine on (the `cpu/` subpackage
  is stock SGLang on CPU and knows nothing of speculation).
* `sglang.srt.plugins` -> `plugin:register`, run in every process: DFLASH gets
  `worker.DominoDFlashWorker`, a subclass of 0.5.23's `DFlashWorkerV2`, and argument
  resolution learns this plugin's options (`resolve.py`).

Every patch of SGLang is declared in `hooks.py`; what resolution decides reaches the
schedulers through `settings.py`. `SGLANG_DOMINO_DISABLE=1` turns the worker and every hook
of the general entry point off (upstream behaviour); the CPU switch stays.

Importing this package imports nothing from SGLang.
"""

import os

DISABLE_ENV = "SGLANG_DOMINO_DISABLE"
# Opt-in: verify window of the Transformers backend for `shift_label` Domino drafts
# (draft block B, B proposals, B + 1 verified). Set by the user (`=1`).
HF_WINDOW_ENV = "SGLANG_DOMINO_HF_WINDOW"


def env_flag(name: str) -> bool:
    """A user-facing boolean environment variable (`1`, `true`, `yes`, `on`)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def plugin_disabled() -> bool:
    return env_flag(DISABLE_ENV)
