"""`DominoDFlashWorker`: sglang 0.5.23's `DFlashWorkerV2` with this project's deltas.

Only overrides live here (marked `@override`); everything else, including the ~680-line
`forward_batch_generation` body, the draft block, the greedy Domino rollout and the KV
bookkeeping, is upstream's, run unchanged:
  * `__init__`: the draft checked against the target before anything is built; the
    worker's groups installed before and after 0.5.23's constructor (`hooks.install_moment`,
    the predicates at the end of this file); the draft run on its own block where the verify
    window differs (`draft_block.DraftBlockRunner`); the verify-width policy.
  * `forward_batch_generation`: each decode step at the width the policy chooses
    (`width_switch.WidthSwitch`), width 1 without the draft side (`decode_step`: the target's
    decode step on CPU, its one-token verify on CUDA); with the q rule, sampled steps propose
    from q.
  * `on_verify_complete_cpu`: the adaptive policy's acceptance counts; the proposals
    really verified, for the accept rate in the log (`metrics`).
  * `_append_target_hidden_to_draft_kv_by_loc`, `clear_cache_pool`: an adaptive width-1
    step's draft context kept and written when the draft next needs it (`draft_context`);
    kept rows dropped with the pools.
  * `_accept_block` and the q rule's step entry: in the mixin `exact_accept.ExactAccept`
    (penalised blocks, sampled requests verified exactly where 0.5.23 has no kernel, the q
    rule's min(1, p/q)).
  * `init_cuda_graphs`, `_maybe_build_draft_sampler`:
    the draft graph and its in-graph sampler at the draft block (b8 reads its first
    window - 1 proposals, `draft_tail`); with an adaptive width, the target's verify graphs
    at every width (`verify_graphs.VerifyGraphs`); the step's Triton kernels compiled at
    every width (`warmup`).
"""

from __future__ import annotations

import collections
import contextlib
import logging

import torch
from sglang.srt.runtime_context import get_memory, get_schedule, get_spec
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, SpecTpSyncSite
from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info
from typing_extensions import override

from ..adaptive import AdaptiveWidth, FixedWidth
from ..adaptive import draft_tail, request_accept
from ..seam import hooks
from ..sampling import penalty_state, q_sampler
from . import warmup
from .. import settings as scheduler_settings
from ..checks import check_draft_against_target, read_draft_config, read_target_config
from ..cpu import dflash as cpu_dflash
from ..adaptive.decode_step import DecodeStep
from ..adaptive.draft_context import DeferredContext
from .draft_block import DraftBlockRunner, reserve_draft_block
from .exact_accept import ExactAccept
from .first_verify_log import FirstVerifyLog
from ..adaptive.verify_graphs import VerifyGraphs
from ..adaptive.width_switch import StepTimer, WidthSwitch, broadcast_width

logger = logging.getLogger(__name__)


class DominoDFlashWorker(ExactAccept, DFlashWorkerV2):
    """Returned for `--speculative-algorithm DFLASH` by the plugin's `create_worker` hook."""

    @override
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        self._on_cpu = torch.device(target_worker.device).type == "cpu"
        draft_cfg = read_draft_config(server_args.speculative_draft_model_path,
                                      server_args.speculative_draft_model_revision)
        target_cfg = read_target_config(server_args.model_path, getattr(server_args, "revision", None))
        if draft_cfg is not None and target_cfg is not None:
            check_draft_against_target(
                draft_cfg, target_cfg,
                target_vocab_size=int(target_worker.model_runner.model_config.vocab_size))
        self.domino_draft_config = draft_cfg
        # checkpoint compatibility; on CPU, the DFLASH runtime (the manifest's predicates)
        groups = hooks.install_moment(hooks.Moment.WORKER_BEFORE, self)

        if self._on_cpu:
            with cpu_dflash.domino_device_gate_lifted():
                super().__init__(server_args, gpu_id, nccl_port, target_worker)
            cpu_dflash.disable_triton_qk_norm_rope(self.draft_model)
        else:
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if self.draft_model_runner.dtype != torch.bfloat16:
            cpu_dflash.keep_input_embeds_dtype(self.draft_model_runner)

        settings = scheduler_settings.current()
        adaptive = settings.adaptive
        if adaptive is not None and (self.selector is not None or self.lilicorr is not None):
            # resolution refuses these drafts where it can read their config
            raise ValueError("--speculative-adaptive with DFLASH serves DFlash and Domino drafts; this draft has a "
                             "candidate selector or LiLiCorr head, which reads the whole block per request: "
                             "drop --speculative-adaptive")
        self.draft_block = self._resolve_draft_block(settings.draft_block, adaptive is not None)
        self.width_policy = (AdaptiveWidth(adaptive.for_window(int(self.block_size))) if adaptive is not None
                             else FixedWidth(int(self.block_size)))
        self._widths = WidthSwitch(self)
        self._clock = StepTimer.for_device(self.device, overlap=not get_schedule().disable_overlap_schedule)
        # (reqs, rids, width, timing events) of adaptive steps whose results are not processed yet
        self._in_flight = collections.deque()
        # proposals verified by adaptive steps since the scheduler last logged its accept rate
        self.drafts_proposed = 0
        # the draft's context write compiled on CPU (`cpu.compiled_context`), where the
        # draft's layers run compiled and the draft is not LiLiCorr; None: upstream's write
        compiled = getattr(self.draft_model.forward, "context", None)
        self._compiled_context = compiled if getattr(self, "lilicorr", None) is None else None
        self._context = self._deferred_context()
        self._decode_step = self._width_one_decode_step()
        # argument resolution refuses the flag for drafts that are not Domino
        self.q_rule = bool(get_spec().speculative_use_rejection_sampling) and self._is_domino
        # the q rule's rollout in the draft graph (`q_sampler`), built with the graphs
        self._q_sampler = None
        logger.info(
            "sglang-domino DFLASH worker: device=%s, draft block=%s, verify width=%s, domino=%s, "
            "sampled verify=%s", self.device, self.draft_block,
            f"adaptive {self.width_policy.widths}" if adaptive is not None else self.block_size, self._is_domino,
            "q rule (draft sampled from q, min(1, p/q))" if self.q_rule else "point mass")
        # every penalty exact at every position of the block (`penalty_state`)
        self._penalties = penalty_state.PenaltyPool(
            rows=lambda: self.model_runner.req_to_token_pool.req_to_token.shape[0],
            vocab=int(self.model_runner.model_config.vocab_size), device=self.device)
        self._step_penalties = None
        # penalties; b8's KV reservation, adaptive metrics and the Domino rollout's hook where
        # they apply (the manifest's predicates)
        groups += hooks.install_moment(hooks.Moment.WORKER_AFTER, self)
        logger.info("sglang-domino worker groups: %s", ", ".join(groups))
        FirstVerifyLog(self).install()

    def _deferred_context(self):
        """Width-1 steps' draft context written when the draft next needs it
        (`draft_context`), where width 1 is among the adaptive widths. Not with a compact
        (sliding-window) draft cache, whose window is rebuilt from the committed target
        state every step, nor with the hierarchical cache, which may back a finished
        request's slots up to the host before the next forward."""
        if 1 not in self.width_policy.widths or not self.width_policy.cfg.defer_context:
            return None
        if self.use_compact_draft_cache or bool(getattr(get_memory(), "enable_hierarchical_cache", False)):
            logger.info("sglang-domino adaptive verify: width-1 steps write the draft's context every step "
                        "(compact draft cache or hierarchical cache)")
            return None
        return DeferredContext(self._write_context)

    def _width_one_decode_step(self):
        """Width-1 steps without the draft side (`decode_step`: the target's decode step on
        CPU, its one-token verify on CUDA) where width 1 is among the adaptive widths; None:
        upstream's step at one token (the start-up log says why)."""
        if 1 not in self.width_policy.widths or not self.width_policy.cfg.decode_step:
            return None
        reason = DecodeStep.why_not(self)
        if reason is not None:
            logger.info("sglang-domino adaptive verify: width-1 steps verify one token (%s)", reason)
            return None
        step = DecodeStep(self)
        if not step.on_device:   # on a device DecodeStep logs what its step runs
            logger.info("sglang-domino adaptive verify: width-1 steps run the target's decode path")
        return step

    def _resolve_draft_block(self, published, adaptive: bool) -> int:
        """`self.block_size` is the verify window, what the scheduler accounts in
        (`speculative_num_draft_tokens`). The draft block differs from it in two modes set
        up by argument resolution (b8: block > window; the Transformers window: window =
        block + 1 for a `shift_label` Domino draft), and with an adaptive width the draft
        runs on its block at every width below it (`draft_block.DraftBlockRunner`).
        Upstream proposes from a block as wide as the window."""
        window = int(self.block_size)
        draft_block = int(published) if published else window  # refused with a compact draft cache
        if draft_block == window:
            if adaptive:
                DraftBlockRunner(self, draft_block).install()
            return window
        if draft_block < window and not (self._is_domino and bool(self.draft_model.shift_label)
                                         and window == draft_block + 1):
            raise ValueError(
                f"a verify window above the draft block (--speculative-num-draft-tokens {window}) needs a "
                f"shift_label Domino draft and a window of draft block + 1; "
                f"got draft block {draft_block}, window {window}, domino={self._is_domino}")
        self.draft_model.set_block_size(draft_block)
        # The draft batch's spec info carries its width: the draft attention backend plans
        # `draft_token_num` query rows per request, and a graph replays only at the width
        # it was captured at.
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=draft_block,
                                                                 device=self.device)
        DraftBlockRunner(self, draft_block).install()
        if draft_block > window:
            reserve_draft_block(draft_block - window)
        return draft_block

    @override
    def forward_batch_generation(self, batch, *args, **kwargs):
        """Each decode step at the width `self.width_policy` chooses for the batch
        (`width_switch`); with a fixed width, upstream's step as built. A step with a
        sampling penalty penalises each row of its block with the output before it
        (`penalty_state`)."""
        extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        decode = not (extend or batch.forward_mode.is_idle())
        if extend:
            self._penalties.forget(batch.reqs)
        step = self._penalties.step(batch) if decode else None
        self._step_penalties = step
        try:
            with penalty_state.active(step):
                return self._forward_step(batch, decode, *args, **kwargs)
        finally:
            self._step_penalties = None

    def _forward_step(self, batch, decode: bool, *args, **kwargs):
        if not decode:
            self._clock.break_chain()
            if self._context is not None:
                self._context.before_step(None)
        if not decode or isinstance(self.width_policy, FixedWidth):
            return self._forward_with_q_rollout(batch, *args, **kwargs)
        reqs = list(batch.reqs)
        rids = [req.rid for req in reqs]
        width = self._choose_width(rids)
        context = self._context
        if context is not None:
            context.before_step(width)
        with self._widths.at(width), self._clock.around_launch() as marks, self._keeping(width == 1):
            if width == 1 and self._decode_step is not None and DecodeStep.serves(batch):
                result = self._decode_step.decode(batch, on_publish=kwargs.get("on_publish"))
            else:
                result = self._forward_with_q_rollout(batch, *args, **kwargs)
        self._in_flight.append((reqs, rids, width, marks, self.width_policy.last_expected))
        return result

    @contextlib.contextmanager
    def _keeping(self, on: bool):
        """Inside a width-1 step, upstream's draft-context append keeps its rows
        (`draft_context.DeferredContext`)."""
        context = self._context
        if not on or context is None:
            yield
            return
        context.keeping = True
        try:
            yield
        finally:
            context.keeping = False

    @override
    def _append_target_hidden_to_draft_kv_by_loc(self, **kwargs) -> None:
        context = getattr(self, "_context", None)
        if context is not None and context.keeping:
            return context.keep(**kwargs)
        return self._write_context(**kwargs)

    def _write_context(self, **kwargs) -> None:
        """The draft's context written now: by the draft's compiled graph where its layers
        run compiled on CPU (`cpu.compiled_context`), otherwise by upstream."""
        compiled = getattr(self, "_compiled_context", None)   # unset while upstream's __init__ runs
        if compiled is not None:
            from ..cpu.compiled import context as compiled_context

            return compiled_context.write(compiled, self.draft_model_runner.token_to_kv_pool, **kwargs)
        return super()._append_target_hidden_to_draft_kv_by_loc(**kwargs)

    @override
    def clear_cache_pool(self):
        if getattr(self, "_context", None) is not None:
            self._context.drop()
        return super().clear_cache_pool()

    @override
    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        """The scheduler's hook once a decode step's accept counts are on the host (decode
        results only, in step order): the adaptive policy learns from it without a device
        sync in the step."""
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        if not self._in_flight:
            return
        reqs, rids, width, marks, expected = self._in_flight.popleft()
        self.drafts_proposed += len(num_correct_drafts_per_req) * (width - 1)
        request_accept.count_proposals(reqs, width)   # each request's accept rate in meta_info
        seconds = self._clock.elapsed(marks)
        if seconds is not None:
            self.width_policy.observe_cost(len(rids), width, seconds)
        if len(rids) == len(num_correct_drafts_per_req):
            # a width-1 step proposes nothing: no acceptance to learn from, only its age
            self.width_policy.observe_step(rids, width, num_correct_drafts_per_req, expected)

    def _choose_width(self, rids) -> int:
        policy = self.width_policy
        lap = self._clock.lap()
        if lap is not None:
            policy.observe_cost(*lap)
        mine = policy.choose(rids)
        width = broadcast_width(mine)
        if width != mine:  # another TP rank's timings chose; count what runs
            policy.histogram[mine] -= 1
            policy.histogram[width] += 1
        self._clock.label(len(rids), width)
        steps = sum(policy.histogram.values())
        if policy.histogram.get(width, 0) == 1:
            logger.info("sglang-domino adaptive verify: width %d first chosen at batch size %d", width, len(rids))
        if steps % policy.cfg.log_every_steps == 0:
            bs = len(rids)
            scores = ", ".join(f"{w}: {v:.1f}" for w, v in sorted(policy.last_scores.items(), reverse=True))
            costs = ", ".join(f"{w}: {1000 * c:.2f}" for w in policy.widths
                              if (c := policy.costs.predict(bs, w)) is not None)
            logger.info("sglang-domino adaptive verify: %s; at batch size %d, step ms by width {%s}, "
                        "expected tokens/s by width {%s}", policy.describe(), bs, costs, scores)
        return width

    @override
    def init_cuda_graphs(self):
        # The draft runner's graphs are captured `speculative_num_draft_tokens` wide, the
        # verify window; the draft batch is draft-block wide. Capture it under a scoped
        # override of that leaf, the way upstream captures EAGLE's adaptive widths.
        if int(self.draft_block) == int(self.block_size):
            super().init_cuda_graphs()
        else:
            with get_spec().override(speculative_num_draft_tokens=int(self.draft_block)):
                super().init_cuda_graphs()
        # The target's verify graphs at every adaptive width (its home graphs were
        # captured by the target worker, which the scheduler initialises first).
        if len(self.width_policy.widths) > 1:
            self._widths.graphs = VerifyGraphs.build(
                self._target_worker.model_runner, int(self.block_size), self.width_policy.widths,
                spec_override=lambda w: get_spec().override(speculative_num_draft_tokens=int(w)),
                free_memory=None if self._on_cpu else self._free_memory_gb)
        # the step's Triton kernels at every width, before the first request
        if not self._on_cpu:
            warmup.warm_step_kernels(self, self.width_policy.widths,
                                     q_rule=self.q_rule and torch.device(self.device).type == "cuda")
        elif self._is_domino:
            # the opt-in compiled rollout's graphs at every block it proposes from
            warmup.warm_cpu_rollout(self, [*self.width_policy.widths, int(self.draft_block)])

    def _free_memory_gb(self) -> float:
        from sglang.srt.utils.common import get_available_gpu_memory

        return float(get_available_gpu_memory(self.device, self.gpu_id))

    @override
    def _maybe_build_draft_sampler(self):
        # The in-graph sampler proposes from the draft graph's block, built at the draft
        # block. b8 (block wider than the window): read at the window (`draft_tail`: the
        # block's first window - 1 proposals). The Transformers window (block + 1 verified):
        # the rollout over the block padded to the window (`draft_tail.WindowProposals`).
        # With the q rule, the q rule's rollout takes the greedy Domino sampler's place
        # (`q_sampler`): one graph serves sampled and greedy rows.
        window, block = int(self.block_size), int(getattr(self, "draft_block", self.block_size))
        self.block_size = block
        try:
            sampler = super()._maybe_build_draft_sampler()
        finally:
            self.block_size = window
        if self.q_rule and sampler is not None:
            self._q_sampler = q_sampler.build(sampler, width=max(block, window))
            if self._q_sampler is not None:
                sampler = self._q_sampler
                if self._q_sampler.tp_size > 1:
                    q_sampler.BroadcastProposals(
                        self, sampler, lambda t: self._tp_sync.sync(SpecTpSyncSite.DFLASH_SELECTOR, t)).install()
        if block < window:
            return draft_tail.widened(sampler, window)
        return sampler if block == window else draft_tail.at_width(sampler, window)


__all__ = ["DominoDFlashWorker", "adaptive_width", "domino_draft", "draft_block_wider", "runs_on_cpu"]


# -- the predicates of the worker's install groups (`seam/manifest.py`), of the worker built --
def runs_on_cpu(worker) -> bool:
    return worker._on_cpu


def domino_draft(worker) -> bool:
    return bool(worker._is_domino)


def draft_block_wider(worker) -> bool:
    return int(worker.draft_block) > int(worker.block_size)


def adaptive_width(worker) -> bool:
    return isinstance(worker.width_policy, AdaptiveWidth)
