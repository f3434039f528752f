"""An adaptive width-1 step as a plain decode step (`decode`).

A width-1 step proposes nothing: it commits the one token the target samples after the
bonus. Run through 0.5.23's speculative step (`DFlashWorkerV2.forward_batch_generation` at
`block_size` 1) it still prepares a draft block (mask-token ids, their embeddings, a KV
plan, a draft batch the draft never runs) and sends the target through the verify path
(`TARGET_VERIFY`: on CPU the extend attention, with the per-layer rewrite of
`cpu.dflash.around_torch_native_forward_extend`). Profiled on the CPU test bed that came
to about 1.2 x a plain decode step, so the adaptive policy could not follow plain decoding
down where it wins.

`decode` runs the step the way plain decoding runs it: the target's own decode batch
(`ForwardBatch.init_new` on the scheduler's batch with the bonus as its input, one slot
per request from the slots the speculative step reserved, lengths counting the bonus) in
`DECODE` mode, capturing the hidden states the draft's context needs. What follows the
forward is upstream's, at width 1: the logit adjustments, `_accept_block` (the bonus
sampled from the target exactly as a width-1 verify samples it), sampling masks and
logprobs of the chain, the draft's context for the committed token (kept for later by
`draft_context.DeferredContext` where it is on), the next draft input and the result.

Where it runs (`DecodeStep.eligible`; otherwise width 1 is upstream's verify at one
token, logged at start-up): the target runs eagerly on CPU (0.5.23 captures no graph for
a speculative CPU server; on a device the per-width verify graphs serve width 1), not a
hybrid (recurrent) target (upstream commits its recurrent state after a verify), no
compact draft cache (rebuilt from the committed state every step by upstream's body), no
DP attention. Per step, a batch with a grammar goes through upstream's body (its grammar
mask is built over the verified chain).
"""

from __future__ import annotations

import copy
import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)


class DecodeStep:
    """Width-1 steps of one `DominoDFlashWorker` through the target's decode path."""

    def __init__(self, worker):
        self.worker = worker
        self.steps = 0          # decode steps run (tests and logs)

    @staticmethod
    def why_not(worker) -> Optional[str]:
        """None where width 1 can run as a decode step; otherwise the reason."""
        from sglang.srt.runtime_context import get_parallel

        from .verify_graphs import home_graph_runner

        if torch.device(worker.device).type != "cpu":
            return "the target verifies width 1 with its captured graphs on a device"
        if home_graph_runner(worker._target_worker.model_runner) is not None:
            return "the target has captured graphs"
        if bool(getattr(worker, "_need_mamba_verify_commit", False)):
            return "a hybrid target's recurrent state is committed after a verify"
        if bool(getattr(worker, "use_compact_draft_cache", False)):
            return "the compact draft cache is rebuilt by the speculative step"
        if bool(get_parallel().attn_dp_enabled):
            return "DP attention"
        return None

    @staticmethod
    def serves(batch) -> bool:
        """Whether this batch's step can be a decode step (grammar batches are not)."""
        return not bool(batch.has_grammar)

    def decode(self, batch, on_publish=None):
        """One decode step of `batch` (a decode `ScheduleBatch` of the speculative
        server, `batch.seq_lens` its committed lengths, `batch.spec_info` its bonus
        tokens); a `GenerationBatchResult` of width 1."""
        from sglang.srt.managers.scheduler import GenerationBatchResult
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
        from sglang.srt.speculative.spec_sampling_mask import SpeculativeSamplingMaskCapture

        worker = self.worker
        if int(worker.block_size) != 1:
            raise RuntimeError(f"sglang-domino decode step: expected the width-1 state, got width {worker.block_size}")
        draft_input = batch.spec_info
        prefix_lens = batch.seq_lens
        bs = int(prefix_lens.shape[0])
        bonus = draft_input.bonus_tokens.view(-1)
        req_to_token = worker.model_runner.req_to_token_pool.req_to_token
        # the slot of each request's next token, reserved with the step's block
        out_cache_loc = req_to_token[batch.req_pool_indices.to(torch.int64), prefix_lens.to(torch.int64)]

        step_batch = copy.copy(batch)   # the scheduler's batch is left as it was
        step_batch.forward_mode = ForwardMode.DECODE
        step_batch.input_ids = bonus
        step_batch.out_cache_loc = out_cache_loc.to(torch.int64)
        step_batch.seq_lens = prefix_lens + 1
        step_batch.seq_lens_cpu = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None
                                   else prefix_lens.cpu()) + 1
        step_batch.seq_lens_sum = int(step_batch.seq_lens_cpu.sum())
        step_batch.spec_info = None
        target_out = worker.target_worker.forward_batch_generation(
            step_batch, is_verify=True,   # upstream's accept samples, below
            capture_hidden_mode=CaptureHiddenMode.FULL, return_kv_loc_plan=True)
        kv_loc_plan, target_out.kv_loc_plan = target_out.kv_loc_plan, None
        logits_output = target_out.logits_output
        sampling_info = batch.sampling_info

        target_predict = None
        target_lp = worker._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            if worker._can_skip_verify_logits(batch, sampling_info):
                target_predict = target_lp.deferred_argmax(logits_output.next_token_logits)
                logits_output.next_token_logits = None
            else:
                logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        if sampling_info is not None and target_predict is None:
            apply_dflash_verify_logits_adjustments(next_token_logits=logits_output.next_token_logits,
                                                   sampling_info=sampling_info, draft_token_num=1)
        accept_len, commit_lens, new_bonus, out_tokens, new_seq_lens = self._accept(
            bonus.view(bs, 1), logits_output.next_token_logits, sampling_info, draft_input, prefix_lens, target_predict)

        capture = SpeculativeSamplingMaskCapture.from_logits(
            sampling_info, next_token_logits=logits_output.next_token_logits, draft_input=draft_input,
            draft_token_num=1, bs=bs)
        if capture is not None:
            logits_output.sampling_mask_output = capture.build_output(out_tokens=out_tokens, commit_lens=commit_lens)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, out_tokens.reshape(-1), chain_stride=1)
        if new_seq_lens is None:
            new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)

        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("sglang-domino decode step: the target returned no hidden states for the draft")
        cache_loc = worker._draft_write_ids(kv_loc_plan)
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(bs, -1), cache_loc=cache_loc, cache_loc_2d=cache_loc.view(bs, 1),
            positions=prefix_lens.to(torch.int64), commit_lens=commit_lens)
        logits_output.hidden_states = None
        self.steps += 1
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=worker._make_next_draft_input_decode(bonus_tokens=new_bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=1, new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output)

    def _accept(self, candidates, next_token_logits, sampling_info, draft_input, prefix_lens, target_predict):
        """`_accept_block` at width 1: nothing proposed, so nothing accepted and the
        target's token committed. Greedy: the argmax (0.5.23's accept kernel computes the
        same from one row, in a dozen ops more); sampled: upstream's or the plugin's exact
        accept rule, which samples it from the target's distribution."""
        from sglang.srt.speculative.dflash_worker_v2 import SIMULATE_ACC_LEN, SpecTpSyncSite, _is_all_greedy

        worker = self.worker
        bs = int(candidates.shape[0])
        if (not _is_all_greedy(sampling_info) or SIMULATE_ACC_LEN > 0
                or getattr(worker, "_step_penalties", None) is not None):   # penalties: `penalty_state`
            return worker._accept_block(candidates=candidates, next_token_logits=next_token_logits,
                                        sampling_info=sampling_info, draft_input=draft_input,
                                        prefix_lens=prefix_lens, bs=bs, target_predict=target_predict)
        predict = target_predict if target_predict is not None else torch.argmax(next_token_logits, dim=-1)
        predict = predict.view(bs).to(torch.int64)
        worker._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, predict)
        accept_len = torch.zeros(bs, dtype=torch.int32, device=predict.device)
        commit_lens = torch.ones(bs, dtype=torch.int32, device=predict.device)
        return accept_len, commit_lens, predict, predict.view(bs, 1).clone(), prefix_lens + 1


__all__ = ["DecodeStep"]
