"""`sglang.srt.plugins` entry point: `register()`.

SGLang calls it in every process (`sglang serve` before argument parsing,
`cli/serve.py:205`; every scheduler before the scheduler object is built,
`managers/scheduler.py:6323`; detokenizer, DP controller), and only *logs* a plugin
that raises (`srt/plugins/__init__.py:83`, `:135`), so `hooks_installed()` lets tests
assert that the hooks are really in place.

Cheap to import and to run: nothing heavy at import time; `register()` imports only
light sglang modules (plugin registry, resolution hooks, the CLI choices list); the
worker module (which imports `dflash_worker_v2`) is imported lazily by the hook the
first time a DFLASH worker is created.

What it registers (all idempotent, `SGLANG_DOMINO_DISABLE=1` registers nothing):
  * AROUND `SpeculativeAlgorithm.create_worker` (`srt/speculative/spec_info.py:311`):
    DFLASH -> `DominoDFlashWorker`; every other algorithm -> upstream.
  * AROUND `SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens`
    (`spec_info.py:268`): buffers sized for a draft block wider than the verify window.
  * resolution wrapper of `handle_speculative_decoding`
    (`srt/arg_groups/speculative_hook.py:121`): verify window other than the draft block,
    DFLASH's device gate lifted for `--device cpu`, draft checked against the target.
  * AFTER `ServerArgs.add_cli_args` (`srt/server_args.py:351`): the model cards'
    `--mamba-scheduler-strategy` as an alias of `--mamba-radix-cache-strategy`.
  * BEFORE `TokenizerManager._validate_one_request` (`managers/tokenizer_manager.py:1307`):
    prompt token ids outside the vocabulary are refused (0.5.23 lets them crash the
    scheduler).
  * with the CPU engine on: `torch_native` appended to
    `DRAFT_ATTENTION_BACKEND_CHOICES` (`srt/arg_groups/choices.py:103`); the thread
    binding and process-group hooks of `cpu_parallel` (`--tp-size N` on CPU); the
    hybrid-target replacements of `cpu_hybrid`, applied when a scheduler starts.
"""

from __future__ import annotations

import argparse
import logging
import os

from . import ADAPTIVE_ENV, DRAFT_BLOCK_ENV, HF_WINDOW_ENV, plugin_disabled

logger = logging.getLogger(__name__)

CREATE_WORKER_TARGET = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
MAX_DRAFT_TOKENS_TARGET = (
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens")
ADD_CLI_ARGS_TARGET = "sglang.srt.server_args.ServerArgs.add_cli_args"
VALIDATE_REQUEST_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
RESOLUTION_STEP = "handle_speculative_decoding"
MODEL_STEP = "handle_model_specific_adjustments"
OLD_MAMBA_FLAG = "--mamba-scheduler-strategy"
SOURCE = "sglang_domino"
REJECTION_HELP = (
    "With DFLASH and a Domino draft (sglang-domino): sampled requests draw each proposal from the "
    "draft's own distribution q and accept it with min(1, p/q). Refused for plain DFlash drafts, "
    "whose sampled requests are always verified as point masses (their independent positions "
    "sampled from q accept less).")

_registered = False


def _cpu_engine() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


# -- hooks ----------------------------------------------------------------------------
def _around_create_worker(original, algo, server_args):
    if algo.is_dflash() and not plugin_disabled():
        from .worker import DominoDFlashWorker  # heavy: lazily, in the scheduler only

        return DominoDFlashWorker
    return original(algo, server_args)


_around_create_worker._sglang_domino = True


def _around_resolve_max_draft_tokens(original, algo, server_args):
    """`max_speculative_num_draft_tokens` (`arg_groups/overrides.py:1928`, published in
    every process's spec bag, `runtime_context.py:1051-1058`) sizes the per-request token
    capacity of the runners' buffers (`eager_runner.py:91`, logits rows
    `model_runner.py:910`, KV pool and `req_to_token` headroom
    `allocation_sizing.py:96-118`). The draft block can be wider than the verify window
    (b8): the draft forward needs room for the block."""
    result = original(algo, server_args)
    draft_block = os.environ.get(DRAFT_BLOCK_ENV)
    if algo.is_dflash() and draft_block and result is not None and not plugin_disabled():
        return max(int(result), int(draft_block))
    return result


_around_resolve_max_draft_tokens._sglang_domino = True


def _after_add_cli_args(result, *args, **kwargs):
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


_after_add_cli_args._sglang_domino = True


def _before_validate_one_request(self, obj, input_ids, *args, **kwargs):
    """0.5.23 checks `token_ids_logprob` against the vocabulary
    (`tokenizer_manager.py:1513-1531`) but not the prompt's own token ids: an id outside
    the embedding reaches the scheduler and kills it (`IndexError` in the target's
    embedding). Refuse it here, in the tokenizer manager, with the same wording."""
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], int):
        vocab = int(self.model_config.vocab_size)
        for token_id in input_ids:
            if token_id < 0 or token_id >= vocab:
                raise ValueError(
                    f"input_ids contains out-of-vocabulary token id {token_id}; valid range is [0, {vocab})."
                )
    return None


_before_validate_one_request._sglang_domino = True


class _CpuDFlashPlatform:
    """Stands in for `speculative_hook.current_platform` while DFLASH's arguments are
    resolved for `--device cpu` only: `_handle_dflash` refuses any device but CUDA/NPU/
    XPU unless an out-of-tree platform says yes (`speculative_hook.py:290-301`), and the
    draft backend fallback asks the same platform (`:897-927`). Everything else is
    delegated to the real platform."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def is_out_of_tree(self) -> bool:
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return algorithm == "DFLASH" and backend == "torch_native"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"


def _resolve_speculative(server_args, previous):
    from sglang.srt.arg_groups.model_override_base import resolving_view

    cfg = resolving_view(server_args)
    algo = str(cfg.speculative_algorithm or "").upper()
    if plugin_disabled() or algo != "DFLASH":
        return previous(server_args)

    from sglang.srt.arg_groups.overrides import declare_resolution

    from .checks import check_verify_width

    # Verify width below the draft block (b8) and the Transformers window: the scheduler
    # accounts in verify windows (speculative_num_draft_tokens = window: verify batch,
    # CUDA-graph capture of the target, result stride, accept-rate metrics); the draft
    # block travels to the schedulers in DRAFT_BLOCK_ENV, where the worker runs the
    # draft on it. 0.5.23 demands block == num_draft_tokens (`speculative_hook.py:368-387`):
    # `speculative_dflash_block_size` is declared as the window, which is what that field
    # means in 0.5.23 ("Block size (verify window length)", `fields/spec.py:70`).
    block = cfg.speculative_dflash_block_size
    ndt = cfg.speculative_num_draft_tokens
    hf_window = os.environ.get(HF_WINDOW_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    os.environ.pop(DRAFT_BLOCK_ENV, None)
    os.environ.pop(ADAPTIVE_ENV, None)
    if cfg.speculative_adaptive:
        _resolve_adaptive(server_args, cfg, hf_window)
    draft_block = window = None
    if hf_window:
        # Transformers-backend window for shift_label Domino drafts: B proposals from the
        # B-slot draft block, B + 1 verified.
        draft_block = _hf_window_draft_block(cfg, block, ndt)
        window = draft_block + 1
    elif block is not None and ndt is not None and int(ndt) != int(block):
        check_verify_width(int(block), int(ndt))
        draft_block, window = int(block), int(ndt)
    if draft_block is not None:
        if cfg.speculative_draft_window_size is not None:
            raise ValueError(
                f"--speculative-draft-window-size {cfg.speculative_draft_window_size} (compact draft cache) "
                f"cannot be combined with a verify window of {window} tokens and a draft block of "
                f"{draft_block}: sglang-domino supports the draft block differing from the verify window "
                "only with the full draft cache; drop --speculative-draft-window-size")
        declare_resolution(server_args, SOURCE, speculative_dflash_block_size=window,
                           speculative_num_draft_tokens=window)
        os.environ[DRAFT_BLOCK_ENV] = str(draft_block)

    if str(cfg.device).startswith("cpu"):
        import sglang.srt.arg_groups.speculative_hook as spec_hook

        real = spec_hook.current_platform
        spec_hook.current_platform = _CpuDFlashPlatform(real)
        try:
            previous(server_args)
        finally:
            spec_hook.current_platform = real
    else:
        previous(server_args)

    cfg = resolving_view(server_args)
    _check_rejection_sampling(cfg, _check_draft(cfg))


def _resolve_adaptive(server_args, cfg, hf_window: bool) -> None:
    """`--speculative-adaptive` with DFLASH: a verify width chosen per decode step
    (`sglang_domino.verify_width`). 0.5.23 supports the flag for EAGLE only and turns it off
    for DFLASH with a warning (`adaptive_spec_params.py:56-64`, `speculative_hook.py:1373-1390`);
    here it is declared off for upstream (whose EAGLE machinery would read
    `--speculative-adaptive-config` as EAGLE's, `model_runner.py:907-917`) and the validated
    settings travel to the schedulers in ADAPTIVE_ENV."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    from ..verify_width import AdaptiveWidthConfig

    if hf_window:
        raise ValueError(f"--speculative-adaptive cannot be combined with {HF_WINDOW_ENV}=1 (a fixed window of "
                         "draft block + 1); unset one of them")
    if cfg.speculative_draft_window_size is not None:
        raise ValueError(
            f"--speculative-adaptive with DFLASH needs the full draft cache: drop "
            f"--speculative-draft-window-size {cfg.speculative_draft_window_size}")
    settings = AdaptiveWidthConfig.load(cfg.speculative_adaptive_config)
    declare_resolution(server_args, SOURCE, speculative_adaptive=False)
    os.environ[ADAPTIVE_ENV] = settings.model_dump_json()


def _check_rejection_sampling(cfg, draft) -> None:
    """0.5.23 reads `--speculative-use-rejection-sampling` for EAGLE only; for DFLASH this
    plugin gives it a meaning, the q rule, and only for Domino drafts (whose rollout
    defines q). A DFlash draft's positions are independent, and sampling them from their
    marginals lowers acceptance, so its sampled requests keep the point-mass rule: refuse
    the flag rather than ignore it."""
    if not cfg.speculative_use_rejection_sampling:
        return
    if draft is not None and not draft.is_domino:
        raise ValueError(
            "--speculative-use-rejection-sampling with DFLASH needs a Domino draft "
            "(dflash_config.projector_type = \"domino\"); this draft is a plain DFlash draft, whose "
            "sampled requests are verified with the point-mass rule: drop the flag")
    single, acc = cfg.speculative_accept_threshold_single, cfg.speculative_accept_threshold_acc
    if single != 1.0 or acc != 1.0:
        raise ValueError(
            "--speculative-use-rejection-sampling accepts with min(1, p/q) and ignores accept thresholds: "
            f"--speculative-accept-threshold-single must be 1.0 (got {single}) and "
            f"--speculative-accept-threshold-acc 1.0 (got {acc})")


def _hf_window_draft_block(cfg, block, ndt) -> int:
    from .checks import read_draft_config

    draft = read_draft_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
    if draft is None or not draft.is_domino or not draft.shift_label:
        raise ValueError(
            f"{HF_WINDOW_ENV}=1 needs a Domino draft with dflash_config.shift_label=true "
            "(B proposals from a B-slot block, B + 1 verified)")
    draft_block = int(block) if block is not None else int(draft.block_size)
    if ndt is not None and int(ndt) not in (draft_block, draft_block + 1):
        raise ValueError(
            f"{HF_WINDOW_ENV}=1 verifies draft block + 1 = {draft_block + 1} tokens; "
            f"--speculative-num-draft-tokens {ndt} contradicts it")
    return draft_block


def _check_draft(cfg):
    """Refuse a draft that cannot run on the target before any process is spawned;
    returns its `DraftConfig` (None when it cannot be read here)."""
    from .checks import check_draft_against_target, read_draft_config, read_target_config

    draft = read_draft_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
    target = read_target_config(cfg.model_path, getattr(cfg, "revision", None))
    if draft is not None and target is not None:
        check_draft_against_target(draft, target)
    return draft


_resolve_speculative._sglang_domino = True


def _resolve_mamba_on_cpu(server_args, previous):
    """The Qwen3.6-27B card's `--mamba-scheduler-strategy extra_buffer` keeps state snapshots
    for the radix cache; 0.5.23's CPU platform has none (`mamba_hook.py:102-122` asserts
    `_platform_supports_mamba_cache_extra_buffer()`, True only for GPU/NPU/XPU platforms),
    and its CPU prefill kernel returns no per-chunk states to snapshot. Refused here with the
    settings that do serve on CPU; the speculative per-position state buffers DFLASH's
    verify uses are allocated whatever the strategy (`memory_pool.py:864-970`)."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    cfg = resolving_view(server_args)
    strategy = str(getattr(cfg, "mamba_radix_cache_strategy", "") or "")
    if (str(cfg.device).startswith("cpu") and strategy.startswith("extra_buffer")
            and not cfg.disable_radix_cache):
        raise ValueError(
            f"--mamba-scheduler-strategy {strategy} is not available with --device cpu: SGLang 0.5.23's CPU "
            "platform cannot snapshot mamba (linear-attention) state for the radix cache. Serve with "
            "--mamba-scheduler-strategy no_buffer --disable-overlap-schedule (prefix caching without state "
            "snapshots), or --disable-radix-cache.")
    return previous(server_args)


_resolve_mamba_on_cpu._sglang_domino = True


# -- registration ---------------------------------------------------------------------
def register() -> None:
    """Entry point. Idempotent per process."""
    global _registered
    if _registered or plugin_disabled():
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(CREATE_WORKER_TARGET, _around_create_worker, HookType.AROUND)
    HookRegistry.register(MAX_DRAFT_TOKENS_TARGET, _around_resolve_max_draft_tokens, HookType.AROUND)
    HookRegistry.register(ADD_CLI_ARGS_TARGET, _after_add_cli_args, HookType.AFTER)
    HookRegistry.register(VALIDATE_REQUEST_TARGET, _before_validate_one_request, HookType.BEFORE)
    register_resolution_hook(RESOLUTION_STEP)(_resolve_speculative)
    register_resolution_hook(MODEL_STEP)(_resolve_mamba_on_cpu)
    if _cpu_engine():
        from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES, add_draft_attention_backend_choices

        from . import apply_hooks_once, cpu_hybrid, cpu_parallel

        apply_hooks_once("cpu tensor parallel", cpu_parallel.HOOKS)
        apply_hooks_once("cpu hybrid runtime", cpu_hybrid.HOOKS)

        if "torch_native" not in DRAFT_ATTENTION_BACKEND_CHOICES:
            add_draft_attention_backend_choices(["torch_native"])
    _registered = True


def hooks_installed() -> dict[str, bool]:
    """Which of this plugin's hooks are live in this process (after `load_plugins()`)."""
    import pkgutil

    from sglang.srt.arg_groups import resolution_hooks

    def wraps_ours(target: str) -> bool:
        fn = pkgutil.resolve_name(target)
        fn = getattr(fn, "__func__", fn)
        seen = set()
        while fn is not None and id(fn) not in seen:
            seen.add(id(fn))
            if getattr(fn, "_sglang_domino", False):
                return True
            closure = getattr(fn, "__closure__", None) or ()
            if any(getattr(c.cell_contents, "_sglang_domino", False) for c in closure
                   if _cell_ok(c)):
                return True
            fn = getattr(fn, "__wrapped__", None)
        return False

    return {
        "create_worker": wraps_ours(CREATE_WORKER_TARGET),
        "max_draft_tokens": wraps_ours(MAX_DRAFT_TOKENS_TARGET),
        "add_cli_args": wraps_ours(ADD_CLI_ARGS_TARGET),
        "validate_request": wraps_ours(VALIDATE_REQUEST_TARGET),
        "resolution": any(getattr(f, "_sglang_domino", False)
                          for f in resolution_hooks._HOOKS.get(RESOLUTION_STEP, ())),
    }


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False
