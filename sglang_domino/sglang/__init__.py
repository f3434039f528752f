"""The SGLang plugin of sglang-domino: the DFLASH/Domino speculative worker.

Two entry points (see `pyproject.toml`):

* `sglang.srt.platforms` -> `cpu.platform:activate`, run inside the first `import sglang`
  of every process: `--device cpu` switches SGLang's CPU engine on (the `cpu/` subpackage
  is stock SGLang on CPU and knows nothing of speculation).
* `sglang.srt.plugins` -> `plugin:register`, run in every process: DFLASH gets
  `worker.DominoDFlashWorker`, a subclass of 0.5.23's `DFlashWorkerV2`, and argument
  resolution learns this plugin's options (`resolve.py`).

Every patch of SGLang is declared in `hooks.py`; what resolution decides reaches the
schedulers through `settings.py`; the environment variables the plugin reads are the
table of `environment.py`. `SGLANG_DOMINO_DISABLE=1` turns the worker and every hook of the
general entry point off (upstream behaviour); the CPU switch stays.

Importing this package imports nothing from SGLang.
"""

from .environment import disabled as plugin_disabled

# the name the plugin's argument-resolution decisions are declared under
SOURCE = "sglang_domino"

__all__ = ["SOURCE", "plugin_disabled"]
