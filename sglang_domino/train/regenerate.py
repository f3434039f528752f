"""Regenerating training responses with the target itself (greedy), as the published
DFlash / Domino recipes do: the draft then learns the distribution it will be asked to
predict at inference, not the one of the original data."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from tqdm import tqdm


@torch.inference_mode()
def regenerate(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 32,
               pad_token_id: int = 0, stop_token_ids: Optional[Iterable[int]] = None,
               progress: bool = True) -> list[list[int]]:
    """Greedy continuations of `prompts` (token id lists). Batches are left-padded, and each
    response is cut after its first stop token."""
    stops = set(int(t) for t in (stop_token_ids or []))
    responses: list[list[int]] = [[] for _ in prompts]
    # Similar lengths together: less padding, and padding never changes the greedy result.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc="regenerate", disable=not progress, mininterval=5):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        device = next(target.parameters()).device
        out = target.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                              max_new_tokens=max_new_tokens, do_sample=False,
                              pad_token_id=pad_token_id, eos_token_id=sorted(stops) or None)
        for row, i in enumerate(idx):
            resp = out[row, width:].cpu().tolist()
            for j, tok in enumerate(resp):
                if tok in stops:
                    resp = resp[:j + 1]
                    break
            responses[i] = resp
    return responses
