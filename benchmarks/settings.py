"""Settings shared by both benchmark drivers, read from the model cards' environment variables."""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, Field

from .tasks import parse_tasks


class BenchSettings(BaseModel):
    draft_models: list[str]
    target_model: str
    tasks: list[tuple[str, int]]
    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0)
    block_size: int = Field(ge=2)
    repeats: int = Field(ge=1)
    chat_template: bool
    enable_thinking: bool
    out_dir: str

    @staticmethod
    def common(env, prefix: str) -> dict[str, Any]:
        """The shared fields from `env`; `prefix` names the default OUT_DIR (`<prefix>-<time>`)."""
        target, drafts, on_testbed = resolve_models(env)
        return dict(draft_models=drafts, target_model=target, tasks=default_tasks(env, on_testbed),
                    max_new_tokens=int(env.get("MAX_NEW_TOKENS", 2048)), temperature=float(env.get("TEMPERATURE", 0.0)),
                    block_size=int(env.get("BLOCK_SIZE", 16)), repeats=int(env.get("REPEATS", 1)),
                    chat_template=flag(env, "CHAT_TEMPLATE", True), enable_thinking=flag(env, "ENABLE_THINKING", False),
                    out_dir=env.get("OUT_DIR") or os.path.join("benchmarks", "results", time.strftime(f"{prefix}-%Y%m%d-%H%M%S")))


def resolve_models(env) -> tuple[str, list[str], bool]:
    """(target, drafts, on_testbed) from TARGET_MODEL / DRAFT_MODEL (comma-separated), or the
    CPU test bed when both are unset."""
    if bool(env.get("TARGET_MODEL")) != bool(env.get("DRAFT_MODEL")):
        raise SystemExit("DRAFT_MODEL and TARGET_MODEL: set both, or neither to use the CPU test bed")
    if env.get("TARGET_MODEL"):
        return env["TARGET_MODEL"], [d for d in env["DRAFT_MODEL"].split(",") if d], False
    from benchmarks.testbed.load import committed

    try:
        bed = committed()
    except FileNotFoundError as err:
        raise SystemExit(f"{err}; or set DRAFT_MODEL and TARGET_MODEL") from None
    return str(bed / "target"), [str(bed / "dflash"), str(bed / "domino")], True


def default_tasks(env, on_testbed: bool) -> list[tuple[str, int]]:
    """TASKS, else the model cards' default (gsm8k:128), or what the test bed can run offline."""
    return parse_tasks(env.get("TASKS") or ("heldout:16" if on_testbed else "gsm8k:128"))


def flag(env, name: str, default: bool) -> bool:
    return env.get(name, "1" if default else "0") not in ("0", "", "false", "False")
