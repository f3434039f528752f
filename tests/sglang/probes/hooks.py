"""The plugin's hooks after `load_plugins()` (and `register()` twice), what they change in
argument parsing, and whether the CPU engine is on; with params["standin"], whether
`sgl_kernel` is the plugin's stand-in."""

import argparse
import os


def probe(params) -> dict:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_domino.sglang import plugin

    plugin.register()
    plugin.register()  # idempotent
    from sglang_domino.sglang.resolve import resolve_speculative

    ours = sum(1 for f in resolution_hooks._HOOKS.get("handle_speculative_decoding", ()) if f is resolve_speculative)
    worker = SpeculativeAlgorithm.DFLASH.create_worker(None) if plugin.hooks_installed()["create_worker"] else None
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--mamba-scheduler-strategy", "extra_buffer"])
    ns_default = parser.parse_args(["--model-path", "x"])
    result = dict(hooks=plugin.hooks_installed(), resolution_hooks=ours,
                  worker=None if worker is None else worker.__module__ + "." + worker.__name__,
                  mamba=getattr(ns, "mamba_radix_cache_strategy", None),
                  mamba_default=getattr(ns_default, "mamba_radix_cache_strategy", None),
                  torch_native_draft="torch_native" in DRAFT_ATTENTION_BACKEND_CHOICES,
                  cpu_engine=os.environ.get("SGLANG_USE_CPU_ENGINE"))
    if params.get("standin"):
        import sgl_kernel

        result["standin"] = bool(getattr(sgl_kernel, "__sglang_domino_standin__", False))
    return result
