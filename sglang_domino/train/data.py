"""Training examples as (input_ids, loss_mask) and their batches.

The loss mask marks the tokens the draft is trained to predict: responses only when a
record has a prompt, every token for plain text. Batch order is a pure function of
(seed, epoch, step), so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]


def load_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _messages(record: dict) -> list[dict]:
    out = []
    for m in record["conversations"]:
        role = m.get("role") or {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("from"))
        out.append({"role": role, "content": m.get("content", m.get("value", ""))})
    return out


def _chat_example(tokenizer, messages: list[dict]) -> Example:
    """Loss on assistant turns: each turn's tokens are found as the growth of the rendered
    conversation when that turn is added (works for any template that only appends)."""
    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(messages):
        rendered = tokenizer.apply_chat_template(messages[:i + 1], tokenize=True, add_generation_prompt=False)
        # Transformers 5 returns a BatchEncoding (a Mapping, not a dict) here.
        rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        new = rendered[len(ids):]
        ids = rendered
        mask += [int(m["role"] == "assistant")] * len(new)
    return Example(ids, mask)


def encode(record: dict, tokenizer=None) -> Example:
    if "input_ids" in record:
        return Example(list(record["input_ids"]), list(record.get("loss_mask") or [1] * len(record["input_ids"])))
    if "prompt_ids" in record:
        p, r = list(record["prompt_ids"]), list(record["response_ids"])
        return Example(p + r, [0] * len(p) + [1] * len(r))
    if tokenizer is None:
        raise ValueError("data: text records need a tokenizer (the target's or --tokenizer)")
    if "conversations" in record:
        return _chat_example(tokenizer, _messages(record))
    if "prompt" in record:
        p = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
        r = tokenizer(record["response"], add_special_tokens=False)["input_ids"]
        return Example(p + r, [0] * len(p) + [1] * len(r))
    if "text" in record:
        ids = tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        return Example(ids, [1] * len(ids))
    raise ValueError(f"data: record with keys {sorted(record)}, expected prompt_ids/response_ids, input_ids, "
                     "prompt/response, conversations or text")


def truncate(ex: Example, max_length: int) -> Optional[Example]:
    ex = Example(ex.input_ids[:max_length], ex.loss_mask[:max_length])
    # A usable anchor needs two consecutive loss tokens.
    if not any(a and b for a, b in zip(ex.loss_mask, ex.loss_mask[1:])):
        return None
    return ex


@dataclass
class Batch:
    input_ids: torch.Tensor       # [b, S] (right-padded)
    attention_mask: torch.Tensor  # [b, S] 1 = real token
    loss_mask: torch.Tensor       # [b, S] 1 = a token the draft learns to predict


def collate(examples: list[Example], pad_id: int) -> Batch:
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(e.loss_mask)
    return Batch(ids, attn, loss)


class BatchSchedule:
    """Batch `step` of a run over `examples`: epoch e = a permutation seeded by (seed, e)."""

    def __init__(self, examples: list[Example], batch_size: int, seed: int, pad_id: int):
        if not examples:
            raise ValueError("data: no usable example (each needs two consecutive loss-masked tokens)")
        self.examples, self.batch_size, self.seed, self.pad_id = examples, batch_size, seed, pad_id
        self.steps_per_epoch = max(len(examples) // batch_size, 1)
        self._epoch, self._order = -1, None

    def batch(self, step: int) -> Batch:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.examples), generator=g).tolist()
        idx = self._order[i * self.batch_size:(i + 1) * self.batch_size]
        return collate([self.examples[j] for j in idx], self.pad_id)

    def __iter__(self) -> Iterator[Batch]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
