"""Raw benchmark records: one JSON line per request. Every summary number is computed
from these alone (`benchmarks/report.py`), so a table can always be re-derived."""

from __future__ import annotations

import json
from typing import Iterable, Optional

from pydantic import BaseModel, Field

TARGET_ONLY = "target-only"


class Record(BaseModel):
    backend: str                     # "hf" or "sglang"
    method: str                      # "target-only" or the draft's name
    task: str
    concurrency: int = Field(ge=1)
    repeat: int = Field(ge=0)
    prompt_index: int = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    verify_steps: int = Field(ge=0)  # target verification steps (0 for target-only)
    accepted_tokens: int = Field(ge=0)  # tokens committed by those steps, bonus included
    accept_lengths: Optional[list[int]] = None  # per step, where the backend reports them
    start_s: float                   # request start, seconds since the run's clock origin
    end_s: float
    latency_s: float
    tok_per_s: float                 # this request's completion tokens / latency
    # greedy runs of the HF benchmark: the completion against target-only decoding's on the
    # same prompt (None: not checked, e.g. sampled, or the reference run itself)
    equal_output: Optional[bool] = None
    first_difference: Optional[int] = None   # index of the first completion token that differs


def write(path: str, records: Iterable[Record], append: bool = True) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(rec.model_dump_json() + "\n")


def read(path: str) -> list[Record]:
    with open(path, encoding="utf-8") as fh:
        return [Record.model_validate(json.loads(line)) for line in fh if line.strip()]
