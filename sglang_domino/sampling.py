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


# How many of a row's largest logits `DraftQ` decides top-k and top-p among.
Q_TOP_CAP = 256
# `DraftQ`'s weights are at least e^-80 of the row's largest (a normal float)
_EXP_FLOOR = 80.0


class DraftQ:
    """A draft's q [b, C] from logits [b, C] under each row's own temperature [b], top-k [b]
    (<= 0: none), top-p [b] and greedy flag [b] (q on the row's largest logits only), in
    fixed shapes and without a host read, so a CUDA graph can hold it. The row constants
    are computed once (a rollout calls it once per proposal).

    Top-k and top-p are decided among the row's `cap` largest logits: a top-k above the cap
    does not truncate, and a nucleus that the cap's tokens do not fill keeps every token.
    Within the cap it is `to_probs` (tokens tied at the cut are kept). The speculative rule
    is exact for any q its proposals are drawn from, so the cap shapes acceptance only.
    Where the host knows that no row uses top-k (greedy rows are top-k 1) or top-p,
    `top_k_used` / `top_p_used` False skip those parts (same q)."""

    def __init__(self, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, greedy: torch.Tensor,
                 width: int, cap: int = Q_TOP_CAP, top_k_used: bool = True, top_p_used: bool = True):
        self.k = max(1, min(int(cap), int(width)))
        self.top_k_used, self.top_p_used = bool(top_k_used), bool(top_p_used)
        self.inv_t = temperature.float().clamp_min(GREEDY_TEMPERATURE).reciprocal()[:, None]
        cols = torch.arange(self.k, device=temperature.device)[None]
        top_k = top_k.to(torch.int64)
        self.cut_k = ((top_k > 0) & (top_k <= self.k))[:, None]
        kept_k = torch.where(self.cut_k[:, 0], top_k, self.k)
        self.within_k = cols < kept_k[:, None]
        # the threshold top-k (or greediness: the largest logit) sets: the kept count's last top logit
        self.cut = self.cut_k | greedy[:, None]
        self.kth = torch.where(greedy, 0, kept_k - 1)[:, None]
        self.top_p = top_p.float()[:, None]
        # rows whose nucleus never cuts: no top-p, or a top-k that does not cut (the cap's tokens may not fill it)
        self.p_open = self.top_p >= 1.0
        self.k_open = ~self.cut_k

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() * self.inv_t
        if not (self.top_k_used or self.top_p_used):
            return scaled.softmax(-1)
        top = torch.topk(scaled, self.k, dim=-1).values                   # [b, k], descending
        # unnormalised weights relative to the row's largest logit, floored at e^-80 so that no
        # exp lands among subnormal floats (70x slower on x86 CPUs); q is exact whatever it is
        weights = (scaled - top[:, :1]).clamp_min_(-_EXP_FLOOR).exp_()
        thr = top.gather(1, self.kth).masked_fill_(~self.cut, float("-inf"))
        if self.top_p_used:
            top_weights = (top - top[:, :1]).clamp_min_(-_EXP_FLOOR).exp_().mul_(self.within_k)
            # the normaliser after top-k: the kept top weights where top-k cuts, else all
            total = torch.where(self.cut_k, top_weights.sum(-1, keepdim=True), weights.sum(-1, keepdim=True))
            mass = top_weights.div_(total)                                 # p of the top ones after top-k
            kept_p = (mass.cumsum(-1).sub_(mass) < self.top_p).logical_and_(self.within_k).sum(-1, keepdim=True)
            thr_p = top.gather(1, kept_p.clamp_min_(1).sub_(1))
            # a nucleus reaching past the cap keeps every token
            open_tail = (kept_p == self.k - 1) & self.k_open & (mass.sum(-1, keepdim=True) < self.top_p)
            thr = torch.maximum(thr, thr_p.masked_fill_(open_tail | self.p_open, float("-inf")))
        probs = weights.mul_(scaled >= thr)
        return probs.div_(probs.sum(-1, keepdim=True))
