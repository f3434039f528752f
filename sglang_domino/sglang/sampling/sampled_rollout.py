"""The Domino rollout sampled from q in the SGLang worker (`--speculative-use-rejection-sampling`).

0.5.23 proposes Domino drafts by argmax at every temperature
(`domino_utils.domino_greedy_rollout`) and verifies sampled requests as point masses.
With the flag, each proposal k is drawn from q_k = the draft's base + correction logits
under the request's own temperature, top-k and top-p (`sampling.DraftQ`), the GRU
consuming the drawn token, through this project's one rollout
(`sglang_domino.rollout.propose_domino`). `q_rollout` is that step in fixed shapes and
without a host sync: the draft graph holds it (`q_sampler.QRuleDraftSampler`), and a step
the graph does not serve calls it eagerly (`domino_sampled_rollout`, from the rollout
hook). `DominoDFlashWorker._accept_block` then accepts with min(1, p/q)
(`SampledStep.accept`).

With a candidate pool (0 < K < V, upstream's default 2048), proposals 1..n-1 are drawn
over the pool, as upstream's greedy pool rollout takes its argmax there, and their q is
kept in pool coordinates [bs, n-1, K], the layout of `sglang_domino.kernels.chain_accept`;
q_0 is dense [bs, V]. Under tensor parallelism a rank then gathers the first proposal's
logits and the ranks' pool candidates, not the block's logits [bs, n, V]
(`rollout_inputs.sharded_rollout_inputs`).

Coins: a request with `sampling_seed` (0.5.23 fills it under
`--enable-deterministic-inference`) gets coins hashed from (seed, committed length,
column) with upstream's `murmur_hash32`, so it repeats; others draw from torch's RNG.
Columns 0..n-1 are the proposals' coins, n..2n the acceptance's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ...accept import Uniforms, accept_probs, sample_inverse_cdf
from ...rollout import propose_domino
from ...sampling import Q_TOP_CAP, DraftQ
from .rollout_inputs import rollout_inputs

_local = threading.local()


class QHints(NamedTuple):
    """What the host knows of a batch's sampling, which lets `DraftQ` skip work (same q):
    the draft graph knows nothing (the defaults); an eager step knows 0.5.23's flags and
    the batch's largest top-k (`DFlashDraftInputV2.max_top_k`)."""
    cap: int = Q_TOP_CAP
    top_k_used: bool = True
    top_p_used: bool = True

    @classmethod
    def of(cls, sampling_info, max_top_k: Optional[int] = None) -> "QHints":
        top_k_used = bool(getattr(sampling_info, "need_top_k_sampling", True))
        top_p_used = bool(getattr(sampling_info, "need_top_p_sampling", True))
        cap = min(Q_TOP_CAP, int(max_top_k)) if top_k_used and max_top_k else Q_TOP_CAP
        return cls(cap, top_k_used, top_p_used)


class DraftParams(NamedTuple):
    """Each row's sampling parameters for q and its coins: device tensors [rows]."""
    temperature: torch.Tensor   # float32
    top_k: torch.Tensor         # int64; <= 0: no top-k
    top_p: torch.Tensor         # float32
    greedy: torch.Tensor        # bool: q a point mass on the argmax
    seed: torch.Tensor          # int64, read where `seeded`
    seeded: torch.Tensor        # bool
    position: torch.Tensor      # int64, the committed length: the seeded coins' position key

    @classmethod
    def empty(cls, rows: int, device) -> "DraftParams":
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        return cls(torch.ones(rows, **f32), torch.zeros(rows, **i64), torch.ones(rows, **f32),
                   torch.ones(rows, dtype=torch.bool, device=device), torch.zeros(rows, **i64),
                   torch.zeros(rows, dtype=torch.bool, device=device), torch.zeros(rows, **i64))

    @classmethod
    def of(cls, sampling_info, positions: torch.Tensor) -> "DraftParams":
        bs = int(positions.shape[0])
        return cls.empty(bs, positions.device).stage(sampling_info, positions, bs)

    def rows(self, bs: int) -> "DraftParams":
        return DraftParams(*(t[:bs] for t in self))

    def stage(self, sampling_info, positions: torch.Tensor, bs: int) -> "DraftParams":
        """Writes the batch's parameters into rows [:bs] (device copies only: a graph
        that reads these buffers is replayed after) and returns those rows. 0.5.23 encodes
        a greedy request as top-k 1 (`resolve_greedy_mask` reads it the same way)."""
        rows = self.rows(bs)
        rows.position.copy_(positions[:bs])
        if sampling_info is None:
            rows.greedy.fill_(True)
            rows.seeded.fill_(False)
            return rows
        top_ks = sampling_info.top_ks.view(-1)[:bs]
        rows.temperature.copy_(sampling_info.temperatures.view(-1)[:bs])
        rows.top_k.copy_(top_ks)
        rows.top_p.copy_(sampling_info.top_ps.view(-1)[:bs])
        torch.le(top_ks, 1, out=rows.greedy)
        seeds = getattr(sampling_info, "sampling_seed", None)
        rows.seeded.fill_(seeds is not None)
        if seeds is not None:
            rows.seed.copy_(seeds.view(-1)[:bs])
        return rows


def draft_coins(params: DraftParams, uniforms: torch.Tensor, first: int, hashed: bool = True) -> torch.Tensor:
    """Coins [bs, count] for columns first..first+count-1: seeded rows hash (seed,
    position, column) with upstream's `murmur_hash32`, the others take `uniforms`.
    `hashed=False` skips the hash (no row is seeded; the sglang-free GPU check)."""
    if not hashed:
        return uniforms
    from sglang.srt.layers.sampler import murmur_hash32

    cols = torch.arange(first, first + int(uniforms.shape[1]), device=uniforms.device)
    hashed_ints = murmur_hash32(params.seed.to(torch.uint64), params.position.to(torch.int64), cols)
    coins = (hashed_ints.to(torch.float64) + 0.5).div(2.0 ** 32).float()
    return torch.where(params.seeded[:, None], coins, uniforms)


class UpstreamDominoHead:
    """`propose_domino`'s draft interface over 0.5.23's Domino modules (`prefix_gru`,
    `embed_proj`, `models/dflash.py`), the same math as `sglang_domino.model.DraftModel`.
    With a candidate pool [bs, K] the correction is computed on the pool only (the pool's
    rows of the bias-free output layer), as upstream's greedy pool rollout does.

    The GRU is held as its weights and run one cell step at a time, the prefix included
    (from a zero state, as `nn.GRU` starts): the same recurrence, and one `torch.compile`
    can trace (it refuses `nn.GRU` modules; `sglang_domino.sglang.step.compiled_rollout`).

    `linear` (`(x, weight, bias) -> x W^T + b`), where given, multiplies the correction's
    projections and the GRU's gates instead of the modules and `gru_cell` (the compiled
    CPU rollout's C++ op, `compiled_rollout`); the GRU's update is then `gru_update`."""

    linear = None

    def __init__(self, prefix_gru, embed_proj):
        self.proj = embed_proj
        self.size = int(prefix_gru.hidden_size)
        self.w_ih, self.w_hh = prefix_gru.weight_ih_l0, prefix_gru.weight_hh_l0
        self.b_ih, self.b_hh = getattr(prefix_gru, "bias_ih_l0", None), getattr(prefix_gru, "bias_hh_l0", None)
        self.pool_weight = None

    def pooled(self, pool_ids: Optional[torch.Tensor]) -> "UpstreamDominoHead":
        """This head with its correction on the candidate pool [bs, K] (itself without one)."""
        if pool_ids is None:
            return self
        head = copy.copy(self)
        head.pool_weight = F.embedding(pool_ids, self.proj[2].weight)
        return head

    def project(self, x: torch.Tensor, module) -> torch.Tensor:
        """`module(x)`, through `linear` where given."""
        return module(x) if self.linear is None else self.linear(x, module.weight, module.bias)

    def correction(self, z: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        hidden = self.proj[1](self.project(torch.cat((z, state.to(z.dtype)), dim=-1), self.proj[0]))
        if self.pool_weight is None:
            return self.project(hidden, self.proj[2])
        return torch.bmm(self.pool_weight, hidden.unsqueeze(-1)).squeeze(-1)

    def run_gru(self, embeds: torch.Tensor) -> torch.Tensor:
        state = embeds.new_zeros((embeds.shape[0], self.size), dtype=self.w_ih.dtype)
        states = []
        for t in range(int(embeds.shape[1])):
            state = self.gru_step(embeds[:, t], state)
            states.append(state)
        return torch.stack(states, dim=1)

    def gru_step(self, embed: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        # one feedback token: the GRU's cell op on its own weights, as upstream's
        # `_domino_gru_cell` (bias-free Domino GRU: the biases are None)
        if self.linear is None:
            return torch.ops.aten.gru_cell.default(embed.to(self.w_ih.dtype), state, self.w_ih, self.w_hh, self.b_ih,
                                                   self.b_hh)
        return gru_update(self.linear(embed.to(self.w_ih.dtype), self.w_ih, self.b_ih),
                          self.linear(state, self.w_hh, self.b_hh), state)


def gru_update(input_gates: torch.Tensor, hidden_gates: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """The GRU cell's state update from its gates' products (`x W_ih^T + b_ih`,
    `h W_hh^T + b_hh`, each [bs, 3G] in the reset, update, new order), as `gru_cell`
    computes it (held equal in tests/sglang/test_cpu_rollout.py)."""
    x_r, x_z, x_n = input_gates.chunk(3, dim=-1)
    h_r, h_z, h_n = hidden_gates.chunk(3, dim=-1)
    reset = torch.sigmoid(x_r + h_r)
    update = torch.sigmoid(x_z + h_z)
    new = torch.tanh(x_n + reset * h_n)
    return new + update * (state - new)


@dataclass
class QDraft:
    """One step's proposals and their q in the chain-accept kernel's compact layout."""
    tokens: torch.Tensor                  # [bs, n] int64
    q_draft: torch.Tensor                 # [bs, n]: q_k at the drawn token
    q_first: torch.Tensor                 # [bs, V]
    pool_ids: Optional[torch.Tensor]      # [bs, K]; None: later proposals over the vocabulary
    q_rest: Optional[torch.Tensor]        # [bs, n-1, K or V]; None when n == 1

    def narrowed(self, proposals: int) -> "QDraft":
        """The first `proposals` proposals (a step narrower than the block)."""
        n = int(proposals)
        rest = self.q_rest[:, : n - 1] if self.q_rest is not None and n > 1 else None
        return QDraft(self.tokens[:, :n], self.q_draft[:, :n], self.q_first, self.pool_ids if rest is not None
                      else None, rest)


class QPick:
    """`propose_domino`'s Pick under `DraftParams`: proposal k drawn from q (`DraftQ`, one
    per logits width: the vocabulary, the pool) with coin k, mapped through the pool for
    k >= 1. A greedy row's q is on its largest logits; its coin is 0, which draws the first
    of them: the argmax, as `torch.argmax` and 0.5.23's greedy rollout pick it."""

    def __init__(self, params: DraftParams, coins: torch.Tensor, pool_ids: Optional[torch.Tensor],
                 hints: QHints = QHints()):
        self.params, self.pool_ids, self.hints = params, pool_ids, hints
        self.coins = coins.masked_fill(params.greedy[:, None], 0.0)
        self.transforms: dict = {}
        self.q_draft: list = []
        self.q: list = []

    def transform(self, width: int) -> DraftQ:
        if width not in self.transforms:
            p, h = self.params, self.hints
            self.transforms[width] = DraftQ(p.temperature, p.top_k, p.top_p, p.greedy, width, h.cap, h.top_k_used,
                                            h.top_p_used)
        return self.transforms[width]

    def __call__(self, logits: torch.Tensor, k: int):
        probs = self.transform(int(logits.shape[-1]))(logits)
        index = sample_inverse_cdf(probs, self.coins[:, k])
        self.q_draft.append(probs.gather(1, index[:, None])[:, 0])
        self.q.append(probs)
        if k > 0 and self.pool_ids is not None:
            return self.pool_ids.gather(1, index[:, None])[:, 0], None
        return index, None

    def draft(self, tokens: torch.Tensor) -> QDraft:
        rest = torch.stack(self.q[1:], dim=1) if len(self.q) > 1 else None
        return QDraft(tokens, torch.stack(self.q_draft, dim=1), self.q[0], self.pool_ids if rest is not None else None,
                      rest)


def q_rollout(params: DraftParams, coins: torch.Tensor, *, draft_hidden, bonus_tokens, target_embedding,
              prefix_gru, embed_proj, vocab_size, candidate_pool_size, hints: QHints = QHints(),
              **base_args) -> QDraft:
    """The q rule's rollout over a block's draft hidden states [bs, B, H] (upstream's
    `domino_greedy_rollout` arguments): proposals drawn with `coins` [bs, n] under
    `params`, and their q. Fixed shapes, no host sync (a CUDA graph holds it)."""
    z, first, rest, pool = rollout_inputs(draft_hidden=draft_hidden, vocab_size=vocab_size,
                                          candidate_pool_size=candidate_pool_size, **base_args)
    pick = QPick(params, coins, pool, hints)
    head = UpstreamDominoHead(prefix_gru, embed_proj).pooled(pool)
    tokens = propose_domino(z, (first, rest), bonus_tokens, target_embedding, head, pick).tokens
    return pick.draft(tokens)


@dataclass
class SampledStep:
    """One decode step with sampled requests: what its proposals are drawn under, and the
    proposals with their q once drawn (by the eager rollout, or read from the draft
    graph's sampler by the worker)."""
    sampling_info: object
    positions: torch.Tensor                 # [bs] committed lengths: the coins' position key
    sync_tokens: object = None              # every TP rank proposes rank 0's tokens
    max_top_k: Optional[int] = None         # the batch's largest top-k, known on the host
    draft: Optional[QDraft] = None

    @functools.cached_property
    def params(self) -> DraftParams:
        return DraftParams.of(self.sampling_info, self.positions)

    def coins(self, first: int, count: int) -> torch.Tensor:
        uniforms = torch.rand((int(self.positions.shape[0]), count), device=self.positions.device)
        seeded = getattr(self.sampling_info, "sampling_seed", None) is not None
        return draft_coins(self.params, uniforms, first, hashed=seeded)

    def accept(self, drafts: torch.Tensor, target_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The q rule over this step's proposals: the Triton kernel on CUDA, elsewhere the
        reference `accept_probs` it is held equal to (tests/test_kernels.py)."""
        d = self.draft
        n, vocab = int(drafts.shape[1]), int(target_probs.shape[-1])
        uniforms = self.accept_uniforms(n)
        pool = d.pool_ids
        if pool is None and d.q_rest is not None:
            pool = torch.arange(vocab, device=drafts.device).expand(drafts.shape[0], vocab)
        if target_probs.is_cuda:
            from ...kernels.chain_accept import accept_chain

            return accept_chain(drafts, d.q_draft, d.q_first, pool, d.q_rest, target_probs.float().contiguous(),
                                uniforms)
        from ...kernels.chain_accept import densify_q

        return accept_probs(drafts, densify_q(d.q_first, pool, d.q_rest, vocab), target_probs, uniforms=uniforms)

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


def domino_sampled_rollout(step: SampledStep, **rollout_args) -> torch.Tensor:
    """Same arguments and result ([bs, n] proposals) as upstream's `domino_greedy_rollout`,
    run eagerly; records the proposals and q on `step`."""
    n = int(rollout_args["draft_hidden"].shape[1]) - 1
    args = {k: v for k, v in rollout_args.items() if k != "in_cuda_graph"}
    draft = q_rollout(step.params, step.coins(0, n), hints=QHints.of(step.sampling_info, step.max_top_k), **args)
    if step.sync_tokens is not None:
        step.sync_tokens(draft.tokens)
    step.draft = draft
    return draft.tokens
