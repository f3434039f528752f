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
# Verify width below the draft block (b8), carried from argument resolution in the
# main process to the spawned schedulers (ServerArgs keeps only its own fields).
VERIFY_WIDTH_ENV = "SGLANG_DOMINO_VERIFY_WIDTH"
# Opt-in: verify window of the Transformers backend for `shift_label` Domino drafts
# (draft block B, B proposals, B + 1 verified). Set by the user (`=1`); the resolved
# draft block travels to the schedulers in DRAFT_BLOCK_ENV.
HF_WINDOW_ENV = "SGLANG_DOMINO_HF_WINDOW"
DRAFT_BLOCK_ENV = "SGLANG_DOMINO_DRAFT_BLOCK"


def plugin_disabled() -> bool:
    import os

    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
