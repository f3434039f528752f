"""The two ways a benchmark decodes one prompt: target alone, or speculative.

Both return the same fields, so every method is measured the same way.
"""

from __future__ import annotations

import time

import torch


@torch.inference_mode()
def target_only_decode(target, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), temperature: float = 0.0) -> dict:
    """Plain decoding: prefill, then one cached target forward per token."""
    from transformers import DynamicCache

    from sglang_domino.sampling import SamplingParams, sample, to_probs

    params = SamplingParams(temperature=temperature)
    pick = (lambda logits: logits.argmax(-1)) if params.greedy else (lambda logits: sample(to_probs(logits, params)))
    stops = set(stop_ids)
    t0 = time.perf_counter()
    out = target(input_ids=ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, pick(out.logits[:, -1])
    tokens = [int(tok)]
    t_decode = time.perf_counter()
    forward = 0.0
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        f0 = time.perf_counter()
        out = target(input_ids=tok[:, None], past_key_values=cache, use_cache=True)
        forward += time.perf_counter() - f0
        tok = pick(out.logits[:, -1])
        tokens.append(int(tok))
    end = time.perf_counter()
    return {"tokens": len(tokens), "seconds": end - t0, "decode_s": end - t_decode, "target_forward_s": forward,
            "verify_steps": 0, "accepted_tokens": 0, "accept_lengths": None}


def speculative_decode(draft, target, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                       verify_width: int | None = None) -> dict:
    limit = draft.config.num_predictions + 1
    width = None if verify_width is None else min(verify_width, limit)
    out, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=max_new_tokens, temperature=temperature,
                                     stop_token_ids=list(stop_ids), num_verify_tokens=width, return_stats=True)
    return {"tokens": stats.new_tokens, "seconds": stats.total_time, "decode_s": stats.total_time - stats.prefill_time,
            "target_forward_s": stats.verify_time, "verify_steps": stats.num_verify_steps,
            "accepted_tokens": sum(stats.accept_lengths), "accept_lengths": stats.accept_lengths}
