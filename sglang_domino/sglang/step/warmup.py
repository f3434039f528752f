"""Every Triton kernel of a DFLASH decode step compiled at start-up, at every verify width.

Triton compiles a kernel for each set of constants it is launched with. 0.5.23's DFLASH step
launches two kernels outside the graphs whose tile is the verify width rounded to a power of
two (`_prepare_dflash_draft_block_unchecked`, `_compute_dflash_accept_bonus_triton_unchecked`),
and the q rule launches this project's chain-accept kernel (`kernels/chain_accept.py`) with
the step's proposal count. The first step at each width would compile them in the middle
of serving, on every TP rank (about 0.5-2 s each; adaptive widths are first probed within
the first few dozen steps). `warm_step_kernels` launches each once per width on a
one-request dummy batch with the dtypes, strides and table the step uses (the worker's own
`req_to_token`), so the step finds them compiled. On CUDA and ROCm it also runs the step's
draft-context write (`DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc`, whose
prefix-valid KV kernel Triton specialises at width 1 and at multiples of 16) once per width
on zero rows of commit length 0, which projects them and writes none.

A kernel that fails here is switched off the way 0.5.23 switches it off when it fails in a
step (its eager path, with a warning), rather than failing the first request; a failed
draft-context write is only logged (upstream's own fallback from its fused path applies).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

logger = logging.getLogger(__name__)


def warm_step_kernels(worker, widths: Sequence[int], *, q_rule: bool) -> list[tuple[str, int]]:
    """Launch the step's Triton kernels once per width; returns the (kernel, width) launches."""
    from sglang.kernels.ops.speculative.dflash import (
        _compute_dflash_accept_bonus_triton_unchecked,
        _prepare_dflash_draft_block_unchecked,
    )

    device = worker.device
    req_to_token = worker.model_runner.req_to_token_pool.req_to_token
    launched: list[tuple[str, int]] = []
    tic = time.perf_counter()
    context_write = _context_write_runs_triton(device)

    def ints(*shape, dtype=torch.int64):
        return torch.zeros(shape, dtype=dtype, device=device)

    for width in sorted({int(w) for w in widths}, reverse=True):
        if worker._use_triton_prepare_block:
            try:
                _prepare_dflash_draft_block_unchecked(
                    bonus_tokens=ints(1), prefix_lens=ints(1), req_pool_indices=ints(1),
                    req_to_token=req_to_token, block_ids_out=ints(1, width), positions_out=ints(1, width),
                    cache_loc_out=ints(1, width), mask_token_id=int(worker._mask_token_id))
                launched.append(("prepare_block", width))
            except Exception as err:   # 0.5.23 does the same on a failed step
                worker._use_triton_prepare_block = False
                logger.warning("sglang-domino warm-up: DFLASH Triton prepare_block failed at width %d; "
                               "the eager path serves (%s)", width, err)
        if worker._use_triton_accept_bonus:
            try:
                _compute_dflash_accept_bonus_triton_unchecked(
                    candidates=ints(1, width), target_top1=ints(1, width),
                    accept_lens_out=ints(1, dtype=torch.int32), commit_lens_out=ints(1, dtype=torch.int32),
                    bonus_ids_out=ints(1), out_tokens_out=ints(1, width), prefix_lens=ints(1),
                    new_seq_lens_out=ints(1))
                launched.append(("accept_bonus", width))
            except Exception as err:
                worker._use_triton_accept_bonus = False
                logger.warning("sglang-domino warm-up: DFLASH Triton accept/bonus failed at width %d; "
                               "the eager path serves (%s)", width, err)
        if q_rule and width > 1:
            _warm_chain_accept(width - 1, int(worker.model_runner.model_config.vocab_size),
                               int(worker.domino_candidate_pool_size), device)
            launched.append(("chain_accept", width))
        if context_write:
            try:
                _warm_context_write(worker, width, device)
                launched.append(("context_write", width))
            except Exception as err:   # the step would compile it (or fail) the same way
                context_write = False
                logger.warning("sglang-domino warm-up: the DFLASH draft-context write failed at width %d; "
                               "the step compiles it when it first runs (%s)", width, err)
    if launched:
        logger.info("sglang-domino warm-up: %d Triton launches over widths %s in %.1f s", len(launched),
                    sorted({w for _, w in launched}, reverse=True), time.perf_counter() - tic)
    return launched


def _context_write_runs_triton(device) -> bool:
    """0.5.23's `set_kv_buffer_prefix_valid` runs its Triton kernel only on CUDA and HIP (a
    ROCm device is "cuda" to torch); elsewhere (CPU, NPU, XPU) it is torch ops with nothing
    to compile, and start-up there is left as it was."""
    return torch.device(device).type == "cuda"


def _warm_context_write(worker, width: int, device) -> None:
    """The verify's draft-context write at `width` (`DFlashWorkerV2`'s decode step: the
    target's captured hidden states, `[bs * width, num_context_features * hidden_size]`,
    slots `cache_loc_2d [bs, width]`, `commit_lens [bs]`) for one request of zero rows in
    the pool's padding slot 0 with commit length 0: the projection and every layer's K/V
    run at the served shape and the prefix-valid kernel is launched with block size
    `width`, but it returns on every row (row >= commit length), so nothing is written.

    Upstream's function is called, not the worker's override: inside a width-1 step
    `DominoDFlashWorker`'s keeps the rows for later (`draft_context`), and a warm-up must
    neither depend on that state nor leave rows behind; off CPU every write the override
    lets through, and its kept rows' later write, is this function."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    draft = worker.draft_model
    features = int(draft.num_context_features) * int(draft.config.hidden_size)
    hidden = torch.zeros((width, features), dtype=worker.model_runner.model_config.dtype, device=device)
    cache_loc = torch.zeros(width, dtype=torch.int64, device=device)
    DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc(
        worker, target_hidden=hidden, cache_loc=cache_loc, positions=torch.zeros_like(cache_loc),
        cache_loc_2d=cache_loc.view(1, width), commit_lens=torch.zeros(1, dtype=torch.int32, device=device))


def _warm_chain_accept(n: int, vocab: int, pool_size: int, device) -> None:
    """The q rule's accept (`SampledStep.accept`) on one request with n proposals: q_0 over
    the vocabulary, later proposals over the candidate pool (the whole vocabulary without
    one)."""
    from ...accept import Uniforms
    from ...kernels.chain_accept import accept_chain

    pool = pool_size if 0 < pool_size < vocab else vocab
    probs = torch.full((1, n + 1, vocab), 1.0 / vocab, device=device)
    q_first = torch.full((1, vocab), 1.0 / vocab, device=device)
    pool_ids = q_rest = None
    if n > 1:
        pool_ids = torch.arange(pool, device=device)[None]
        q_rest = torch.full((1, n - 1, pool), 1.0 / pool, device=device)
    uniforms = Uniforms(torch.full((1, n), 0.5, device=device), torch.full((1,), 0.5, device=device))
    accept_chain(torch.zeros((1, n), dtype=torch.int64, device=device), torch.full((1, n), 1.0 / vocab, device=device),
                 q_first, pool_ids, q_rest, probs, uniforms)


def warm_cpu_rollout(worker, blocks: Sequence[int]) -> list[tuple[int, int]]:
    """In a server with the compiled CPU step (`cpu.rollout`, `--enable-torch-compile`):
    its graphs for every block length the draft proposes from (batch 1 and the dynamic
    batch), compiled before the first request. Compiled in the middle of serving instead,
    each costs seconds, and an adaptive server prices the width whose step paid them from
    that step. Returns the (block, batch size) calls made; none when the step is not
    compiled. A rollout the compiled step cannot run is refused here, at start-up."""
    from . import compiled_rollout as cpu_rollout
    from ..cpu.compiled.switches import compiled_step_serving

    draft = worker.draft_model
    if not compiled_step_serving() or getattr(draft, "prefix_gru", None) is None:
        return []
    from sglang.srt.distributed import get_parallel
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module

    from .rollout_hook import embedding_weight

    target = worker.target_worker.model_runner.model
    module = unwrap_lora_layer(_resolve_dflash_embedding_module(draft, target))
    weight = embedding_weight(module)
    lm_head = unwrap_lora_layer(getattr(target, "lm_head", None))
    if getattr(lm_head, "weight", None) is None:
        raise ValueError("--enable-torch-compile with --device cpu cannot compile this Domino rollout: the target's "
                         f"lm_head ({type(lm_head).__name__}) has no dense weight; serve it without --enable-torch-compile")
    device, hidden_size = lm_head.weight.device, int(lm_head.weight.shape[1])
    shard = getattr(lm_head, "shard_indices", None)
    tp_group = get_parallel().tp_group
    args = dict(lm_head_weight=lm_head.weight, vocab_size=int(worker.model_runner.model_config.vocab_size),
                shift_label=bool(draft.shift_label), candidate_pool_size=int(worker.domino_candidate_pool_size),
                prefix_gru=draft.prefix_gru, embed_proj=draft.embed_proj, tp_group=tp_group,
                target_embedding=module)
    if shard is not None and int(getattr(tp_group, "world_size", 1)) > 1:
        # the step's vocabulary shard, as upstream's eager step passes it
        args.update(lm_head_org_vocab_start=int(shard.org_vocab_start_index),
                    lm_head_num_org=int(shard.num_org_elements),
                    lm_head_num_org_padded=int(shard.num_org_elements_padded))
    calls: list[tuple[int, int]] = []
    tic = time.perf_counter()
    for block in sorted({int(b) for b in blocks if int(b) > 1}, reverse=True):
        for bs in (1, 2):
            hidden = torch.zeros((bs, block, hidden_size), dtype=draft.prefix_gru.weight_ih_l0.dtype, device=device)
            kwargs = dict(args, draft_hidden=hidden, bonus_tokens=torch.zeros(bs, dtype=torch.int64, device=device))
            if not cpu_rollout.eligible(kwargs, weight):
                raise ValueError("--enable-torch-compile with --device cpu cannot compile this Domino rollout: its "
                                 f"embedding ({type(module).__name__}) is neither a plain nor a vocabulary-parallel "
                                 "one; serve it without --enable-torch-compile")
            cpu_rollout.greedy_rollout(weight, **kwargs)
            calls.append((block, bs))
    if calls:
        logger.info("sglang-domino warm-up: the compiled Domino rollout at blocks %s in %.1f s",
                    sorted({b for b, _ in calls}, reverse=True), time.perf_counter() - tic)
    return calls


__all__ = ["warm_cpu_rollout", "warm_step_kernels"]
