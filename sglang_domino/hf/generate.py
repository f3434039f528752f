"""`spec_generate`: lossless block speculative decoding with a Transformers target.

`prefill` runs the prompts through the target and picks each row's first token (the first
pending one). Then one step, for every unfinished row at once:
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
from ..config import DraftConfigError, predicting_slots
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


@dataclass
class _Args:
    """`spec_generate`'s arguments, checked and resolved."""

    params: SamplingParams          # the target's sampling, and the acceptance rule's
    propose_params: SamplingParams  # how the draft proposes
    mask_id: int
    n: int                          # proposals per step
    stops: set[int]
    max_new_tokens: int
    pad_token_id: int
    layer_ids: list[int]            # target layers read as draft context


@dataclass
class _Run:
    """The loop's state. Tensors hold the unfinished rows; `new_tokens` and `done` are
    indexed by original row."""

    rows: torch.Tensor       # [b] original row of each unfinished row
    pending: torch.Tensor    # [b] committed token the target has not run yet (slot 0 of the next block)
    next_pos: torch.Tensor   # [b] its position
    tcache: TargetCache
    context: DraftContext
    new_tokens: list[list[int]]
    done: list[bool]

    def drop_finished(self) -> bool:
        """Drop finished rows from every tensor and cache; False when none is left."""
        active = [i for i, r in enumerate(self.rows.tolist()) if not self.done[r]]
        if active and len(active) < len(self.rows):
            keep = torch.tensor(active, device=self.rows.device)
            self.rows, self.pending, self.next_pos = self.rows[keep], self.pending[keep], self.next_pos[keep]
            self.tcache.select(keep)
            self.context.select(keep)
        return bool(active)


@torch.inference_mode()
def spec_generate(draft, target, input_ids: torch.Tensor, max_new_tokens: int = 2048,
                  temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                  stop_token_ids: Optional[Iterable[int]] = None,
                  attention_mask: Optional[torch.Tensor] = None,
                  num_verify_tokens: Optional[int] = None, mask_token_id: Optional[int] = None,
                  pad_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                  greedy_draft: bool = False, return_stats: bool = False):
    args = _check_args(draft, target, max_new_tokens, temperature, top_p, top_k, stop_token_ids,
                       num_verify_tokens, mask_token_id, pad_token_id, greedy_draft)
    timer = _Timer(input_ids.device)
    stats = SpecStats(per_row_accept_lengths=[[] for _ in range(input_ids.shape[0])])
    t_start = timer.now()
    run = prefill(draft, target, input_ids, attention_mask, args, generator)
    stats.prefill_time = timer.now() - t_start
    while run.drop_finished():
        t0 = timer.now()
        proposal = draft_block(draft, target, run.pending, run.next_pos, run.context, args.n, args.mask_id,
                               args.propose_params, generator)
        t1 = timer.now()
        out = verify(target, run, proposal)
        t2 = timer.now()
        accepted, next_tokens = accept(proposal.tokens, proposal.probs, out.logits, args.params, generator)
        commit(draft, run, out, accepted, next_tokens, args.layer_ids)
        _record(stats, run, accepted, proposal, next_tokens, args)
        t3 = timer.now()
        stats.draft_time += t1 - t0
        stats.verify_time += t2 - t1
        stats.accept_time += t3 - t2
    stats.total_time = timer.now() - t_start
    stats.new_tokens = sum(len(t) for t in run.new_tokens)
    output = _pad_output(input_ids, run.new_tokens, args.pad_token_id)
    return (output, stats) if return_stats else output


def _check_args(draft, target, max_new_tokens, temperature, top_p, top_k, stop_token_ids, num_verify_tokens,
                mask_token_id, pad_token_id, greedy_draft) -> _Args:
    cfg = draft.config
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    # greedy_draft: at temperature > 0 the draft still proposes its argmaxes and each one is
    # verified as a point mass (accepted with probability p(d)), as SGLang 0.5.23 does for
    # DFLASH; the output follows p either way, only the acceptance differs.
    propose_params = SamplingParams() if greedy_draft else params
    cfg.check_target(target.config, target_vocab_size=target.get_input_embeddings().weight.shape[0],
                     mask_token_id=mask_token_id)
    mask_id = mask_token_id if mask_token_id is not None else cfg.mask_token_id
    if mask_id is None:
        raise DraftConfigError("dflash_config.mask_token_id: missing, expected a token id (or pass mask_token_id=)")
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
    return _Args(params, propose_params, mask_id, n, stops, max_new_tokens, pad_token_id, cfg.target_layer_ids)


def prefill(draft, target, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], args: _Args,
            generator) -> _Run:
    """The target runs the prompts: its last logits give each row's first new token (the
    first pending one), its hidden states the draft context."""
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    out = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                 past_key_values=DynamicCache(), use_cache=True, output_hidden_states=True, logits_to_keep=1)
    pending = _pick_token(out.logits[:, -1], args.params, generator)
    context = DraftContext()
    context.append(draft.context_kv(target_features(out.hidden_states, args.layer_ids), positions),
                   attention_mask.bool(), positions)
    new_tokens: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    done = [_extend_row(new_tokens[r], [t], args.stops, args.max_new_tokens) for r, t in enumerate(pending.tolist())]
    return _Run(rows=torch.arange(input_ids.shape[0], device=device), pending=pending, next_pos=positions[:, -1] + 1,
                tcache=TargetCache(out.past_key_values, attention_mask.bool()), context=context,
                new_tokens=new_tokens, done=done)


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
    slots = hidden[:, predicting_slots(cfg.block_size, cfg.shift_label, n)]
    base_logits = lm_head(slots.to(lm_head.weight.dtype))
    if cfg.is_domino:
        return propose_domino(slots, base_logits, pending, embed, draft, params, generator)
    return propose_dflash(base_logits, params, generator)


def verify(target, run: _Run, proposal: Proposal):
    """The target runs [pending, proposals] (n+1 tokens) on its cache; returns its output."""
    width = proposal.tokens.shape[1] + 1
    ids = torch.cat([run.pending[:, None], proposal.tokens], dim=1)
    positions = run.next_pos[:, None] + torch.arange(width, device=run.next_pos.device)
    return target(input_ids=ids, attention_mask=run.tcache.attention_mask(width), position_ids=positions,
                  past_key_values=run.tcache.cache, use_cache=True, output_hidden_states=True)


def commit(draft, run: _Run, out, accepted: torch.Tensor, next_tokens: torch.Tensor, layer_ids: list[int]) -> None:
    """Keep each row's pending token and its `accepted` drafts: they stay valid in the target
    cache and their target hidden states become draft context. The target's token becomes
    the next pending one."""
    offsets = torch.arange(out.logits.shape[1], device=run.next_pos.device)   # verify slots
    keep_slots = offsets[None] <= accepted[:, None]    # pending + accepted drafts
    width = int(keep_slots.sum(1).max())
    run.tcache.commit(keep_slots)
    positions = (run.next_pos[:, None] + offsets)[:, :width]
    feats = target_features(out.hidden_states, layer_ids)[:, :width]
    run.context.append(draft.context_kv(feats, positions), keep_slots[:, :width], positions)
    run.next_pos = run.next_pos + accepted + 1
    run.pending = next_tokens


def _pick_token(logits: torch.Tensor, params: SamplingParams, generator) -> torch.Tensor:
    if params.greedy:
        return logits.argmax(-1)
    return sample(to_probs(logits, params), generator)


def _extend_row(row_tokens: list[int], tokens: list[int], stops: set[int], max_new_tokens: int) -> bool:
    """Append `tokens` to a row until a stop token or the length limit; True when finished."""
    for tok in tokens:
        row_tokens.append(tok)
        if tok in stops or len(row_tokens) >= max_new_tokens:
            return True
    return False


def _record(stats: SpecStats, run: _Run, accepted: torch.Tensor, proposal: Proposal, next_tokens: torch.Tensor,
            args: _Args) -> None:
    """Each row's output gains its accepted drafts and the target's token; the step's accept
    lengths go to `stats`."""
    drafts = proposal.tokens.tolist()
    for i, (r, a, nxt) in enumerate(zip(run.rows.tolist(), accepted.tolist(), next_tokens.tolist())):
        stats.accept_lengths.append(a + 1)
        stats.per_row_accept_lengths[r].append(a + 1)
        run.done[r] = _extend_row(run.new_tokens[r], drafts[i][:a] + [nxt], args.stops, args.max_new_tokens)


def _pad_output(input_ids: torch.Tensor, new_tokens: list[list[int]], pad_token_id: int) -> torch.Tensor:
    """The prompts followed by each row's new tokens, right-padded to the longest row."""
    width = max(len(t) for t in new_tokens)
    padded = torch.full((len(new_tokens), width), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    for r, toks in enumerate(new_tokens):
        padded[r, :len(toks)] = torch.tensor(toks, dtype=input_ids.dtype, device=input_ids.device)
    return torch.cat([input_ids, padded], dim=1)
