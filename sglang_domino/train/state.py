"""Checkpoints of a training run: the draft in the released format plus everything needed
to continue exactly where the run stopped (optimizer, scheduler, step, RNG states)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

import torch

TRAINER_STATE = "trainer_state.pt"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def save_checkpoint(path: Path, draft, optimizer, scheduler, step: int, generator: torch.Generator,
                    config: dict, history: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    draft.save_pretrained(tmp)
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "anchor_rng": generator.get_state(), "torch_rng": torch.get_rng_state(),
                "config": config, "history": history}, tmp / TRAINER_STATE)
    # Rename last, so a crash mid-save never leaves a checkpoint that looks complete.
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False)


def latest_checkpoint(output_dir: Path) -> Optional[Path]:
    found = [(int(m.group(1)), p) for p in output_dir.glob("checkpoint-*")
             if (m := CHECKPOINT_RE.match(p.name)) and (p / TRAINER_STATE).exists()]
    return max(found)[1] if found else None


def prune_checkpoints(output_dir: Path, keep: int) -> None:
    found = sorted((int(m.group(1)), p) for p in output_dir.glob("checkpoint-*")
                   if (m := CHECKPOINT_RE.match(p.name)))
    for _, p in found[:-keep]:
        shutil.rmtree(p)


def write_summary(output_dir: Path, summary: dict) -> None:
    with open(os.path.join(output_dir, "train_summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
