"""CPU-only argument rules (resolution hooks), for any speculative algorithm or none."""

from __future__ import annotations


def resolve_mamba_on_cpu(server_args, previous):
    """The Qwen3.6-27B card's `--mamba-scheduler-strategy extra_buffer` keeps state snapshots
    for the radix cache; 0.5.23's CPU platform has none (`mamba_hook.validate_mamba_extra_buffer`
    asserts `_platform_supports_mamba_cache_extra_buffer()`, True only for GPU/NPU/XPU platforms),
    and its CPU prefill kernel returns no per-chunk states to snapshot. Refused here with the
    settings that do serve on CPU; the speculative per-position state buffers DFLASH's
    verify uses are allocated whatever the strategy (`memory_pool.MambaPool.__init__`)."""
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


def overlap_off_for_dflash_on_cpu(server_args) -> None:
    """`--device cpu` with DFLASH: the synchronous scheduler loop, as 0.5.23 already declares
    for its EAGLE family and n-gram on CPU (`speculative_hook._disable_overlap_schedule_for_cpu`,
    called from their branches but not from `_handle_dflash`; it logs upstream's warning).

    The overlap loop launches step N + 1 before it processes step N's results; a CPU
    forward runs on the scheduler's own thread, so nothing overlaps. With `--sleep-on-idle`
    the synchronous loop served a Domino server 1.12x (c1) and 1.14x (c8) on the test bed;
    without it the two loops measured the same (docs/cpu.md, "DFLASH on CPU")."""
    from sglang.srt.arg_groups.speculative_hook import _disable_overlap_schedule_for_cpu

    _disable_overlap_schedule_for_cpu(server_args)


# the target architectures the compiled CPU step compiles (`compiled_forward.refusal` checks
# the loaded model again)
COMPILED_TARGETS = frozenset({"Qwen3ForCausalLM", "Qwen3_5ForCausalLM"})


def refuse_an_uncompiled_target(cfg, architectures) -> None:
    """`--enable-torch-compile` with `--device cpu` for a target whose layers the compiled
    CPU step does not compile (the MoE and multimodal Qwen3.5 among them): refused at
    start-up with the reason, rather than served eagerly in silence or failing in a
    scheduler after the weights load. Unknown architectures are left to the load-time check.
    Called only for a server that asks for the compiled step."""
    from .compiled.switches import FLAG

    if not architectures or set(architectures) <= COMPILED_TARGETS:
        return
    raise ValueError(
        f"{FLAG} with --device cpu compiles {', '.join(sorted(COMPILED_TARGETS))} targets; {cfg.model_path} is "
        f"{', '.join(sorted(architectures))}, whose layers are not compiled on CPU: serve it without {FLAG}")
