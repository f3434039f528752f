"""Evaluation prompts of a test bed: its held-out requests (written by the build), as
token ids of the rendered chat prompt."""

from __future__ import annotations

import json
from pathlib import Path


def heldout_rows(build: Path, limit: int = 0) -> list[dict]:
    with open(Path(build) / "heldout_prompts.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows[:limit] if limit else rows


def heldout_prompts(build: Path, limit: int = 0) -> list[list[int]]:
    return [row["prompt_ids"] for row in heldout_rows(build, limit)]
