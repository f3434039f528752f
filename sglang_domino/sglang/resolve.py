"""Argument resolution for DFLASH (main process, before any scheduler is spawned).

A resolution hook around 0.5.23's `handle_speculative_decoding` step. It gives DFLASH
this plugin's options, refuses what cannot work with a message naming the flag, and
publishes what the schedulers need as one `settings.SchedulerSettings`:
  * a verify window other than the draft block (b8, the Transformers window);
  * `--speculative-adaptive` (a verify width per decode step);
  * `--speculative-use-rejection-sampling` (the q rule, Domino drafts only);
  * the draft checked against the target;
  * environment switches of earlier releases refused, the flag that replaced them named;
  * `--device cpu` (the CPU port lifts DFLASH's device gate for the step and runs the
    synchronous scheduler loop, as 0.5.23 does for its other speculative algorithms on CPU).
"""

from __future__ import annotations

from ..config import ARCHITECTURES
from . import SOURCE, plugin_disabled
from . import settings as scheduler_settings
from .checks import draft_architectures, is_own_draft


def resolve_speculative(server_args, previous):
    from sglang.srt.arg_groups.model_override_base import resolving_view

    cfg = resolving_view(server_args)
    if plugin_disabled():
        return previous(server_args)
    from .environment import refuse_removed

    refuse_removed()
    _refuse_an_uncompiled_target(cfg)
    if not cfg.speculative_algorithm:
        _refuse_speculative_flags_without_speculation(cfg)
    _refuse_state_flags_for_an_attention_only_target(cfg)
    if str(cfg.speculative_algorithm or "").upper() != "DFLASH":
        return previous(server_args)

    hf_window = _transformers_window(cfg)
    scheduler_settings.clear()
    adaptive = _resolve_adaptive(server_args, cfg, hf_window) if cfg.speculative_adaptive else None
    draft_block = _resolve_verify_window(server_args, cfg, hf_window)
    scheduler_settings.publish(scheduler_settings.SchedulerSettings(draft_block=draft_block, adaptive=adaptive))

    if str(cfg.device).startswith("cpu"):
        from .cpu.dflash import dflash_allowed_on_cpu
        from .cpu.resolve import overlap_off_for_dflash_on_cpu

        with dflash_allowed_on_cpu():
            previous(server_args)
        overlap_off_for_dflash_on_cpu(server_args)
    else:
        previous(server_args)

    cfg = resolving_view(server_args)
    _check_rejection_sampling(cfg, _check_draft(cfg))
    if adaptive is not None and not str(cfg.device).startswith("cpu"):
        from .adaptive.verify_graphs import reserve_for_widths

        # the per-width verify graphs are captured after the KV pool is sized
        reserve_for_widths(server_args, cfg, adaptive.for_window(int(cfg.speculative_num_draft_tokens)).widths,
                           SOURCE)


resolve_speculative._sglang_domino = True


# Flags of a speculative server that 0.5.23 ignores, or crashes on, without one: the
# resolved field, its command-line spelling and the value it has when not given.
SPECULATIVE_ONLY = (
    ("enable_linear_replayssm_spec", "--enable-linear-replayssm-spec", False),
    ("speculative_adaptive", "--speculative-adaptive", False),
    ("speculative_adaptive_config", "--speculative-adaptive-config", None),
    ("speculative_use_rejection_sampling", "--speculative-use-rejection-sampling", False),
    ("speculative_draft_model_path", "--speculative-draft-model-path", None),
    ("speculative_dflash_block_size", "--speculative-dflash-block-size", None),
    ("speculative_num_draft_tokens", "--speculative-num-draft-tokens", None),
)


def _refuse_speculative_flags_without_speculation(cfg) -> None:
    """A server without `--speculative-algorithm` given a flag that only means something
    with one: refused at start-up, naming the flag (0.5.23 ignores most of them, and dies
    in its pool configurator on `--enable-linear-replayssm-spec`: `TypeError: unsupported
    operand type(s) for //: 'NoneType' and 'int'`)."""
    given = [flag for field, flag, unset in SPECULATIVE_ONLY if getattr(cfg, field, unset) not in (unset, None)]
    if given:
        raise ValueError(
            f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a speculative server: add "
            "--speculative-algorithm DFLASH --speculative-draft-model-path <draft> (sglang-domino), or drop "
            f"{'it' if len(given) == 1 else 'them'}")


# Targets whose every layer is attention: no recurrent (mamba / linear-attention) state.
ATTENTION_ONLY = frozenset({"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"})


def _refuse_state_flags_for_an_attention_only_target(cfg) -> None:
    """The recurrent-state flags on a target without recurrent state: refused, naming the
    flag (0.5.23 ignores them). Only architectures known to be attention-only are checked."""
    from .checks import read_target_config

    strategy = str(getattr(cfg, "mamba_radix_cache_strategy", None) or "auto")
    given = [f"--mamba-scheduler-strategy / --mamba-radix-cache-strategy {strategy}"] if strategy != "auto" else []
    if getattr(cfg, "enable_linear_replayssm_spec", False):
        given.append("--enable-linear-replayssm-spec")
    if not given:
        return
    target = read_target_config(cfg.model_path, getattr(cfg, "revision", None)) or {}
    architectures = set(target.get("architectures") or ())
    if architectures and architectures <= ATTENTION_ONLY:
        raise ValueError(
            f"{' and '.join(given)}: {cfg.model_path} ({', '.join(sorted(architectures))}) has no recurrent "
            "(mamba / linear-attention) layers, so there is no state to cache or roll back: drop "
            f"{'it' if len(given) == 1 else 'them'} (they apply to hybrid targets such as Qwen3.5 / Qwen3.6)")


def _refuse_an_uncompiled_target(cfg) -> None:
    from .checks import read_target_config
    from .cpu.resolve import refuse_an_uncompiled_target
    from .cpu.compiled.switches import compiled_step

    if compiled_step(cfg):
        target = read_target_config(cfg.model_path, getattr(cfg, "revision", None)) or {}
        refuse_an_uncompiled_target(cfg, target.get("architectures") or ())


def _transformers_window(cfg) -> bool:
    """Whether `--speculative-num-draft-tokens` asks for the Transformers backend's window:
    the draft block + 1 (B proposals from a B-slot `shift_label` Domino block, B + 1
    verified). The block is `--speculative-dflash-block-size`, else the draft's own."""
    num = cfg.speculative_num_draft_tokens
    if num is None:
        return False
    block = cfg.speculative_dflash_block_size
    if block is None:
        from .checks import read_draft_config

        draft = read_draft_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
        block = draft.block_size if draft is not None else None
    return block is not None and int(num) == int(block) + 1


def _resolve_verify_window(server_args, cfg, hf_window: bool):
    """The draft block when it differs from the verify window, else None.

    The scheduler accounts in verify windows (`speculative_num_draft_tokens`: the verify
    batch, the target's CUDA-graph capture, the result stride, the accept-rate metrics),
    so both of 0.5.23's fields are declared as the window, which is what
    `speculative_dflash_block_size` means upstream ("verify window length"); upstream
    itself demands the two be equal. The draft block reaches the worker through the
    scheduler settings, and the worker runs the draft on it."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    from .checks import check_verify_width

    block, num_draft_tokens = cfg.speculative_dflash_block_size, cfg.speculative_num_draft_tokens
    if hf_window:
        # the Transformers backend's window for shift_label Domino drafts: B proposals
        # from the B-slot draft block, B + 1 verified
        draft_block = _hf_window_draft_block(cfg, block, num_draft_tokens)
        window = draft_block + 1
    elif block is not None and num_draft_tokens is not None and int(num_draft_tokens) != int(block):
        check_verify_width(int(block), int(num_draft_tokens))
        draft_block, window = int(block), int(num_draft_tokens)
    else:
        return None
    if cfg.speculative_draft_window_size is not None:
        raise ValueError(
            f"--speculative-draft-window-size {cfg.speculative_draft_window_size} (compact draft cache) "
            f"cannot be combined with a verify window of {window} tokens and a draft block of "
            f"{draft_block}: sglang-domino supports the draft block differing from the verify window "
            "only with the full draft cache; drop --speculative-draft-window-size")
    declare_resolution(server_args, SOURCE, speculative_dflash_block_size=window, speculative_num_draft_tokens=window)
    return draft_block


def _resolve_adaptive(server_args, cfg, hf_window: bool):
    """`--speculative-adaptive` with DFLASH: a verify width chosen per decode step
    (`sglang_domino.sglang.adaptive`). 0.5.23 supports the flag for EAGLE only and turns it
    off for DFLASH with a warning; here it is declared off for upstream (whose EAGLE
    machinery would read `--speculative-adaptive-config` as EAGLE's) and the validated
    settings go to the schedulers."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    from .adaptive import AdaptiveWidthConfig

    if hf_window:
        raise ValueError("--speculative-adaptive cannot be combined with a verify window of draft block + 1 "
                         f"(--speculative-num-draft-tokens {cfg.speculative_num_draft_tokens}): drop one of them")
    if cfg.speculative_draft_window_size is not None:
        raise ValueError(
            f"--speculative-adaptive with DFLASH needs the full draft cache: drop "
            f"--speculative-draft-window-size {cfg.speculative_draft_window_size}")
    _check_adaptive_draft(draft_architectures(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision))
    dp_attention = cfg.enable_dp_attention or int(getattr(cfg, "attn_dp_size", 1) or 1) > 1
    if dp_attention or int(cfg.pp_size or 1) > 1:
        # the chosen width is broadcast over the TP group's gloo group by rank 0: an idle
        # DP-attention rank never joins (the next collective pairs with the wrong op), and
        # each pipeline stage's rank 0 would choose on its own
        used = "DP attention (--attn-dp-size / --enable-dp-attention)" if dp_attention else f"--pp-size {cfg.pp_size}"
        raise ValueError(
            f"--speculative-adaptive with DFLASH cannot be combined with {used}: every rank must verify at "
            "the width the first TP rank chooses, which sglang-domino broadcasts over the TP group only. "
            "Drop --speculative-adaptive (a fixed width: --speculative-num-draft-tokens) or " + used.split(" (")[0])
    settings = AdaptiveWidthConfig.load(cfg.speculative_adaptive_config)
    declare_resolution(server_args, SOURCE, speculative_adaptive=False)
    return settings


def _check_adaptive_draft(architectures) -> None:
    """The adaptive width cuts a DFlash or Domino draft's proposals to the step's width
    and drafts nothing at width 1; the other members of 0.5.23's DFLASH family (candidate
    selectors, LiLiCorr heads) read the whole block per request, so they are refused (the
    worker refuses them too where the draft's config cannot be read here)."""
    if architectures is not None and not is_own_draft(architectures):
        raise ValueError(
            f"--speculative-adaptive with DFLASH serves DFlash and Domino drafts ({', '.join(sorted(ARCHITECTURES))}); "
            f"this draft's architectures are {architectures}: drop --speculative-adaptive")


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
    _check_q_rule_tp_sync(int(cfg.tp_size))


def _check_q_rule_tp_sync(tp_size: int) -> None:
    """Under tensor parallelism every rank must verify and commit rank 0's sampled
    proposals and acceptance: 0.5.23 broadcasts them only at the `SGLANG_SPEC_TP_SYNC`
    sites that are on (`spec_tp_sync.py:135-138`); with either off, ranks would verify
    different tokens."""
    if tp_size <= 1:
        return
    from sglang.srt.environ import envs
    from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite, parse_spec_tp_sync

    raw = envs.SGLANG_SPEC_TP_SYNC.get()
    sites = parse_spec_tp_sync(raw)
    missing = [site.slug for site in (SpecTpSyncSite.DFLASH_SELECTOR, SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE)
               if site not in sites]
    if missing:
        raise ValueError(
            f"--speculative-use-rejection-sampling at --tp-size {tp_size} broadcasts rank 0's sampled proposals "
            f"and acceptance to every rank: SGLANG_SPEC_TP_SYNC must include {' and '.join(missing)} "
            f"(got {raw!r}; the default 'all' does)")


def _hf_window_draft_block(cfg, block, num_draft_tokens) -> int:
    from .checks import read_draft_config

    draft = read_draft_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
    if draft is None or not draft.is_domino or not draft.shift_label:
        raise ValueError(
            f"--speculative-num-draft-tokens {num_draft_tokens} (the draft block + 1: the Transformers window) "
            "needs a Domino draft with dflash_config.shift_label=true (B proposals from a B-slot block, B + 1 "
            "verified); at most the draft block otherwise")
    return int(block) if block is not None else int(draft.block_size)


def _check_draft(cfg):
    """Refuse a draft that cannot run on the target before any process is spawned;
    returns its `DraftConfig` (None when it cannot be read here)."""
    from .checks import check_draft_against_target, read_draft_config, read_target_config

    draft = read_draft_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
    target = read_target_config(cfg.model_path, getattr(cfg, "revision", None))
    if draft is not None and target is not None:
        check_draft_against_target(draft, target)
    return draft
