"""Acceptance rules for a chain of n draft tokens verified by the target in one pass.

`target_logits` has n+1 rows: row i is the target's prediction for the position after
draft i-1 (row 0 follows the bonus token, row n follows the last draft).
Both rules return (accepted count a in [0, n], next token): the caller commits drafts
0..a-1 and then `next`, so a step commits a+1 tokens.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .sampling import SamplingParams, to_probs


def accepted_prefix(matches: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in each row of matches [b, n]."""
    return matches.long().cumprod(dim=-1).sum(dim=-1)


def accept_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix of drafts equal to the target's argmax, then the target's own token."""
    target_tokens = target_logits.argmax(-1)
    accepted = accepted_prefix(draft_tokens == target_tokens[:, :-1])
    return accepted, target_tokens.gather(1, accepted[:, None]).squeeze(1)


def accept_sampled(draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor], target_logits: torch.Tensor,
                   params: SamplingParams, generator: Optional[torch.Generator] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept_probs` on the target's logits under `params`."""
    return accept_probs(draft_tokens, draft_probs, to_probs(target_logits, params), generator)


class Uniforms(NamedTuple):
    """The randomness of one chain verification: `steps` [b, n], the coin of each draft
    test, and `final` [b], the inverse-CDF coin of the token after the accepted prefix.
    Fixing them fixes the outcome, which holds the Triton kernel to this reference."""
    steps: torch.Tensor
    final: torch.Tensor

    @classmethod
    def draw(cls, b: int, n: int, device, generator: Optional[torch.Generator] = None) -> "Uniforms":
        u = torch.rand((b, n + 1), generator=generator, device=device)
        return cls(u[:, :n], u[:, n])


def accept_probs(draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor,
                 generator: Optional[torch.Generator] = None, uniforms: Optional[Uniforms] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023): accept draft d ~ q with probability
    min(1, p(d)/q(d)); at the first rejection draw from norm(max(0, p - q)); after n
    acceptances draw the bonus from p. The emitted tokens follow p exactly.

    `target_probs` [b, n+1, V] is p, already through temperature/top-k/top-p.
    `draft_probs` [b, n, V] is q; None means a greedy draft (q a point mass on each
    draft token: accept with probability p(d), on rejection draw from p without d).
    Draft k is accepted when u_k * q(d_k) < p(d_k) and q(d_k) > 0; the next token is
    the first index whose running residual mass exceeds u_final * total mass: the draws
    the Triton kernel `sglang_domino.kernels.chain_accept` makes (and 0.5.23's
    `chain_speculative_sampling_triton`), so fixed uniforms give both the same tokens."""
    b, n = draft_tokens.shape
    p = target_probs.float()
    if uniforms is None:
        uniforms = Uniforms.draw(b, n, p.device, generator)
    if n == 0:
        # nothing proposed (an adaptive width-1 step): the general path below reduces to
        # this draw from p, the same coin giving the same token, in a quarter of the time
        return torch.zeros(b, dtype=torch.int64, device=p.device), sample_inverse_cdf(p[:, 0], uniforms.final)
    p_d = p[:, :n].gather(-1, draft_tokens[..., None]).squeeze(-1)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
    else:
        q_d = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).float()
    accepted = accepted_prefix((uniforms.steps * q_d < p_d) & (q_d > 0))
    rows = torch.arange(b, device=p.device)
    p_next = p[rows, accepted]                                           # [b, V]
    if draft_probs is None:
        rejected = torch.cat([draft_tokens, draft_tokens.new_zeros(b, 1)], dim=1)[rows, accepted]
        q_next = torch.zeros_like(p_next).scatter_(1, rejected[:, None], 1.0)
        q_next[accepted == n] = 0
    else:
        q_next = torch.cat([draft_probs.float(), torch.zeros_like(p[:, :1])], dim=1)[rows, accepted]
    # After n acceptances q_next is 0, so the residual is p itself (the bonus). A
    # rejection implies p(d) < q(d), hence positive residual mass; the fallback to p only
    # guards a residual lost to rounding.
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual, p_next)
    return accepted, sample_inverse_cdf(residual, uniforms.final)


def sample_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row-wise draw from unnormalised `weights` [b, V] with coins `u` [b]: the first
    index whose cumulative weight exceeds u * total."""
    cdf = weights.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].contiguous(), right=True).squeeze(1)
    return idx.clamp_max(weights.shape[-1] - 1)


def accept(draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor], target_logits: torch.Tensor,
           params: SamplingParams, generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
    if params.greedy:
        return accept_greedy(draft_tokens, target_logits)
    return accept_sampled(draft_tokens, draft_probs, target_logits, params, generator)
