"""Sampling parameters and the one logits -> probabilities transform.

The target's distribution p and the draft's q go through the same `to_probs`, so the
speculative rule compares like with like (temperature, then top-k, then top-p, the
order Transformers' `generate` applies them in).
"""

from __future__ import annotations

from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

GREEDY_TEMPERATURE = 1e-5


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities in fp32 after temperature, top-k and top-p."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: a token stays when the mass
        # strictly before it is below top_p (so the most likely token always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One token per row of `probs` [..., V] -> [...] (int64)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


# How many of a row's largest logits `draft_q_probs` decides top-k and top-p among.
Q_TOP_CAP = 256


def draft_q_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  greedy: torch.Tensor, cap: int = Q_TOP_CAP) -> torch.Tensor:
    """A draft's q [b, C] from logits [b, C] under each row's own temperature [b], top-k [b]
    (<= 0: none), top-p [b] and greedy flag [b] (a point mass on the argmax), in fixed
    shapes and without a host sync, so a CUDA graph can hold it.

    Top-k and top-p are decided among the row's `cap` largest logits: a top-k above the cap
    does not truncate, and a nucleus that the cap's tokens do not fill keeps every token.
    Within the cap it is `to_probs` (tokens tied at the cut are kept). The speculative rule
    is exact for any q its proposals are drawn from, so the cap shapes acceptance only."""
    width = int(logits.shape[-1])
    k = min(int(cap), width)
    scaled = logits.float() / temperature.float().clamp_min(GREEDY_TEMPERATURE)[:, None]
    top = torch.topk(scaled, k, dim=-1).values                            # [b, k], descending
    top_k = top_k.to(torch.int64)
    cut_k = (top_k > 0) & (top_k <= k)
    kept_k = torch.where(cut_k, top_k, k)
    thr_k = torch.where(cut_k, top.gather(1, (kept_k - 1)[:, None])[:, 0], float("-inf"))
    within_k = torch.arange(k, device=logits.device)[None] < kept_k[:, None]
    log_mass = torch.logsumexp(scaled.masked_fill(scaled < thr_k[:, None], float("-inf")), -1, keepdim=True)
    mass = (top - log_mass).exp() * within_k                               # p of the top ones after top-k
    keep = ((mass.cumsum(-1) - mass) < top_p.float()[:, None]) & within_k
    kept_p = keep.sum(-1).clamp_min(1)
    thr_p = top.gather(1, (kept_p - 1)[:, None])[:, 0]
    open_tail = (kept_p == k) & ~cut_k & (mass.sum(-1) < top_p.float())   # the nucleus reaches past the cap
    thr_p = torch.where(open_tail | (top_p >= 1.0), float("-inf"), thr_p)
    thr = torch.maximum(thr_k, thr_p)
    probs = scaled.masked_fill(scaled < thr[:, None], float("-inf")).softmax(-1)
    point = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], point, probs)
