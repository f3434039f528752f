"""`spec_generate`: lossless block speculative decoding with a Transformers target.

One step, for every unfinished row at once:
  draft_block  the backbone reads [pending, MASK x (B-1)] over the cached context and
               the rollout proposes n tokens (greedy, or sampled with their q);
  verify       the target runs [pending, proposals] (n+1 tokens) on its cache;
  accept       longest matching prefix (greedy) or speculative sampling, plus one
               token from the target, so a step commits a+1 tokens;
  commit       committed slots stay valid in the target cache and their target hidden
               states become draft context; the target's token is the next pending one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch
from transformers import DynamicCache

from ..accept import accept
from ..config import DraftConfigError
from ..rollout import Proposal, propose_dflash, propose_domino
from ..sampling import SamplingParams, sample, to_probs
from .state import DraftContext, TargetCache


@dataclass
class SpecStats:
    """`accept_lengths`: tokens committed by each verification step (bonus included), over
    all rows in step order; `per_row_accept_lengths` keeps them apart by row."""

    accept_lengths: list[int] = field(default_factory=list)
    per_row_accept_lengths: list[list[int]] = field(default_factory=list)
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    accept_time: float = 0.0
    total_time: float = 0.0
    new_tokens: int = 0

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / max(len(self.accept_lengths), 1)

    @property
    def num_verify_steps(self) -> int:
        return len(self.accept_lengths)

    def __getitem__(self, key: str):
        return getattr(self, key)


class _Timer:
    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


def target_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenated outputs of target decoder layers `layer_ids` ([0] of HF's tuple is the
    embedding output, so layer l is entry l+1)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@torch.inference_mode()
def spec_generate(draft, target, input_ids: torch.Tensor, max_new_tokens: int = 2048,
                  temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                  stop_token_ids: Optional[Iterable[int]] = None,
                  attention_mask: Optional[torch.Tensor] = None,
                  num_verify_tokens: Optional[int] = None, mask_token_id: Optional[int] = None,
                  pad_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                  greedy_draft: bool = False, return_stats: bool = False):
    cfg = draft.config
    cfg.check_target(target.config)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    # greedy_draft: at temperature > 0 the draft still proposes its argmaxes and each one is
    # verified as a point mass (accepted with probability p(d)), as SGLang 0.5.23 does for
    # DFLASH; the output follows p either way, only the acceptance differs.
    propose_params = SamplingParams() if greedy_draft else params
    mask_id = mask_token_id if mask_token_id is not None else cfg.mask_token_id
    if mask_id is None:
        raise DraftConfigError("dflash_config.mask_token_id: missing, expected a token id (or pass mask_token_id=)")
    vocab = target.get_input_embeddings().weight.shape[0]
    if not 0 <= mask_id < vocab:
        raise DraftConfigError(f"mask_token_id: got {mask_id}, expected an id inside the target vocabulary [0, {vocab - 1}]")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: got {max_new_tokens}, expected >= 1")
    n_max = cfg.num_predictions
    n = n_max if num_verify_tokens is None else num_verify_tokens - 1
    if not 1 <= n <= n_max:
        raise ValueError(f"num_verify_tokens: got {num_verify_tokens}, expected 2..{n_max + 1} "
                         f"(block_size={cfg.block_size}, shift_label={cfg.shift_label})")
    stops = set(int(t) for t in (stop_token_ids or []))
    if pad_token_id is None:
        pad_token_id = getattr(target.generation_config, "pad_token_id", None)
        pad_token_id = pad_token_id if pad_token_id is not None else (min(stops) if stops else 0)

    device = input_ids.device
    timer = _Timer(device)
    stats = SpecStats(per_row_accept_lengths=[[] for _ in range(input_ids.shape[0])])
    t_start = timer.now()
    layer_ids = cfg.target_layer_ids

    # -- prefill --------------------------------------------------------------------
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    out = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                 past_key_values=DynamicCache(), use_cache=True, output_hidden_states=True, logits_to_keep=1)
    pending = _pick_token(out.logits[:, -1], params, generator)
    tcache = TargetCache(out.past_key_values, attention_mask.bool())
    context = DraftContext()
    context.append(draft.context_kv(target_features(out.hidden_states, layer_ids), positions),
                   attention_mask.bool(), positions)
    next_pos = positions[:, -1] + 1
    rows = torch.arange(input_ids.shape[0], device=device)   # original row of each active row
    new_tokens: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    done = [_commit(new_tokens[r], [t], stops, max_new_tokens) for r, t in enumerate(pending.tolist())]
    stats.prefill_time = timer.now() - t_start

    offsets = torch.arange(n + 1, device=device)
    while True:
        active = [i for i, r in enumerate(rows.tolist()) if not done[r]]
        if not active:
            break
        if len(active) < len(rows):
            keep = torch.tensor(active, device=device)
            rows, pending, next_pos = rows[keep], pending[keep], next_pos[keep]
            tcache.select(keep)
            context.select(keep)

        # -- draft_block --------------------------------------------------------------
        t0 = timer.now()
        proposal = draft_block(draft, target, pending, next_pos, context, n, mask_id, propose_params, generator)
        t1 = timer.now()

        # -- verify -----------------------------------------------------------------
        verify_ids = torch.cat([pending[:, None], proposal.tokens], dim=1)
        verify_pos = next_pos[:, None] + offsets
        out = target(input_ids=verify_ids, attention_mask=tcache.attention_mask(n + 1), position_ids=verify_pos,
                     past_key_values=tcache.cache, use_cache=True, output_hidden_states=True)
        t2 = timer.now()

        # -- accept and commit --------------------------------------------------------
        accepted, pending = accept(proposal.tokens, proposal.probs, out.logits, params, generator)
        keep_slots = offsets[None] <= accepted[:, None]    # pending + accepted drafts
        width = int(keep_slots.sum(1).max())
        tcache.commit(keep_slots)
        feats = target_features(out.hidden_states, layer_ids)[:, :width]
        context.append(draft.context_kv(feats, verify_pos[:, :width]), keep_slots[:, :width], verify_pos[:, :width])
        next_pos = next_pos + accepted + 1
        _record(stats, rows, accepted, proposal, pending, new_tokens, done, stops, max_new_tokens)
        t3 = timer.now()
        stats.draft_time += t1 - t0
        stats.verify_time += t2 - t1
        stats.accept_time += t3 - t2

    stats.total_time = timer.now() - t_start
    stats.new_tokens = sum(len(t) for t in new_tokens)
    width = max(len(t) for t in new_tokens)
    padded = torch.full((len(new_tokens), width), pad_token_id, dtype=input_ids.dtype, device=device)
    for r, toks in enumerate(new_tokens):
        padded[r, :len(toks)] = torch.tensor(toks, dtype=input_ids.dtype, device=device)
    output = torch.cat([input_ids, padded], dim=1)
    return (output, stats) if return_stats else output


def draft_block(draft, target, pending: torch.Tensor, next_pos: torch.Tensor, context: DraftContext, n: int,
                mask_id: int, params: SamplingParams, generator) -> Proposal:
    """Run the backbone on [pending, MASK x (B-1)] at positions next_pos.. and propose the
    n tokens that follow `pending`."""
    cfg = draft.config
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    block_ids = torch.full((len(pending), cfg.block_size), mask_id, dtype=torch.long, device=pending.device)
    block_ids[:, 0] = pending
    block_pos = next_pos[:, None] + torch.arange(cfg.block_size, device=pending.device)
    masks = context.masks(block_pos, draft.layer_types, cfg.sliding_window)
    hidden = draft(embed(block_ids), block_pos, context.kv, masks)
    # Shifted labels: slot k predicts the token after slot k; else slot k predicts itself.
    first_slot = 0 if cfg.shift_label else 1
    slots = hidden[:, first_slot:first_slot + n]
    base_logits = lm_head(slots.to(lm_head.weight.dtype))
    if cfg.is_domino:
        return propose_domino(slots, base_logits, pending, embed, draft, params, generator)
    return propose_dflash(base_logits, params, generator)


def _pick_token(logits: torch.Tensor, params: SamplingParams, generator) -> torch.Tensor:
    if params.greedy:
        return logits.argmax(-1)
    return sample(to_probs(logits, params), generator)


def _commit(row_tokens: list[int], tokens: list[int], stops: set[int], max_new_tokens: int) -> bool:
    """Append `tokens` to a row until a stop token or the length limit; True when finished."""
    for tok in tokens:
        row_tokens.append(tok)
        if tok in stops or len(row_tokens) >= max_new_tokens:
            return True
    return False


def _record(stats: SpecStats, rows, accepted, proposal: Proposal, next_tokens, new_tokens, done, stops,
            max_new_tokens) -> None:
    drafts = proposal.tokens.tolist()
    for i, (r, a, nxt) in enumerate(zip(rows.tolist(), accepted.tolist(), next_tokens.tolist())):
        stats.accept_lengths.append(a + 1)
        stats.per_row_accept_lengths[r].append(a + 1)
        done[r] = _commit(new_tokens[r], drafts[i][:a] + [nxt], stops, max_new_tokens)
