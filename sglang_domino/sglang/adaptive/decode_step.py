"""An adaptive width-1 step without the draft side (`DecodeStep.decode`).

A width-1 step proposes nothing: it commits the one token the target samples after the
bonus. Run through 0.5.23's speculative step (`DFlashWorkerV2.forward_batch_generation` at
`block_size` 1) it still prepares a draft block (the Triton prepare-block kernel: mask-token
ids, positions, cache slots; the block's embeddings; a draft batch and its KV plan bound for
a draft that never runs), sends the target through the verify path (`TARGET_VERIFY`),
compares the proposals that are not there (the Triton accept/bonus kernel) and writes the
draft's context after the step. `decode` runs only what a width-1 step needs, in one of two
ways:

  * On CPU (`_decode_forward`): the target's own decode path, the way plain decoding runs
    it: `ForwardBatch.init_new` on the scheduler's batch with the bonus as its input, one
    slot per request from the slots the speculative step reserved, lengths counting the
    bonus, in `DECODE` mode, capturing the hidden states the draft's context needs. (The
    verify path there is the extend attention with the CPU port's per-layer rewrite of
    `cpu.dflash.around_torch_native_forward_extend`; profiled on the CPU test bed a width-1
    step through upstream's step came to about 1.2 x a plain decode step.)
  * On CUDA (`_verify_forward`): the target's verify of one token per request, the bonus,
    exactly as upstream's step builds it at width 1 (a `DFlashVerifyInput` of one token per
    request, its positions and cache slots, the iteration's KV plan, upstream's
    `prepare_for_verify`, the target's `forward_batch_generation(is_verify=True)`), so it
    replays the target's captured width-1 verify graph (`verify_graphs.VerifyGraphs`,
    swapped in by `width_switch.WidthSwitch.at(1)`), or verifies eagerly where upstream
    would. A `DECODE` forward is not an option there: on a speculative server 0.5.23
    captures the target's decode graphs in `TARGET_VERIFY` mode only
    (`DecodeCudaGraphRunner`: `capture_forward_mode`), and a `DECODE` batch with no spec
    info would pass `can_run_graph` and replay that graph with `TARGET_VERIFY` replay
    metadata built from spec info it does not have. The verify graph at width 1 is the
    decode step in all but name: one query row per request over the same KV.

What follows the target's forward is upstream's at width 1, in both: the logit adjustments
(penalties, bias), the accept (greedy: the argmax, which is what 0.5.23's accept kernel
computes from one row, committed without the kernel; sampled, penalised, or with simulated
acceptance: upstream's or the plugin's accept rule, `_accept_block`, which at width 1 samples
the bonus from the target's distribution), sampling masks and logprobs of the chain, the
draft's context for the committed token (kept for the next drafting step by
`draft_context.DeferredContext` where it is on; otherwise written now, as upstream), the next
draft input and the result.

Where it runs (`DecodeStep.why_not`; otherwise width 1 is upstream's step at one token,
logged at start-up): CPU with the target running eagerly (0.5.23 captures no graph for a
speculative CPU server), or CUDA; not a hybrid (recurrent) target (upstream commits its
recurrent state after a verify), no compact draft cache (rebuilt from the committed state
every step by upstream's body), no DP attention (an idle rank's verify and the graph guards
of upstream's body). Per step, a batch with a grammar goes through upstream's body (its
grammar mask is built over the verified chain).
"""

from __future__ import annotations

import copy
import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)


class DecodeStep:
    """Width-1 steps of one `DominoDFlashWorker` without the draft side: the target's
    decode path on CPU, its one-token verify on CUDA (see the module's docstring)."""

    def __init__(self, worker):
        self.worker = worker
        self.steps = 0          # width-1 steps run (tests and logs)
        # CUDA: the target's verify at one token (its width-1 graph); CPU: its decode path
        kind = torch.device(getattr(worker, "device", "cpu")).type
        self.on_device = kind != "cpu"
        if self.on_device:
            logger.info("sglang-domino adaptive verify: on %s a width-1 step is the target's one-token verify "
                        "(its width-1 graph where captured), without the draft block, the accept kernel or the "
                        "draft-context write", kind)

    @staticmethod
    def why_not(worker) -> Optional[str]:
        """None where width 1 can run without the draft side; otherwise the reason."""
        from sglang.srt.runtime_context import get_parallel

        from .verify_graphs import home_graph_runner

        kind = torch.device(worker.device).type
        if kind not in ("cpu", "cuda"):
            return (f"the target verifies width 1 with its captured graphs on a device ({kind}); "
                    "the verify-only step is built for CUDA")
        if kind == "cpu" and home_graph_runner(worker._target_worker.model_runner) is not None:
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
        """Whether this batch's step can skip the draft side (grammar batches cannot)."""
        return not bool(batch.has_grammar)

    def decode(self, batch, on_publish=None):
        """One width-1 step of `batch` (a decode `ScheduleBatch` of the speculative
        server, `batch.seq_lens` its committed lengths, `batch.spec_info` its bonus
        tokens); a `GenerationBatchResult` of width 1."""
        from sglang.srt.managers.scheduler import GenerationBatchResult
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
        from sglang.srt.speculative.spec_sampling_mask import SpeculativeSamplingMaskCapture

        worker = self.worker
        if int(worker.block_size) != 1:
            raise RuntimeError(f"sglang-domino decode step: expected the width-1 state, got width {worker.block_size}")
        draft_input = batch.spec_info        # the verify's preparation replaces it on the batch (as upstream's)
        prefix_lens = batch.seq_lens
        bs = int(prefix_lens.shape[0])
        bonus = draft_input.bonus_tokens.view(-1)
        forward = self._verify_forward if self.on_device else self._decode_forward
        target_out, kv_loc_plan, positions = forward(batch, draft_input, prefix_lens, bonus)
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
        # the committed token's draft context: kept for the next drafting step by the
        # worker's `DeferredContext` inside a width-1 step, otherwise written now
        cache_loc = worker._draft_write_ids(kv_loc_plan)
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(bs, -1), cache_loc=cache_loc, cache_loc_2d=cache_loc.view(bs, 1),
            positions=positions, commit_lens=commit_lens)
        logits_output.hidden_states = None
        self.steps += 1
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=worker._make_next_draft_input_decode(bonus_tokens=new_bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=1, new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output)

    def _decode_forward(self, batch, draft_input, prefix_lens, bonus):
        """CPU: the target's decode path on a copy of the scheduler's batch; (its output,
        the KV plan, the positions)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

        worker = self.worker
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
            step_batch, is_verify=True,   # upstream's accept samples, in `decode`
            capture_hidden_mode=CaptureHiddenMode.FULL, return_kv_loc_plan=True)
        kv_loc_plan, target_out.kv_loc_plan = target_out.kv_loc_plan, None
        return target_out, kv_loc_plan, prefix_lens.to(torch.int64)

    def _verify_forward(self, batch, draft_input, prefix_lens, bonus):
        """CUDA: the target's verify of the bonus, one token per request, as 0.5.23's step
        builds it at width 1 (`dflash_worker_v2.py:2481`, `:2588-2598`, `:2824-2882`) with
        none of its draft side; (the target's output, the KV plan, the positions). No host
        read: the host lengths are the scheduler's host tensors, as upstream's."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        worker = self.worker
        # the lengths may come from another stream under overlap scheduling (as upstream)
        prefix_lens.record_stream(torch.get_device_module(worker.device).current_stream())
        positions = prefix_lens.to(torch.int64)
        req_to_token = worker.model_runner.req_to_token_pool.req_to_token
        # the slot of each request's next token, reserved with the step's block
        out_cache_loc = req_to_token[batch.req_pool_indices.to(torch.int64), positions].to(torch.int64)
        # the iteration's window planned once: the verify writes it, the draft's context
        # write reads its ids
        kv_loc_plan = worker.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
            write_virtual=out_cache_loc, read_extent=1)
        verify_input = DFlashVerifyInput(
            draft_token=bonus, positions=positions, draft_token_num=1, custom_mask=None,
            capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=kv_loc_plan)
        batch.out_cache_loc = out_cache_loc
        host_lens, host_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        if host_lens is not None:   # host bound: committed prefix + the one verified token
            batch.seq_lens_cpu = host_lens + 1
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif draft_input.nxt_kv_lens_cpu is not None:
            batch.seq_lens_cpu = draft_input.nxt_kv_lens_cpu
            batch.seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
        try:
            verify_batch, _ = verify_input.prepare_for_verify(batch, worker.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = host_lens, host_sum
        target_out = worker.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True)
        return target_out, kv_loc_plan, positions

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
