"""The Domino rollout sampled from q in the SGLang worker (`--speculative-use-rejection-sampling`).

0.5.23 proposes Domino drafts by argmax at every temperature
(`domino_utils.domino_greedy_rollout`, called eagerly by
`DFlashWorkerV2.forward_batch_generation`) and verifies sampled requests as point masses.
With the flag, a decode step that has sampled requests runs this project's one rollout
(`sglang_domino.rollout.propose_domino`) instead: each proposal k is drawn from q_k =
the draft's base + correction logits under the request's own temperature, top-k and
top-p (through upstream's transform for the target, `build_speculative_verify_target_probs`,
so p and q are shaped alike), the GRU consuming the sampled token. The step keeps q for
`DominoDFlashWorker._accept_block`, which accepts with min(1, p/q) (`sglang_domino.accept`).

Coins: a request with `sampling_seed` (0.5.23 fills it under
`--enable-deterministic-inference`) gets coins hashed from (seed, committed length,
column) with upstream's `murmur_hash32`, so it repeats; others draw from torch's RNG.
Columns 0..n-1 are the proposals' coins, n..2n the acceptance's.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..accept import Uniforms, accept_probs, sample_inverse_cdf
from ..config import predicting_slots
from ..rollout import propose_domino

_local = threading.local()


class UpstreamDominoHead:
    """`propose_domino`'s draft interface over 0.5.23's Domino modules (`prefix_gru`,
    `embed_proj`, `models/dflash.py`), the same math as `sglang_domino.model.DraftModel`.
    With a candidate pool, q is zero off the pool (the correction is -inf there), as
    upstream's greedy pool rollout restricts its argmax; that stays exact, only q changes."""

    def __init__(self, prefix_gru, embed_proj, pool_ids: Optional[torch.Tensor] = None, vocab: int = 0):
        self.gru, self.proj = prefix_gru, embed_proj
        self.off_pool = None
        if pool_ids is not None:
            self.off_pool = torch.ones(pool_ids.shape[0], vocab, dtype=torch.bool, device=pool_ids.device)
            self.off_pool.scatter_(1, pool_ids, False)

    def correction(self, z: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        out = self.proj(torch.cat((z, state.to(z.dtype)), dim=-1))
        if self.off_pool is not None:
            out = out.float().masked_fill(self.off_pool, float("-inf"))
        return out

    def run_gru(self, embeds: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(embeds.to(self.gru.weight_ih_l0.dtype))
        return out

    def gru_step(self, embed: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        from sglang.srt.speculative.domino_utils import _domino_gru_cell

        return _domino_gru_cell(self.gru, embed.to(self.gru.weight_ih_l0.dtype), state)


@dataclass
class SampledStep:
    """One decode step's sampled rollout: what the proposals were drawn under, and q in
    the compact layout of `sglang_domino.kernels.chain_accept` (q_0 dense, later
    proposals on the candidate pool), never a dense [bs, n, V] buffer."""
    sampling_info: object
    positions: torch.Tensor                 # [bs] committed lengths: the coins' position key
    sync_tokens: object = None              # every TP rank proposes rank 0's tokens
    pool_ids: Optional[torch.Tensor] = None  # [bs, K], None: the whole vocabulary
    tokens: Optional[torch.Tensor] = None   # [bs, n]
    q_first: Optional[torch.Tensor] = None  # [bs, V]
    q_rest: list = field(default_factory=list)    # n - 1 x [bs, K or V]
    q_draft: list = field(default_factory=list)   # n x [bs]: q_k at the drawn token
    rollout_coins: Optional[torch.Tensor] = None  # [bs, n], drawn once per rollout
    # the batch's top-k bounds, known on the host (`DFlashDraftInputV2.prepare_for_decode`):
    # without them upstream's `build_speculative_verify_target_probs` reads the largest
    # top-k from the device, one host sync per proposal
    max_top_k: Optional[int] = None
    uniform_top_k_value: Optional[int] = None
    # an injected [bs, V] logits -> q transform in place of upstream's (which needs sglang
    # and `sampling_info`): the sglang-free GPU check (`benchmarks/gpu_check.py`) and tests
    probs_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def to_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[bs, V] logits -> each request's distribution (temperature, top-k, top-p)."""
        if self.probs_fn is not None:
            return self.probs_fn(logits)
        from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs

        info = self.sampling_info
        if not (getattr(info, "need_top_k_sampling", True) or getattr(info, "need_top_p_sampling", False)):
            # what `build_speculative_verify_target_probs` computes without top-k / top-p
            return (logits.float() / info.temperatures).softmax(-1)
        return build_speculative_verify_target_probs(
            next_token_logits=logits.float(), sampling_info=self.sampling_info, draft_token_num=1,
            bs=int(logits.shape[0]), max_top_k=self.max_top_k,
            uniform_top_k_value=self.uniform_top_k_value)[:, 0].float()

    def coins(self, first: int, count: int) -> torch.Tensor:
        seeds = getattr(self.sampling_info, "sampling_seed", None)
        if seeds is None:
            return torch.rand((int(self.positions.shape[0]), count), device=self.positions.device)
        from sglang.srt.layers.sampler import murmur_hash32

        cols = torch.arange(first, first + count, device=self.positions.device)
        hashed = murmur_hash32(seeds.to(torch.uint64), self.positions.to(torch.int64), cols)
        return (hashed.to(torch.float64) + 0.5).div(2.0 ** 32).float()

    def pick(self, logits: torch.Tensor, k: int):
        """`propose_domino`'s Pick: draw proposal k from q_k and record q_k; returns no
        probabilities, so the rollout stacks none."""
        probs = self.to_probs(logits)
        token = sample_inverse_cdf(probs, self.rollout_coins[:, k])
        self.q_draft.append(probs.gather(1, token[:, None])[:, 0])
        if k == 0:
            self.q_first = probs
        else:
            self.q_rest.append(probs if self.pool_ids is None else probs.gather(1, self.pool_ids))
        return token, None

    def accept(self, drafts: torch.Tensor, target_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The q rule over this step's proposals: the Triton kernel on CUDA, elsewhere the
        reference `accept_probs` it is held equal to (tests/test_kernels.py)."""
        n, vocab = int(drafts.shape[1]), int(target_probs.shape[-1])
        uniforms = self.accept_uniforms(n)
        q_draft = torch.stack(self.q_draft, dim=1)
        q_rest = torch.stack(self.q_rest, dim=1) if self.q_rest else None
        pool = self.pool_ids
        if pool is None and q_rest is not None:
            pool = torch.arange(vocab, device=drafts.device).expand(drafts.shape[0], vocab)
        if target_probs.is_cuda:
            from ..kernels.chain_accept import accept_chain

            return accept_chain(drafts, q_draft, self.q_first, pool, q_rest, target_probs.float().contiguous(),
                                uniforms)
        from ..kernels.chain_accept import densify_q

        return accept_probs(drafts, densify_q(self.q_first, pool, q_rest, vocab), target_probs, uniforms=uniforms)

    def accept_uniforms(self, n: int) -> Uniforms:
        u = self.coins(n, n + 1)
        return Uniforms(u[:, :n], u[:, n])


@contextlib.contextmanager
def sampled_step(step: SampledStep):
    """Route this thread's eager Domino rollout through `domino_sampled_rollout` (the
    rollout hook, `rollout_hook.around_domino_rollout`, reads it)."""
    _local.step = step
    try:
        yield step
    finally:
        _local.step = None


def active_step() -> Optional[SampledStep]:
    return getattr(_local, "step", None)


def base_logits(*, draft_hidden, lm_head_weight, vocab_size, shift_label, tp_group=None,
                lm_head_num_org_padded=None, **_) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [bs, n, H], base logits [bs, n, V] over the full vocabulary) as upstream's rollout
    computes them (`domino_greedy_rollout`): the predicting slots of the block
    (`config.predicting_slots`); a vocabulary-parallel lm_head is all-gathered."""
    bs, block, hidden = draft_hidden.shape
    n = block - 1
    z = draft_hidden[:, predicting_slots(block, shift_label, n)]
    tp = int(tp_group.world_size) if tp_group is not None else 1
    local_vocab = int(lm_head_num_org_padded) if tp > 1 else int(vocab_size)
    weight = lm_head_weight[:local_vocab]
    local = F.linear(z.to(weight.dtype), weight)                         # [bs, n, local]
    if tp == 1:
        return z, local[..., :int(vocab_size)]
    flat = local.reshape(bs * n, local_vocab).T.contiguous()
    gathered = torch.empty((tp * local_vocab, bs * n), dtype=local.dtype, device=local.device)
    tp_group.all_gather_into_tensor(gathered, flat)
    return z, gathered.T[:, :int(vocab_size)].reshape(bs, n, int(vocab_size))


def candidate_pool(base: torch.Tensor, vocab: int, pool_size: int) -> Optional[torch.Tensor]:
    """Upstream's block-shared pool over base logits [bs, n, V]: the top-K ids of the max
    over proposals 1..n-1 ([bs, K], unordered); None (the whole vocabulary) when the pool
    size is 0 or covers it, or when there is only one proposal."""
    if int(base.shape[1]) > 1 and 0 < pool_size < vocab:
        return torch.topk(base[:, 1:].amax(dim=1), k=pool_size, dim=-1, sorted=False).indices
    return None


def domino_sampled_rollout(step: SampledStep, **rollout_args) -> torch.Tensor:
    """Same arguments and result ([bs, n] proposals) as upstream's `domino_greedy_rollout`;
    records the proposals and q on `step`."""
    z, base = base_logits(**rollout_args)
    vocab = int(rollout_args["vocab_size"])
    pool = candidate_pool(base, vocab, int(rollout_args["candidate_pool_size"]))
    step.pool_ids = pool
    step.rollout_coins = step.coins(0, int(z.shape[1]))
    head = UpstreamDominoHead(rollout_args["prefix_gru"], rollout_args["embed_proj"], pool, vocab)
    tokens = propose_domino(z, base, rollout_args["bonus_tokens"], rollout_args["target_embedding"], head,
                            step.pick).tokens
    if step.sync_tokens is not None:
        step.sync_tokens(tokens)
    step.tokens = tokens
    return tokens
