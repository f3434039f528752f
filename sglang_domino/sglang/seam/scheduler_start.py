"""Scheduler start: the groups of `hooks.py` that must be in place before a scheduler
builds its model and memory pools, chosen from that server's settings.

Installed from a BEFORE hook on 0.5.23's `bootstrap.init_parallel_runtime`, which every
`Scheduler.__init__` calls before it builds the target worker (and with it the KV and
recurrent-state pools); `DominoDFlashWorker.__init__` comes after that, too late for them.
"""

from __future__ import annotations

from . import hooks
from .. import settings as scheduler_settings


def before_init_parallel_runtime(*args, server_args=None, **kwargs):
    """The manifest's scheduler-start groups for schedulers whose predicate holds of the
    server's arguments (`hooks.install_moment`)."""
    hooks.install_moment(hooks.Moment.SCHEDULER_START, server_args, processes="schedulers")


def before_init_parallel_runtime_on_cpu(*args, server_args=None, **kwargs):
    """Every model-running CPU process at scheduler start (registered with the CPU engine):
    the manifest's groups for these processes whose predicate holds (the stand-in's
    replacements, the batched torch_native attention, the compiled step)."""
    hooks.install_moment(hooks.Moment.SCHEDULER_START, server_args, processes="model-running processes")


# -- the predicates of this moment's groups (`manifest.py`) ---------------------------------
def a_server(server_args) -> bool:
    """Every server: /server_info reports the max_running_requests the scheduler admits."""
    return server_args is not None


def disaggregated(server_args) -> bool:
    return server_args is not None and str(server_args.disaggregation_mode) in ("prefill", "decode")


def disaggregated_on_cpu(server_args) -> bool:
    from ..cpu.platform import cpu_engine_on

    return disaggregated(server_args) and cpu_engine_on()


def draft_block_wider(server_args) -> bool:
    """DFLASH with a draft block wider than the verify window (b8)."""
    if server_args is None:
        return False
    window = server_args.speculative_num_draft_tokens
    draft_block = scheduler_settings.current().draft_block
    return bool(draft_block and window and int(draft_block) > int(window))
