"""`sglang.srt.plugins` entry point: `register()`, and the hooks every process gets.

SGLang calls `register()` in every process (`sglang serve` before argument parsing, each
scheduler before it is built, the detokenizer, the DP controller) and only *logs* a
plugin that raises, so `hooks_installed()` lets tests assert that the hooks are live.

Cheap to import and to run: `register()` imports only light sglang modules; the worker
module (which imports `dflash_worker_v2`) is imported the first time a DFLASH worker is
created. What it installs is the `every process` group of `hooks.py` and, with
`--device cpu`, the `cpu engine` group.
"""

from __future__ import annotations

import argparse
import logging

from .seam import hooks
from . import plugin_disabled
from . import settings as scheduler_settings

logger = logging.getLogger(__name__)

OLD_MAMBA_FLAG = "--mamba-scheduler-strategy"
REJECTION_HELP = (
    "With DFLASH and a Domino draft (sglang-domino): sampled requests draw each proposal from the "
    "draft's own distribution q and accept it with min(1, p/q). Refused for plain DFlash drafts, "
    "whose sampled requests are always verified as point masses (their independent positions "
    "sampled from q accept less).")


def register() -> None:
    """Entry point. Idempotent per process."""
    if plugin_disabled():
        return
    # `every process`, and `cpu engine` where SGLang's CPU engine runs
    hooks.install_moment(hooks.Moment.REGISTER)


def hooks_installed() -> dict[str, bool]:
    """Which hook rows of `hooks.py` are live in this process (after `load_plugins()`)."""
    return hooks.installed()


# -- the `every process` hooks -----------------------------------------------------------
def around_create_worker(original, algo, server_args):
    if algo.is_dflash() and not plugin_disabled():
        from .step.worker import DominoDFlashWorker  # heavy: lazily, in the scheduler only

        return DominoDFlashWorker
    return original(algo, server_args)


def around_max_draft_tokens(original, algo, server_args):
    """`max_speculative_num_draft_tokens` sizes the per-request token capacity of the
    runners' buffers (the eager runner, the logits rows, the KV pool and `req_to_token`
    headroom). The draft block can be wider than the verify window (b8): the draft
    forward needs room for the block."""
    result = original(algo, server_args)
    draft_block = scheduler_settings.current().draft_block
    if algo.is_dflash() and draft_block and result is not None and not plugin_disabled():
        return max(int(result), int(draft_block))
    return result


def after_add_cli_args(result, *args, **kwargs):
    parser = args[0] if args else kwargs.get("parser")
    if not isinstance(parser, argparse.ArgumentParser):
        return result
    if any(OLD_MAMBA_FLAG in action.option_strings for action in parser._actions):
        return result
    choices = None
    for action in parser._actions:
        if action.dest == "mamba_radix_cache_strategy":
            choices = action.choices
    parser.add_argument(
        OLD_MAMBA_FLAG,
        dest="mamba_radix_cache_strategy",
        choices=choices,
        default=argparse.SUPPRESS,  # never overrides --mamba-radix-cache-strategy's default
        help="Alias of --mamba-radix-cache-strategy (the name used by the Domino model cards; "
        "added by sglang-domino).",
    )
    for action in parser._actions:
        if action.dest == "speculative_use_rejection_sampling" and REJECTION_HELP not in (action.help or ""):
            action.help = f"{action.help or ''} {REJECTION_HELP}".strip()
    return result



def before_validate_one_request(self, obj, input_ids, *args, **kwargs):
    """0.5.23 checks `token_ids_logprob` against the vocabulary but not the prompt's own
    token ids: an id outside the embedding reaches the scheduler and kills it (`IndexError`
    in the target's embedding). Refuse it here, in the tokenizer manager, with the same
    wording."""
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], int):
        vocab = int(self.model_config.vocab_size)
        for token_id in input_ids:
            if token_id < 0 or token_id >= vocab:
                raise ValueError(
                    f"input_ids contains out-of-vocabulary token id {token_id}; valid range is [0, {vocab})."
                )
    return None
