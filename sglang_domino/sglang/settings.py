"""The plugin's settings for the scheduler processes, in one typed channel.

Argument resolution runs in the main process (`sglang serve`); the worker runs in each
spawned scheduler. `ServerArgs` carries only its own fields, and 0.5.23 has one field
for the draft block and the verify window (`speculative_num_draft_tokens`), so what the
plugin resolved travels as one validated JSON document in `SETTINGS_ENV`: written once
by `resolve.py`, read by the worker and the draft-token sizing hook. Spawned processes
inherit the environment, which is why an environment variable and not a file.

It is the private row of `environment.TABLE`: never set by hand.
"""

from __future__ import annotations

import os
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from .adaptive import AdaptiveWidthConfig
from .environment import SCHEDULER_SETTINGS

SETTINGS_ENV = SCHEDULER_SETTINGS.name


class SchedulerSettings(BaseModel):
    """What argument resolution decided for DFLASH, as the schedulers need it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The draft block when it differs from the verify window: b8 (block 16, window 8) or
    # the Transformers window (block 16, window 17). None: the block is the window.
    draft_block: Optional[int] = Field(default=None, ge=1)
    # `--speculative-adaptive` with DFLASH: the validated policy settings.
    adaptive: Optional[AdaptiveWidthConfig] = None


def publish(settings: SchedulerSettings) -> None:
    """Argument resolution (main process): hand `settings` to every process spawned later."""
    if settings == SchedulerSettings():
        os.environ.pop(SETTINGS_ENV, None)
    else:
        os.environ[SETTINGS_ENV] = settings.model_dump_json()


def clear() -> None:
    os.environ.pop(SETTINGS_ENV, None)


def current() -> SchedulerSettings:
    """What resolution published for this server; the defaults when nothing was."""
    raw = os.environ.get(SETTINGS_ENV)
    return SchedulerSettings.model_validate_json(raw) if raw else SchedulerSettings()


__all__ = ["SETTINGS_ENV", "SchedulerSettings", "clear", "current", "publish"]
