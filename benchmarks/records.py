"""Raw benchmark records: one JSON line per request. Every summary number is computed
from these alone (`benchmarks/report.py`), so a table can always be re-derived."""

from __future__ import annotations

import json
from typing import Iterable, Optional

from pydantic import BaseModel, Field

TARGET_ONLY = "target-only"

# Fields added with the load harness (`benchmarks/load.py`): written only where set, so a
# run that does not use them writes the same lines as before, and older lines still read.
OPTIONAL_FIELDS = ("in_flight", "scheduled_s", "arrival_rate", "server_latency_s", "error")


class Record(BaseModel):
    backend: str                     # "hf", "sglang" or "vllm"
    method: str                      # "target-only" or the draft's name
    task: str
    concurrency: int = Field(ge=1)   # steady load: the requests kept in flight; open loop: the most reached
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
    # served runs (`benchmarks/load.py`)
    in_flight: Optional[int] = None          # requests in flight when this one was sent, itself included
    scheduled_s: Optional[float] = None      # open loop: when it was due to arrive (start_s's clock)
    arrival_rate: Optional[float] = None     # open loop: the requests per second offered
    server_latency_s: Optional[float] = None  # the server's own end-to-end time (SGLang's meta_info)
    error: Optional[str] = None              # a failed request: what went wrong (its tokens are 0)
    # The reply itself, for exactness checks in memory; never written (the lines are timings,
    # and the scripts that keep outputs write them into their own JSON).
    output_ids: Optional[list[int]] = Field(None, exclude=True)
    text: Optional[str] = Field(None, exclude=True)

    @property
    def accept_length(self) -> Optional[float]:
        """Tokens per verify step where the server reported its steps (None otherwise)."""
        return self.accepted_tokens / self.verify_steps if self.verify_steps else None


def write(path: str, records: Iterable[Record], append: bool = True) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for rec in records:
            unset = {name for name in OPTIONAL_FIELDS if getattr(rec, name) is None}
            fh.write(rec.model_dump_json(exclude=unset) + "\n")


def read(path: str) -> list[Record]:
    with open(path, encoding="utf-8") as fh:
        return [Record.model_validate(json.loads(line)) for line in fh if line.strip()]
