"""Scheduler start: the groups of `hooks.py` that must be in place before a scheduler
builds its model and memory pools, chosen from that server's settings.

Installed from a BEFORE hook on 0.5.23's `bootstrap.init_parallel_runtime`, which every
`Scheduler.__init__` calls before it builds the target worker (and with it the KV and
recurrent-state pools); `DominoDFlashWorker.__init__` comes after that, too late for them.
"""

from __future__ import annotations

from . import hooks
from . import settings as scheduler_settings


def before_init_parallel_runtime(*args, server_args=None, **kwargs):
    if server_args is None:
        return
    # every server: /server_info reports the max_running_requests the scheduler admits
    hooks.install(hooks.RUNNING_REQUESTS)
    if str(server_args.disaggregation_mode) in ("prefill", "decode"):
        from .cpu.platform import cpu_engine_on

        hooks.install(hooks.DISAGGREGATION)
        if cpu_engine_on():
            hooks.install(hooks.CPU_DISAGGREGATION)
    window = server_args.speculative_num_draft_tokens
    draft_block = scheduler_settings.current().draft_block
    if draft_block and window and int(draft_block) > int(window):
        hooks.install(hooks.B8_STATE)
    # DFLASH with --enable-linear-replayssm-spec: replay rollback on a gated delta-net target
    from . import hybrid_replay

    hybrid_replay.install_for(server_args)
