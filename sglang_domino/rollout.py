"""Draft proposals from the backbone's block hidden states.

The Transformers backend and SGLang's sampled (q-rule) path both propose through this
module; SGLang's greedy path runs upstream's `domino_greedy_rollout` by design (CUDA
graphs, TP), held equal to this one by tests (`tests/sglang/test_sampled_rollout.py`).

DFlash predicts every block position independently from the backbone output. Domino
rolls out left to right: the first proposal uses the base logits only
(`pure_draft_prefix_len` = 1), each later one adds the correction computed from the
GRU state over [bonus, proposals so far].

Greedy proposals are argmaxes. Sampled proposals are drawn from the draft's own
distribution q (for Domino, softmax of base + correction at each step, conditioned on
the tokens actually drawn) and q is returned for the acceptance rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .sampling import SamplingParams, sample, to_probs


@dataclass
class Proposal:
    tokens: torch.Tensor                 # [b, n] int64
    probs: Optional[torch.Tensor] = None  # [b, n, V] draft distribution q (None when greedy)


# pick(logits [b, V], k) -> (tokens [b], probs [b, V] or None): how proposal k is chosen
# from its logits. The Transformers backend picks under one SamplingParams (`picker`);
# the SGLang worker under each request's own parameters and seeded coins.
Pick = Callable[[torch.Tensor, int], tuple[torch.Tensor, Optional[torch.Tensor]]]


def picker(params: SamplingParams, generator: Optional[torch.Generator] = None) -> Pick:
    def pick(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if params.greedy:
            return logits.argmax(-1), None
        probs = to_probs(logits, params)
        return sample(probs, generator), probs
    return pick


def propose_dflash(base_logits: torch.Tensor, params: SamplingParams,
                   generator: Optional[torch.Generator] = None) -> Proposal:
    """base_logits [b, n, V] for the n positions after the bonus token."""
    tokens, probs = picker(params, generator)(base_logits, 0)
    return Proposal(tokens, probs)


def propose_domino(hidden: torch.Tensor, base_logits: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                   bonus: torch.Tensor, embed: Callable[[torch.Tensor], torch.Tensor], draft,
                   params: SamplingParams | Pick, generator: Optional[torch.Generator] = None) -> Proposal:
    """hidden [b, n, H] and base_logits [b, n, V]: the backbone slots predicting the next n
    tokens after `bonus` [b]; `draft` provides `correction`, `run_gru`, `gru_step`.
    `base_logits` may also be (first [b, V], rest [b, n-1, C]) with later proposals over C
    candidates (a draft's candidate pool, which `draft.correction` and the pick then share).
    `params` is a SamplingParams (with `generator`) or a `Pick`; the probabilities it
    returns for every step make up q."""
    pick = picker(params, generator) if isinstance(params, SamplingParams) else params
    first_logits, rest = base_logits if isinstance(base_logits, tuple) else (base_logits[:, 0], base_logits[:, 1:])
    n = hidden.shape[1]
    first, first_probs = pick(first_logits, 0)
    tokens, probs = [first], [first_probs]
    if n > 1:
        state = draft.run_gru(embed(torch.stack([bonus, first], dim=1)))[:, -1]
        for k in range(1, n):
            logits = rest[:, k - 1].float() + draft.correction(hidden[:, k], state).float()
            tok, tok_probs = pick(logits, k)
            tokens.append(tok)
            probs.append(tok_probs)
            if k + 1 < n:
                state = draft.gru_step(embed(tok), state)
    return Proposal(torch.stack(tokens, dim=1), None if probs[0] is None else torch.stack(probs, dim=1))
