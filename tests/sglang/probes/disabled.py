"""With SGLANG_DOMINO_DISABLE=1: the hooks `load_plugins()` left installed (none), and
whether the CPU engine is on (the CPU switch is not the worker: it stays on)."""

import os


def probe(params) -> dict:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2  # noqa: F401  (upstream's worker imports)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: F401

    from sglang_domino.sglang import plugin

    return dict(hooks=plugin.hooks_installed(), cpu_engine=os.environ.get("SGLANG_USE_CPU_ENGINE"))
