"""The SGLang plugin of sglang-domino (the only subpackage that imports `sglang`).

Entry points (see `pyproject.toml`):

* `sglang.srt.platforms` -> `sglang_domino.sglang.platform:activate`: runs inside the
  first `import sglang` of every SGLang process. With `--device cpu` on the command
  line it switches SGLang's CPU engine on and serves pure-PyTorch `sgl_kernel` ops when
  the real `sgl_kernel` cannot be imported. Stdlib only; returns None (SGLang keeps
  its own platform).
* `sglang.srt.plugins` -> `sglang_domino.sglang.plugin:register`: hooks worker creation
  so `--speculative-algorithm DFLASH` gets `DominoDFlashWorker` (a subclass of 0.5.23's
  `DFlashWorkerV2`), plus argument resolution (CPU, verify width below the block,
  draft-config checks) and the `--mamba-scheduler-strategy` alias.

`SGLANG_DOMINO_DISABLE=1` turns the worker and every hook of the general entry point off
(upstream behaviour: DFLASH gets 0.5.23's `DFlashWorkerV2`, and `--device cpu` with DFLASH
is refused as upstream refuses it); the CPU switch of the platform entry point stays.

Importing this package imports nothing from SGLang.
"""

DISABLE_ENV = "SGLANG_DOMINO_DISABLE"
# Opt-in: verify window of the Transformers backend for `shift_label` Domino drafts
# (draft block B, B proposals, B + 1 verified). Set by the user (`=1`).
HF_WINDOW_ENV = "SGLANG_DOMINO_HF_WINDOW"
# The draft block when it differs from the verify window (b8: block 16, window 8; the
# Transformers window: block 16, window 17), carried from argument resolution in the main
# process to the spawned schedulers (ServerArgs keeps only its own fields, and 0.5.23
# has one field for both, `speculative_num_draft_tokens`).
DRAFT_BLOCK_ENV = "SGLANG_DOMINO_DRAFT_BLOCK"
# `--speculative-adaptive` with DFLASH: the validated `AdaptiveWidthConfig` as JSON, carried
# to the schedulers the same way (0.5.23's own field is declared off: its EAGLE machinery
# would read the config file as EAGLE's).
ADAPTIVE_ENV = "SGLANG_DOMINO_ADAPTIVE"


def plugin_disabled() -> bool:
    import os

    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


_hooks_applied: set = set()


def apply_hooks_once(name: str, hooks) -> bool:
    """Register `hooks` ((upstream symbol, function, "AROUND" | "AFTER" | "BEFORE"), ...)
    with 0.5.23's `HookRegistry` and apply them, once per process for `name`; returns
    whether this call applied them."""
    if name in _hooks_applied:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in hooks:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    HookRegistry.apply_hooks()
    _hooks_applied.add(name)
    return True
