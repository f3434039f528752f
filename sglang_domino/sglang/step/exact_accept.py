"""The verify's accept, exact for every request: the mixin `DominoDFlashWorker` puts before
0.5.23's `DFlashWorkerV2`.

  * `_accept_block`: a penalised step (`penalty_state`) adjusts every row of the block with
    the output before it, then accepts, then counts the committed tokens;
  * `_accept`: sampled batches without 0.5.23's CUDA/MUSA kernel verified with the project's
    accept rule over upstream's target probabilities (0.5.23 verifies them by greedy argmax
    there, which does not keep the requested distribution);
  * `_forward_with_q_rollout`, `_accept_q_rule`: the q rule
    (`--speculative-use-rejection-sampling`): sampled steps propose from the draft's own q
    and accept with min(1, p/q) (`sampled_rollout`);
  * `_validate_phase1_sampling_support`: no greedy-fallback warning where nothing falls back.
"""

from __future__ import annotations

import torch
from sglang.srt.speculative.dflash_worker_v2 import (
    SIMULATE_ACC_LEN,
    SpecTpSyncSite,
    _commit_accept,
    _is_all_greedy,
    is_dflash_sampling_verify_available,
)
from typing_extensions import override

from ..environment import debug
from ..sampling.sampled_rollout import SampledStep, active_step, sampled_step

# SGLANG_DOMINO_DEBUG=q-rule-block: each q-rule verify checks that the verified block is
# the sampled rollout's proposals (a host sync per step; the e2e tests turn it on)
CHECK_Q_RULE_BLOCK = debug("q-rule-block")


class ExactAccept:
    """The accept-side methods of `DominoDFlashWorker` (attributes are the worker's)."""

    def _forward_with_q_rollout(self, batch, *args, **kwargs):
        """With the q rule, a decode step that has sampled requests proposes from q.
        Where the draft graph holds the q rule's rollout (`q_sampler.QRuleDraftSampler`,
        CUDA), every decode step stages its rows' parameters for the replay (greedy rows
        propose the argmax); a step the graph does not serve, or a server without it,
        proposes through the eager `sampled_rollout.domino_sampled_rollout` (the rollout
        hook), upstream's in-graph greedy sampler stepped around for that step."""
        if not self.q_rule or batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return super().forward_batch_generation(batch, *args, **kwargs)
        if self._q_sampler is not None:
            self._q_sampler.stage(batch.sampling_info, batch.seq_lens, int(batch.seq_lens.shape[0]))
        if _is_all_greedy(batch.sampling_info):
            return super().forward_batch_generation(batch, *args, **kwargs)
        step = SampledStep(batch.sampling_info, batch.seq_lens,
                           sync_tokens=lambda t: self._tp_sync.sync(SpecTpSyncSite.DFLASH_SELECTOR, t),
                           max_top_k=getattr(batch.spec_info, "max_top_k", None))
        if self._q_sampler is not None:
            with sampled_step(step):
                return super().forward_batch_generation(batch, *args, **kwargs)
        sampler, self._draft_sampler = self._draft_sampler, None
        try:
            with sampled_step(step):
                return super().forward_batch_generation(batch, *args, **kwargs)
        finally:
            self._draft_sampler = sampler

    @override
    def _accept_block(self, **kwargs):
        """A penalised step (`penalty_state`): every row of the block adjusted with the
        output before it, then accepted (`_accept`), then the committed tokens counted."""
        penalties = getattr(self, "_step_penalties", None)
        if penalties is None or kwargs.get("next_token_logits") is None:
            return self._accept(**kwargs)
        penalties.apply(kwargs["next_token_logits"], kwargs["candidates"], kwargs["sampling_info"])
        result = self._accept(**kwargs)
        penalties.commit(kwargs["candidates"], result[0])
        return result

    @override
    def _can_skip_verify_logits(self, batch, sampling_info) -> bool:
        # a penalised step needs the full logits (a vocabulary shard's argmax is not enough)
        if getattr(self, "_step_penalties", None) is not None:
            return False
        return super()._can_skip_verify_logits(batch, sampling_info)

    def _accept(self, **kwargs):
        """0.5.23 verifies sampled requests only with a CUDA/MUSA kernel
        (`tree_speculative_sampling_target_only`); elsewhere it verifies them by greedy
        argmax, which does not preserve the requested distribution. Without the kernel,
        verify sampled batches with the project's accept rule
        (`sglang_domino.accept.accept_probs`, the draft a point mass: DFLASH drafts propose
        greedily) over upstream's own target probabilities (temperature, top-k, top-p:
        `build_speculative_verify_target_probs`). Greedy rows of a mixed batch have top-k 1,
        a point mass on the argmax, so they stay token for token the target's."""
        sampling_info = kwargs["sampling_info"]
        step = active_step() if self.q_rule else None
        if step is not None and int(kwargs["candidates"].shape[1]) > 1 and not _is_all_greedy(sampling_info):
            return self._accept_q_rule(step, **kwargs)
        if (self._selector_sample is not None or kwargs.get("target_predict") is not None
                or _is_all_greedy(sampling_info) or is_dflash_sampling_verify_available()
                or SIMULATE_ACC_LEN > 0):
            return super()._accept_block(**kwargs)
        from ...accept import accept_probs

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
        if step.draft is None:   # the draft graph drew them
            if self._q_sampler is None:
                raise RuntimeError("sglang-domino q rule: a sampled step verified proposals no rollout recorded")
            step.draft = self._q_sampler.read(bs, width)
        if CHECK_Q_RULE_BLOCK and not torch.equal(drafts, step.draft.tokens.to(drafts.device)):
            # a host sync that waits for the verify: a debugging aid, off by default
            raise RuntimeError("sglang-domino: the verified block is not the sampled rollout's proposals")
        from sglang.srt.model_executor.runner_utils.pool import borrow_graph_pool

        _ = step.params   # the step keeps its parameters: built before the borrowed scope
        # The full-vocabulary probabilities ([bs, width, V] fp32, ~620 MB at batch 64 and
        # Qwen3's vocabulary) die with this step: like 0.5.23's own sampled verify
        # (`dflash_utils.py:980`) they take the graph pool's idle bytes, which the KV pool's
        # sizing left for such transients. Nothing allocated inside may outlive the scope
        # (the next replay rewrites those bytes): the two [bs] results leave as copies.
        with borrow_graph_pool(user="sglang-domino q-rule verify probabilities"):
            target_probs = self._target_probs(next_token_logits=next_token_logits, sampling_info=sampling_info,
                                              draft_input=draft_input, bs=bs, width=width)
            accept_len, bonus = step.accept(drafts, target_probs)
            del target_probs
        accept_len, bonus = accept_len.clone(), bonus.clone()
        return self._commit_sampled(candidates, accept_len, bonus)

    def _commit_sampled(self, candidates, accept_len, bonus):
        """`_accept_block`'s result for a sampled verify; every TP rank commits rank 0's
        decision (upstream syncs its sampled path alike)."""
        accept_len = accept_len.to(torch.int32)
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, accept_len)
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, bonus)
        out_tokens, commit_lens = _commit_accept(candidates, accept_len, bonus)
        return accept_len, commit_lens, bonus, out_tokens, None

    @override
    def _validate_phase1_sampling_support(self, batch) -> None:
        # Upstream warns that sampled requests fall back to greedy verification where its
        # kernel is missing; `_accept_block` verifies them exactly instead.
        if self.selector is None:
            return None
        return super()._validate_phase1_sampling_support(batch)


__all__ = ["CHECK_Q_RULE_BLOCK", "ExactAccept"]
