"""`DominoDFlashWorker`: sglang 0.5.23's `DFlashWorkerV2` with this project's deltas.

Overrides (everything else, including the body of the ~680-line
`forward_batch_generation`, the draft block, the greedy Domino rollout and the KV
bookkeeping, is upstream's):
  * `__init__`: checks the draft through `sglang_domino.config.DraftConfig` against the
    target before anything is built; registers the `DominoDraftModel` architecture;
    on CPU installs `cpu_runtime` and builds the upstream worker with the Domino device
    gate lifted, then switches the draft's Triton qk-norm/rope off; keeps the draft's
    `input_embeds` in the runner dtype; runs the draft on its own block when it differs
    from the verify window (b8, the Transformers window): see `_resolve_draft_block`.
  * `init_cuda_graphs`, `_maybe_build_draft_sampler`: the draft graph captured, and the
    eager rollout used, for that draft block.
  * `forward_batch_generation` (a wrapper): each decode step at the verify width the
    worker's `width_policy` chooses (`sglang_domino.verify_width`: fixed, or adaptive
    with `--speculative-adaptive`; the step's width-dependent state swapped by
    `step_width.WidthSwitch`); `on_verify_complete_cpu`: the adaptive policy's
    acceptance counts.
  * `_accept_block` (and the wrapper): sampled requests verified exactly where 0.5.23
    has no kernel (point-mass rule), and with `--speculative-use-rejection-sampling`
    proposed from the Domino draft's q and accepted with min(1, p/q) (`sampled_draft`).
  * hooks installed from `__init__` (scheduler only): `parse_dflash_draft_config` reads
    the `causal_v5` alias as `domino`; `DFlashDraftModel.load_weights` sees names through
    `sglang_domino.checkpoint.normalize_keys` (legacy `logit_head.*` keys); with b8, the
    decode KV reservation (`dflash_info_v2.page_aligned_decode_alloc_lens`) covers the
    draft block.
"""

from __future__ import annotations

import collections
import logging
import os
from types import SimpleNamespace

import torch
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.dflash_worker_v2 import (
    SIMULATE_ACC_LEN,
    DFlashWorkerV2,
    SpecTpSyncSite,
    _commit_accept,
    _is_all_greedy,
    is_dflash_sampling_verify_available,
)
from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

from ..config import DOMINO_PROJECTORS
from . import DRAFT_BLOCK_ENV, HF_WINDOW_ENV, apply_hooks_once
from . import cpu_runtime
from ..verify_width import AdaptiveWidth, FixedWidth
from . import sampled_draft
from .checks import check_draft_against_target, read_draft_config, read_target_config
from .sampled_draft import SampledStep, active_step, sampled_step
from .step_width import StepClock, WidthSwitch, adaptive_config, broadcast_width

logger = logging.getLogger(__name__)


def _register_domino_architecture() -> None:
    """SpecForge exports name the architecture `DominoDraftModel`; 0.5.23's `EntryClass`
    (`srt/models/dflash.py:1317`) lacks it. Same model class as `DFlashDraftModel`."""
    from sglang.srt.models.registry import ModelRegistry

    if "DominoDraftModel" not in ModelRegistry.models:
        from sglang.srt.models.dflash import DFlashDraftModel

        ModelRegistry.models["DominoDraftModel"] = DFlashDraftModel


PARSE_DRAFT_CONFIG = "sglang.srt.speculative.dflash_utils.parse_dflash_draft_config"
LOAD_DRAFT_WEIGHTS = "sglang.srt.models.dflash.DFlashDraftModel.load_weights"


def _around_parse_dflash_draft_config(original, *args, draft_hf_config=None, **kwargs):
    """0.5.23 recognises the Domino projector only as `projector_type == "domino"`
    (`dflash_utils.py:727-734`, `models/dflash.py:780`, `:923`, `:987`); older exports
    write the alias `causal_v5`, accepted by `DraftConfig` (DOMINO_PROJECTORS). Rewrite
    the alias on the config object, then parse as upstream."""
    if draft_hf_config is not None:
        section = getattr(draft_hf_config, "dflash_config", None)
        if isinstance(draft_hf_config, dict):
            section = draft_hf_config.get("dflash_config")
        if isinstance(section, dict) and section.get("projector_type") in DOMINO_PROJECTORS:
            section["projector_type"] = "domino"
        top = (draft_hf_config.get("projector_type") if isinstance(draft_hf_config, dict)
               else getattr(draft_hf_config, "projector_type", None))
        if top in DOMINO_PROJECTORS and top != "domino":
            if isinstance(draft_hf_config, dict):
                draft_hf_config["projector_type"] = "domino"
            else:
                draft_hf_config.projector_type = "domino"
    return original(*args, draft_hf_config=draft_hf_config, **kwargs)


def _around_load_weights(original, self, weights, *args, **kwargs):
    """`DFlashDraftModel.load_weights` (`models/dflash.py:886`) silently ignores unknown
    names, so legacy `logit_head.prefix_gru.*` / `logit_head.embed_proj.*` keys end in
    "missing required projector weights". Feed it names through the project's one key
    normalisation, `sglang_domino.checkpoint.normalize_keys`."""
    from ..checkpoint import normalize_keys

    def renamed():
        for name, tensor in weights:
            yield from normalize_keys({name: tensor}).items()

    return original(self, renamed(), *args, **kwargs)


_around_parse_dflash_draft_config._sglang_domino = True
_around_load_weights._sglang_domino = True


def install_checkpoint_compat() -> None:
    if apply_hooks_once("checkpoint compat", [(PARSE_DRAFT_CONFIG, _around_parse_dflash_draft_config, "AROUND"),
                                              (LOAD_DRAFT_WEIGHTS, _around_load_weights, "AROUND")]):
        _register_domino_architecture()


class DominoDFlashWorker(DFlashWorkerV2):
    """Returned for `--speculative-algorithm DFLASH` by the plugin's `create_worker` hook."""

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
        install_checkpoint_compat()

        if self._on_cpu:
            cpu_runtime.install()
            with cpu_runtime.domino_device_gate_lifted():
                super().__init__(server_args, gpu_id, nccl_port, target_worker)
            cpu_runtime.disable_triton_qk_norm_rope(self.draft_model)
        else:
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if self.draft_model_runner.dtype != torch.bfloat16:
            cpu_runtime.keep_input_embeds_dtype(self.draft_model_runner)

        adaptive = adaptive_config()
        self.draft_block = self._resolve_draft_block(adaptive is not None)
        self.width_policy = (AdaptiveWidth(adaptive.for_window(int(self.block_size))) if adaptive is not None
                             else FixedWidth(int(self.block_size)))
        self._widths = WidthSwitch(self)
        self._clock = StepClock()
        self._in_flight = collections.deque()  # (rids, width) of adaptive steps not yet processed
        if self._is_domino:
            # the eager rollout's feedback embedding (`sampled_draft.plain_embedding`); with
            # an adaptive width it also answers width-1 steps with no proposals
            sampled_draft.install()
        # argument resolution refuses the flag for drafts that are not Domino
        self.q_rule = bool(get_spec().speculative_use_rejection_sampling) and self._is_domino
        logger.info(
            "sglang-domino DFLASH worker: device=%s, draft block=%s, verify width=%s, domino=%s, "
            "sampled verify=%s", self.device, self.draft_block,
            f"adaptive {self.width_policy.widths}" if adaptive is not None else self.block_size, self._is_domino,
            "q rule (draft sampled from q, min(1, p/q))" if self.q_rule else "point mass")
        self._wrap_target_verify()

    def _wrap_target_verify(self) -> None:
        """Around the target's verify call (`dflash_worker_v2.py:2875`): log the width of the
        first verify (what the target really computed per request, for operators and for
        the end-to-end tests of b8); a verify narrower than the home width runs eager, the
        target's decode graphs being captured at the home width
        (`decode_cuda_graph_runner.py:349-361`, replay needs equal widths `:860-869`)."""
        target = self._target_worker
        original = target.forward_batch_generation
        home = int(self.block_size)
        logged = []

        def forward_batch_generation(*args, **kwargs):
            fb = kwargs.get("forward_batch")
            if kwargs.get("is_verify") and fb is not None and int(fb.batch_size) > 0:
                if int(self.block_size) != home:
                    fb.can_run_decode_cuda_graph = False
                if not logged:
                    logged.append(True)
                    logger.info("sglang-domino first verify: the target computed %d tokens for %d request(s)",
                                int(fb.input_ids.numel()), int(fb.batch_size))
            return original(*args, **kwargs)

        target.forward_batch_generation = forward_batch_generation

    def _resolve_draft_block(self, adaptive: bool) -> int:
        """`self.block_size` is the verify window, what the scheduler accounts in
        (`speculative_num_draft_tokens`). The draft block differs from it in two modes,
        both set up by argument resolution (DRAFT_BLOCK_ENV):
          * b8: draft block B > window W. The block-B draft runs whole; its first W - 1
            proposals are verified, so the target computes W positions per request.
          * SGLANG_DOMINO_HF_WINDOW: window = B + 1 for a `shift_label` Domino draft; the
            rollout proposes B tokens from slots 0..B-1, as the Transformers backend.
        With an adaptive width the draft runs on its block at every width below it.
        Upstream proposes from a block as wide as the window (algorithm.md 4.5)."""
        raw = os.environ.get(DRAFT_BLOCK_ENV)
        window = int(self.block_size)
        draft_block = int(raw) if raw else window  # refused with a compact draft cache
        if draft_block == window:
            if adaptive:
                self._run_draft_on_block(draft_block)
            return window
        if draft_block < window and not (self._is_domino and bool(self.draft_model.shift_label)
                                         and window == draft_block + 1):
            raise ValueError(
                f"{HF_WINDOW_ENV}=1 needs a shift_label Domino draft and a verify window of draft block + 1; "
                f"got draft block {draft_block}, window {window}, domino={self._is_domino}")
        self.draft_model.set_block_size(draft_block)
        # The draft batch's spec info carries its width: the draft attention backend plans
        # `draft_token_num` query rows per request (`dflash_info.py:135-202`, FlashInfer) and
        # graph replay requires it to equal the captured width
        # (`decode_cuda_graph_runner.py:860-869`).
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=draft_block,
                                                                 device=self.device)
        self._run_draft_on_block(draft_block)
        if draft_block > window:
            reserve_draft_block(draft_block - window)
        return draft_block

    def _run_draft_on_block(self, draft_block: int) -> None:
        """Upstream builds the draft batch as wide as the verify window
        (`dflash_worker_v2.py:2503-2660`) and runs it at `:2688`. Give the draft runner a
        batch of `draft_block` slots per request instead: the window's first slots (the
        bonus and mask tokens) cut or extended with mask slots, at positions
        `seq_len + 0..draft_block-1` and their `req_to_token` cache slots, with a KV plan of
        its own. Hidden states come back window-wide: the first `window` slots of the
        block (b8: the rollout and the greedy head read slots 0..W-1, so the proposals are
        the block-B draft's first W - 1), or zero-padded (HF window: the padded slot is
        never read, `shift_label` reads slots 0..window-2, `domino_utils.py:311`)."""
        import copy

        runner = self.draft_model_runner
        original = runner.forward
        target_runner = self.model_runner  # its KV pools are allocated after __init__
        offsets = torch.arange(draft_block, device=self.device, dtype=torch.int64)
        mask_id = int(self._mask_token_id)
        hidden_size = int(self.draft_model.config.hidden_size)

        def resize(t, window, fill=None):
            """[bs * window, ...] -> [bs * draft_block, ...]; new slots repeat `fill` or
            the last window slot (a mask slot: slot 0 is the only non-mask one)."""
            rows = t.view(-1, window, *t.shape[1:])
            if draft_block <= window:
                out = rows[:, :draft_block]
            else:
                extra = rows[:, -1:].expand(-1, draft_block - window, *t.shape[1:])
                if fill is not None:
                    extra = torch.full_like(extra, fill)
                out = torch.cat((rows, extra), dim=1)
            return out.reshape(-1, *t.shape[1:])

        def forward(forward_batch, *args, **kwargs):
            bs, window = int(forward_batch.batch_size), int(self.block_size)  # this step's width
            if (window == draft_block or not forward_batch.forward_mode.is_target_verify()
                    or forward_batch.input_embeds is None or forward_batch.input_ids.numel() != bs * window):
                return original(forward_batch, *args, **kwargs)
            if window == 1:
                # a plain decode step: no proposal to draft; the draft's context cache is
                # written from the target's hidden states after the verify, as every step
                hidden = torch.zeros(bs, hidden_size, dtype=runner.dtype, device=forward_batch.input_ids.device)
                return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=hidden), can_run_graph=False)
            fb = copy.copy(forward_batch)
            fb.input_ids = resize(forward_batch.input_ids, window, fill=mask_id)
            fb.input_embeds = resize(forward_batch.input_embeds, window)
            fb.positions = (forward_batch.positions.view(bs, window)[:, :1] + offsets).reshape(-1)
            cols = forward_batch.seq_lens.to(torch.int64)[:, None] + offsets
            locs = target_runner.req_to_token_pool.req_to_token[forward_batch.req_pool_indices.to(torch.int64)[:, None], cols]
            extra = draft_block - window
            if extra > 0 and fb.seq_lens_cpu is not None:  # host bound: committed + block
                fb.seq_lens_cpu = fb.seq_lens_cpu + extra
                fb.seq_lens_sum = int(fb.seq_lens_sum) + bs * extra
            old_plan = forward_batch.kv_loc_plan
            plan = target_runner.kv_index_translator.plan(
                req_pool_indices=forward_batch.req_pool_indices,
                seq_lens=forward_batch.seq_lens,
                seq_lens_cpu=old_plan.seq_lens_cpu if old_plan is not None else None,
                write_virtual=locs.reshape(-1).to(forward_batch.out_cache_loc.dtype),
                read_extent=draft_block,
            )
            plan.bind(fb, runner.kv_index_translator)
            if getattr(fb, "num_token_non_padded", None) is not None:
                fb.num_token_non_padded = torch.full_like(fb.num_token_non_padded, bs * draft_block)
            fb.global_num_token_non_padded_cpu = bs * draft_block
            out = original(fb, *args, **kwargs)
            hidden = out.logits_output.hidden_states.view(bs, draft_block, -1)
            if draft_block >= window:
                hidden = hidden[:, :window]
            else:
                hidden = torch.cat((hidden, hidden.new_zeros(bs, window - draft_block, hidden.shape[-1])), 1)
            out.logits_output.hidden_states = hidden.reshape(bs * window, -1)
            return out

        runner.forward = forward

    def forward_batch_generation(self, batch, *args, **kwargs):
        """Each decode step at the width `self.width_policy` chooses for the batch
        (`step_width`); with a fixed width, upstream's step as built."""
        decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle())
        if not decode:
            self._clock.break_chain()
        if not decode or isinstance(self.width_policy, FixedWidth):
            return self._step(batch, *args, **kwargs)
        rids = [req.rid for req in batch.reqs]
        width = self._choose_width(rids)
        with self._widths.at(width):
            result = self._step(batch, *args, **kwargs)
        self._in_flight.append((rids, width))
        return result

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        """The scheduler's hook once a decode step's accept counts are on the host
        (`batch_result_processor.py:801-806`, decode results only, in step order): the
        adaptive policy learns from it without a device sync in the step."""
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        if not self._in_flight:
            return
        rids, width = self._in_flight.popleft()
        if width > 1 and len(rids) == len(num_correct_drafts_per_req):
            # a width-1 step proposes nothing: no acceptance to learn from
            self.width_policy.observe_step(rids, width, num_correct_drafts_per_req)

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

    def _step(self, batch, *args, **kwargs):
        """With the q rule, a decode step that has sampled requests proposes through
        `sampled_draft.domino_sampled_rollout` (eager; upstream's in-graph greedy rollout,
        `_DominoDraftSampler`, is stepped around for that step only: its graph still
        replays, its output is not read, `dflash_worker_v2.py:2692-2699`)."""
        if (not self.q_rule or batch.forward_mode.is_extend() or batch.is_extend_in_batch
                or _is_all_greedy(batch.sampling_info)):
            return super().forward_batch_generation(batch, *args, **kwargs)
        step = SampledStep(batch.sampling_info, batch.seq_lens,
                           sync_tokens=lambda t: self._tp_sync.sync(SpecTpSyncSite.DFLASH_SELECTOR, t))
        sampler, self._draft_sampler = self._draft_sampler, None
        try:
            with sampled_step(step):
                return super().forward_batch_generation(batch, *args, **kwargs)
        finally:
            self._draft_sampler = sampler

    def _accept_block(self, **kwargs):
        """0.5.23 verifies sampled requests only with a CUDA/MUSA kernel
        (`tree_speculative_sampling_target_only`, `dflash_utils.py:47`,
        `dflash_worker_v2.py:2212-2224`); elsewhere it verifies them by greedy argmax,
        which does not preserve the requested distribution. Without the kernel, verify
        sampled batches with the project's accept rule (`sglang_domino.accept.accept_probs`,
        the draft a point mass: DFLASH drafts propose greedily) over upstream's own target
        probabilities (temperature, top-k, top-p: `build_speculative_verify_target_probs`,
        `dflash_utils.py:1038`). Greedy rows of a mixed batch have top-k 1, a point mass
        on the argmax, so they stay token for token the target's."""
        sampling_info = kwargs["sampling_info"]
        step = active_step() if self.q_rule else None
        if step is not None and step.tokens is not None and not _is_all_greedy(sampling_info):
            return self._accept_q_rule(step, **kwargs)
        if (self._selector_sample is not None or kwargs.get("target_predict") is not None
                or _is_all_greedy(sampling_info) or is_dflash_sampling_verify_available()
                or SIMULATE_ACC_LEN > 0):
            return super()._accept_block(**kwargs)
        from ..accept import accept_probs

        candidates, bs, draft_input = kwargs["candidates"], int(kwargs["bs"]), kwargs["draft_input"]
        width = int(candidates.shape[1])
        target_probs = self._target_probs(next_token_logits=kwargs["next_token_logits"], sampling_info=sampling_info,
                                          draft_input=draft_input, bs=bs, width=width)
        return self._commit_sampled(candidates, *accept_probs(candidates[:, 1:], None, target_probs))

    def _target_probs(self, *, next_token_logits, sampling_info, draft_input, bs, width):
        from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs

        return build_speculative_verify_target_probs(
            next_token_logits=next_token_logits, sampling_info=sampling_info, draft_token_num=width, bs=bs,
            max_top_k=draft_input.max_top_k, uniform_top_k_value=draft_input.uniform_top_k_value
        ).view(bs, width, -1)

    def _accept_q_rule(self, step, *, candidates, next_token_logits, sampling_info, draft_input, bs, **_):
        """Speculative sampling against the draft's own q (`--speculative-use-rejection-sampling`):
        draft k accepted with min(1, p/q), the first rejection resampled from
        norm(max(0, p - q)), the bonus drawn from p (`SampledStep.accept`)."""
        bs, width = int(bs), int(candidates.shape[1])
        drafts = candidates[:, 1:].to(torch.int64)
        if not torch.equal(drafts, step.tokens.to(drafts.device)):
            raise RuntimeError("sglang-domino: the verified block is not the sampled rollout's proposals")
        target_probs = self._target_probs(next_token_logits=next_token_logits, sampling_info=sampling_info,
                                          draft_input=draft_input, bs=bs, width=width)
        return self._commit_sampled(candidates, *step.accept(drafts, target_probs))

    def _commit_sampled(self, candidates, accept_len, bonus):
        """`_accept_block`'s result for a sampled verify; every TP rank commits rank 0's
        decision (upstream syncs its sampled path alike, `dflash_worker_v2.py:2222-2223`)."""
        accept_len = accept_len.to(torch.int32)
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, accept_len)
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, bonus)
        out_tokens, commit_lens = _commit_accept(candidates, accept_len, bonus)
        return accept_len, commit_lens, bonus, out_tokens, None

    def _validate_phase1_sampling_support(self, batch) -> None:
        # Upstream warns that sampled requests fall back to greedy verification where its
        # kernel is missing; `_accept_block` verifies them exactly instead.
        if self.selector is None:
            return None
        return super()._validate_phase1_sampling_support(batch)

    def init_cuda_graphs(self):
        # The draft runner's graphs are captured `speculative_num_draft_tokens` wide
        # (`decode_cuda_graph_runner.py:349-361`), the verify window; the draft batch is
        # draft-block wide. Capture it under a scoped override of that leaf, the way
        # upstream captures adaptive widths (`spec_utils.py:95-97`).
        if int(self.draft_block) == int(self.block_size):
            return super().init_cuda_graphs()
        with get_spec().override(speculative_num_draft_tokens=int(self.draft_block)):
            return super().init_cuda_graphs()

    def _maybe_build_draft_sampler(self):
        # The in-graph Domino/greedy samplers (`dflash_worker_v2.py:884`, `:953`) read the
        # draft graph's output as window-wide; a draft block of another width runs the
        # eager rollout on the hidden states `_run_draft_on_block` hands back.
        if int(getattr(self, "draft_block", self.block_size)) != int(self.block_size):
            return None
        return super()._maybe_build_draft_sampler()


RESERVATION_TARGET = "sglang.srt.speculative.dflash_info_v2.page_aligned_decode_alloc_lens"
_reserve_extra = 0


def _around_decode_alloc_lens(original, reqs, *args, reserve, **kwargs):
    """`DFlashDraftInputV2.prepare_for_decode` reserves 2 x window past the committed
    length (`dflash_info_v2.py:147`): one window of host lag under overlap scheduling, one
    for the step's writes. A draft block wider than the window writes the whole block."""
    return original(reqs, *args, reserve=reserve + _reserve_extra, **kwargs)


_around_decode_alloc_lens._sglang_domino = True


def reserve_draft_block(extra: int) -> None:
    """Reserve `extra` more KV slots per request and decode step (draft block - window)."""
    global _reserve_extra
    apply_hooks_once("b8 reservation", [(RESERVATION_TARGET, _around_decode_alloc_lens, "AROUND")])
    _reserve_extra = int(extra)


__all__ = ["DominoDFlashWorker"]
